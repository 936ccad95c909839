use super::super::super::PREFIX;
use super::*;

fn service(spec: serde_json::Value, annotations: serde_json::Value) -> Service {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": "web", "namespace": "shop", "annotations": annotations},
        "spec": spec,
    }))
    .unwrap()
}

fn ports() -> serde_json::Value {
    serde_json::json!({"ports": [
        {"name": "http", "port": 80, "nodePort": 30080},
        {"name": "https", "port": 443, "nodePort": 30443},
        {"name": "dns", "port": 53, "nodePort": 30053, "protocol": "UDP"},
    ]})
}

fn key(k: &str) -> String {
    format!("{PREFIX}{k}")
}

/// A mapping as (port, protocol, traffic protocol, certificate, policy).
type Listener<'a> = (i32, &'a str, &'a str, Option<&'a str>, Option<&'a str>);

#[test]
fn tls_listeners_follow_upstreams_mapping() {
    let check = |annotations: serde_json::Value, expected: &[Listener<'_>]| {
        let wanted = wanted(&service(ports(), annotations.clone()), None, false).unwrap();
        let got: Vec<_> = wanted
            .mappings
            .iter()
            .map(|m| {
                (
                    m.port,
                    m.protocol.as_str(),
                    m.traffic_protocol.as_str(),
                    m.certificate.as_deref(),
                    m.ssl_policy.as_deref(),
                )
            })
            .collect();
        assert_eq!(got, expected, "{annotations}");
    };
    check(
        serde_json::json!({}),
        &[
            (80, "TCP", "TCP", None, None),
            (443, "TCP", "TCP", None, None),
            (53, "UDP", "UDP", None, None),
        ],
    );
    // Every TCP port by default, never UDP.
    check(
        serde_json::json!({key("ssl-cert"): "arn:c"}),
        &[
            (80, "TLS", "TCP", Some("arn:c"), None),
            (443, "TLS", "TCP", Some("arn:c"), None),
            (53, "UDP", "UDP", None, None),
        ],
    );
    check(
        serde_json::json!({key("ssl-cert"): "arn:c", key("ssl-ports"): "https", key("backend-protocol"): "ssl", key("ssl-negotiation-policy"): "ELBSecurityPolicy-TLS13-1-2-2021-06"}),
        &[
            (80, "TCP", "TCP", None, None),
            (
                443,
                "TLS",
                "TLS",
                Some("arn:c"),
                Some("ELBSecurityPolicy-TLS13-1-2-2021-06"),
            ),
            (53, "UDP", "UDP", None, None),
        ],
    );
}

#[test]
fn health_checks_are_upstreams_with_their_annotations() {
    let check = |spec: serde_json::Value,
                 annotations: serde_json::Value,
                 shared: Option<&SharedProbe>,
                 expected: (&str, &str, Option<&str>, [i32; 4])| {
        let health = wanted(&service(spec, annotations.clone()), shared, false)
            .unwrap()
            .mappings[0]
            .health
            .clone();
        assert_eq!(
            (
                health.protocol.as_str(),
                health.port.as_str(),
                health.path.as_deref(),
                [health.interval, health.timeout, health.healthy, health.unhealthy]
            ),
            expected,
            "{annotations}"
        );
    };
    let mut local = ports();
    local["type"] = "LoadBalancer".into();
    local["externalTrafficPolicy"] = "Local".into();
    local["healthCheckNodePort"] = 32000.into();
    check(
        ports(),
        serde_json::json!({}),
        None,
        ("TCP", "traffic-port", None, [30, 10, 3, 3]),
    );
    check(
        local.clone(),
        serde_json::json!({}),
        None,
        ("HTTP", "32000", Some("/healthz"), [10, 10, 2, 2]),
    );
    check(
        ports(),
        serde_json::json!({key("healthcheck-protocol"): "http", key("healthcheck-port"): "8080", key("healthcheck-interval"): "15", key("healthcheck-unhealthy-threshold"): "5"}),
        None,
        ("HTTP", "8080", Some("/"), [15, 10, 3, 5]),
    );
    check(
        ports(),
        serde_json::json!({key("healthcheck-protocol"): "HTTPS", key("healthcheck-path"): "/ready"}),
        None,
        ("HTTPS", "traffic-port", Some("/ready"), [30, 10, 3, 3]),
    );
    let shared = SharedProbe {
        port: 10256,
        path: "/healthz".into(),
    };
    check(
        ports(),
        serde_json::json!({}),
        Some(&shared),
        ("HTTP", "10256", Some("/healthz"), [30, 10, 3, 3]),
    );
    check(
        local,
        serde_json::json!({}),
        Some(&shared),
        ("HTTP", "32000", Some("/healthz"), [10, 10, 2, 2]),
    );
    for (annotations, message) in [
        (
            serde_json::json!({key("healthcheck-protocol"): "udp"}),
            "Unsupported health check protocol UDP".to_owned(),
        ),
        (
            serde_json::json!({key("healthcheck-port"): "web"}),
            "Invalid health check port 'web'".to_owned(),
        ),
        (
            serde_json::json!({key("healthcheck-timeout"): "soon"}),
            format!("error parsing service annotation: {PREFIX}healthcheck-timeout=soon"),
        ),
    ] {
        assert_eq!(
            wanted(&service(ports(), annotations), None, false)
                .unwrap_err()
                .to_string(),
            message
        );
    }
}

