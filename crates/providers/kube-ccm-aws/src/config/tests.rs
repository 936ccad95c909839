use super::*;

#[test]
fn upstreams_keys_sections_and_comments_are_read() {
    let parsed = CloudConfig::parse(
            "; a comment\n[global]\nzone = us-west-2-lax-1a\nKubernetesClusterID = \"prod\" # inline\nnodeipfamilies=ipv6\nNodeIPFamilies = ipv4\nDisableSecurityGroupIngress\n\n[ServiceOverride \"1\"]\nService = ec2\nRegion = us-west-2\nURL = http://127.0.0.1:5000\nSigningRegion = us-west-2\n",
        )
        .unwrap();
    let config = parsed.config;
    assert!(parsed.warnings.is_empty(), "{:?}", parsed.warnings);
    assert_eq!(config.region(), "us-west-2");
    assert_eq!(config.cluster_id(), "prod");
    assert_eq!(config.node_ip_families, [IpFamily::V6, IpFamily::V4]);
    assert!(config.disable_security_group_ingress);
    assert_eq!(
        config.service_override("EC2", "us-west-2").unwrap().url,
        "http://127.0.0.1:5000"
    );
    assert!(config.service_override("elbv2", "us-west-2").is_none());
    assert_eq!(
        config.cluster_service_shared_load_balancer_health_probe_port,
        10256
    );
}

#[test]
fn service_overrides_are_found_by_either_sdks_names() {
    let mut text = String::new();
    for (number, service) in [
        "EC2",
        "Elastic Load Balancing",
        "Elastic Load Balancing v2",
        "Auto Scaling",
    ]
    .iter()
    .enumerate()
    {
        text.push_str(&format!(
                "[ServiceOverride \"{number}\"]\nService = {service}\nRegion = us-east-1\nURL = http://{number}\nSigningRegion = us-east-1\n"
            ));
    }
    let config = CloudConfig::parse(&text).unwrap().config;
    for (number, service) in ["ec2", "elb", "elbv2", "autoscaling"].iter().enumerate() {
        assert_eq!(
            config.service_override(service, "us-east-1").unwrap().url,
            format!("http://{number}"),
            "{service}"
        );
    }
}

#[test]
fn an_unknown_section_is_ignored_with_its_keys_and_a_nameless_override_refused() {
    // `[Global "x"]` is not `[Global]`: its keys change nothing.
    let parsed = CloudConfig::parse("[Global]\nZone = a\n[Global \"x\"]\nZone = b\n").unwrap();
    assert_eq!(parsed.config.zone, "a");
    assert_eq!(
        parsed.warnings,
        ["line 3: section [Global \"x\"] is unknown, ignored with its keys"]
    );
    // Keys under a nameless `[ServiceOverride]`, before or after a named one, never land in it.
    for text in [
        "[ServiceOverride]\nURL = https://x\n",
        "[ServiceOverride \"1\"]\nService = ec2\nRegion = r\nURL = https://a\nSigningRegion = r\n[ServiceOverride]\nURL = https://b\n",
    ] {
        assert!(CloudConfig::parse(text).is_err(), "{text}");
    }
}

