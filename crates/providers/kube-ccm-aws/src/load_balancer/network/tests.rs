use super::*;

fn provider(cluster: &str) -> AwsProvider {
    let config = crate::CloudConfig::parse(&format!("[Global]\nKubernetesClusterID = {cluster}\n"))
        .unwrap()
        .config;
    let sdk = aws_config::SdkConfig::builder()
        .behavior_version(aws_config::BehaviorVersion::latest())
        .region(aws_config::Region::new("us-east-1"))
        .build();
    AwsProvider::new(config, &sdk)
}

fn service(namespace: &str, name: &str, local: bool) -> Service {
    serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "namespace": namespace},
            "spec": {
                "type": "LoadBalancer",
                "ports": [{"port": 80, "nodePort": 30080}, {"port": 53, "nodePort": 30053, "protocol": "UDP"}, {"port": 9, "protocol": "SCTP"}],
                "externalTrafficPolicy": if local { "Local" } else { "Cluster" },
                "healthCheckNodePort": 32000,
            },
        }))
        .unwrap()
}

#[test]
fn target_group_names_and_health_checks_are_upstreams() {
    // Known answers: SHA-1 of the concatenated fields, computed independently (Python's hashlib).
    let aws = provider("test");
    let plain = service("shop", "web", false);
    let mut ports = plain.clone();
    ports.spec.as_mut().unwrap().ports.as_mut().unwrap().pop();
    let mappings = aws.nlb_mappings(&ports).unwrap();
    assert_eq!(
        mappings[0].health,
        Health {
            protocol: ProtocolEnum::Tcp,
            port: "traffic-port".into(),
            path: None,
            interval: 30,
            timeout: 10,
            healthy: 3,
            unhealthy: 3
        }
    );
    assert_eq!(
        aws.target_group_name(&ports, &mappings[0]),
        "k8s-shop-web-bd644d32df"
    );
    let prod = provider("prod");
    let mut local = service("kube-system", "my_service.v2", true);
    local.spec.as_mut().unwrap().ports.as_mut().unwrap().pop();
    let mappings = prod.nlb_mappings(&local).unwrap();
    assert_eq!(mappings[1].health.port, "32000");
    assert_eq!(mappings[1].health.path.as_deref(), Some("/healthz"));
    assert_eq!(
        prod.target_group_name(&local, &mappings[1]),
        "k8s-kubesyst-myservic-06f3a16636"
    );
    assert_eq!(
        aws.nlb_mappings(&plain).unwrap_err().to_string(),
        "port 9: protocol SCTP: NLBs take TCP and UDP"
    );
}