#[test]
fn only_target_group_attributes_the_group_has_and_that_differ_are_set() {
    let have: BTreeMap<&str, &str> = [
        ("proxy_protocol_v2.enabled", "false"),
        ("preserve_client_ip.enabled", "true"),
    ]
    .into();
    let wanted: BTreeMap<String, String> = [
        ("proxy_protocol_v2.enabled", "true"),
        ("preserve_client_ip.enabled", "true"),
        ("something.else", "1"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v.to_owned()))
    .collect();
    assert_eq!(
        target_group_attribute_changes(&have, &wanted),
        [("proxy_protocol_v2.enabled".to_owned(), "true".to_owned())]
    );
    assert!(target_group_attribute_changes(&BTreeMap::new(), &wanted).is_empty());
}

#[test]
fn attributes_addresses_tags_and_labels_come_from_annotations() {
    let wanted = wanted(
        &service(
            ports(),
            serde_json::json!({
                key("cross-zone-load-balancing-enabled"): "true",
                key("access-log-enabled"): "true",
                key("access-log-s3-bucket-name"): "logs",
                key("access-log-s3-bucket-prefix"): "nlb",
                key("target-group-attributes"): "proxy_protocol_v2.enabled=true,preserve_client_ip.enabled=true",
                key("eip-allocations"): "eipalloc-1,eipalloc-2",
                key("private-ipv4-addresses"): "10.0.0.5,10.0.1.5",
                key("additional-resource-tags"): "team=web",
                key("target-node-labels"): "pool=edge",
            }),
        ),
        None,
        false,
    )
    .unwrap();
    assert_eq!(
        wanted.attributes.pairs(),
        [
            ("load_balancing.cross_zone.enabled", "true".to_owned()),
            ("access_logs.s3.enabled", "true".to_owned()),
            ("access_logs.s3.bucket", "logs".to_owned()),
            ("access_logs.s3.prefix", "nlb".to_owned()),
        ]
    );
    assert_eq!(wanted.target_group_attributes.len(), 2);
    assert_eq!(
        wanted.eip_allocations.as_deref(),
        Some(&["eipalloc-1".to_owned(), "eipalloc-2".to_owned()][..])
    );
    assert_eq!(wanted.private_ipv4_addresses.as_ref().map(Vec::len), Some(2));
    assert_eq!(wanted.tags["team"], "web");
    assert_eq!(wanted.target_node_labels["pool"], "edge");
    let defaults = super::wanted(&service(ports(), serde_json::json!({})), None, false).unwrap();
    assert_eq!(
        defaults.attributes.pairs(),
        [
            ("load_balancing.cross_zone.enabled", "false".to_owned()),
            ("access_logs.s3.enabled", "false".to_owned()),
        ]
    );
    for (annotations, message) in [
        (
            serde_json::json!({key("target-group-attributes"): "deregistration_delay.timeout_seconds=5"}),
            "error validating target group attributes: the attribute \"deregistration_delay.timeout_seconds\" is not supported by the controller or is invalid",
        ),
        (
            serde_json::json!({key("target-group-attributes"): "preserve_client_ip.enabled=false"}),
            "error validating target group attributes: client IP preservation can't be disabled for UDP ports",
        ),
        (
            serde_json::json!({key("target-group-attributes"): "proxy_protocol_v2.enabled=yes"}),
            "error validating target group attributes: invalid attribute value for \"proxy_protocol_v2.enabled\": yes",
        ),
    ] {
        assert_eq!(
            super::wanted(&service(ports(), annotations), None, false)
                .unwrap_err()
                .to_string(),
            message
        );
    }
}