#[test]
fn unknown_keys_are_warnings_and_bad_values_one_error_naming_line_and_key() {
    let parsed = CloudConfig::parse("[Global]\nRegoin = x\n[Extra]\nA = b\n").unwrap();
    assert_eq!(
        parsed.warnings,
        [
            "line 2: [Global] Regoin: unknown key, ignored",
            "line 3: section [Extra] is unknown, ignored with its keys"
        ]
    );
    assert_eq!(parsed.config.node_ip_families, [IpFamily::V4]);
    let cases = [
        (
            "[Global]\nNodeIPFamilies = ipv5\n",
            "cloud-config line 2: [Global] NodeIPFamilies: \"ipv5\" is not ipv4 or ipv6",
        ),
        (
            "[Global]\nDisableSecurityGroupIngress = maybe\n",
            "cloud-config line 2: [Global] DisableSecurityGroupIngress: \"maybe\" is not a boolean (true/false)",
        ),
        (
            "[Global]\nClusterServiceSharedLoadBalancerHealthProbePort = 0\n",
            "cloud-config line 2: [Global] ClusterServiceSharedLoadBalancerHealthProbePort: \"0\" is not a port (1-65535)",
        ),
        (
            "Region = x\n",
            "cloud-config line 1: \"Region = x\" is outside any section",
        ),
        (
            "[Global\n",
            "cloud-config line 1: section header \"[Global\" has no closing ]",
        ),
        (
            "[Global]\nKubernetesClusterTag = a\nKubernetesClusterID = b\n",
            "cloud-config: [Global] KubernetesClusterTag \"a\" and KubernetesClusterID \"b\" differ; set one, or both equal",
        ),
        (
            "[ServiceOverride \"1\"]\nService = ec2\nRegion = r\nURL = x\nSigningRegion = r\n",
            "cloud-config line 1: [ServiceOverride \"1\"] URL \"x\" is not an http(s) URL",
        ),
        (
            "[ServiceOverride \"1\"]\nService = ec2\n",
            "cloud-config line 1: [ServiceOverride \"1\"] Region is required",
        ),
        (
            "[ServiceOverride]\nURL = https://x\n",
            "cloud-config line 1: [ServiceOverride] needs a name, e.g. [ServiceOverride \"1\"]",
        ),
        (
            "[Global]\nVPC = \"vpc-1\n",
            "cloud-config line 2: value \"vpc-1 has no closing quote",
        ),
        (
            "[Global]\nSupportedTopologyInstanceTypePattern = ^(p[0-9\n",
            "cloud-config line 2: [Global] SupportedTopologyInstanceTypePattern: not a regular expression: unclosed character class",
        ),
    ];
    for (text, expected) in cases {
        assert_eq!(
            CloudConfig::parse(text).unwrap_err().to_string(),
            expected,
            "{text}"
        );
    }
}

#[test]
fn a_service_override_needs_its_fields_an_http_url_and_no_twin() {
    let override_of = |service: &str, region: &str, url: &str, signing_region: &str| ServiceOverride {
        service: service.to_owned(),
        region: region.to_owned(),
        url: url.to_owned(),
        signing_region: signing_region.to_owned(),
        ..ServiceOverride::default()
    };
    let existing = override_of("elb", "us-east-1", "https://elb.example", "us-east-1");
    // (case, the override named "2" at line 3, the error if any)
    let cases = [
        (
            "complete",
            override_of("ec2", "us-east-1", "https://ec2.example", "us-east-1"),
            None,
        ),
        (
            "the same service in another region",
            override_of("elb", "us-west-2", "http://elb.example", "us-west-2"),
            None,
        ),
        (
            "no service",
            override_of(" ", "us-east-1", "https://x", "us-east-1"),
            Some("cloud-config line 3: [ServiceOverride \"2\"] Service is required"),
        ),
        (
            "no signing region",
            override_of("ec2", "us-east-1", "https://x", ""),
            Some("cloud-config line 3: [ServiceOverride \"2\"] SigningRegion is required"),
        ),
        (
            "not an http(s) URL",
            override_of("ec2", "us-east-1", "ftp://x", "us-east-1"),
            Some("cloud-config line 3: [ServiceOverride \"2\"] URL \"ftp://x\" is not an http(s) URL"),
        ),
        (
            "the same service and region, by the service's other name",
            override_of("Elastic Load Balancing", "us-east-1", "https://x", "us-east-1"),
            Some(
                "cloud-config line 3: [ServiceOverride \"2\"] a second override for Elastic Load Balancing in us-east-1",
            ),
        ),
    ];
    for (case, entry, expected) in cases {
        let mut config = CloudConfig {
            service_overrides: vec![existing.clone()],
            ..CloudConfig::default()
        };
        let got = config
            .add_service_override(3, "2", entry)
            .err()
            .map(|e| e.to_string());
        assert_eq!(got.as_deref(), expected, "{case}");
        let added = if expected.is_none() { 2 } else { 1 };
        assert_eq!(config.service_overrides.len(), added, "{case}: added");
    }
}

#[test]
fn zones_map_to_regions() {
    for (zone, region) in [
        ("us-east-1a", "us-east-1"),
        ("us-gov-west-1b", "us-gov-west-1"),
        ("cn-north-1a", "cn-north-1"),
        ("us-west-2-lax-1a", "us-west-2"),
    ] {
        assert_eq!(region_of_zone(zone).as_deref(), Some(region), "{zone}");
    }
    assert_eq!(region_of_zone("nozone"), None);
}
