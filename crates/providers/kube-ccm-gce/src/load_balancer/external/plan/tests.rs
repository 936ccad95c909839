use google_cloud_compute_v1::model;

use super::*;

fn service(spec: serde_json::Value, annotations: serde_json::Value) -> Service {
    serde_json::from_value(serde_json::json!({
            "metadata": {"name": "web", "namespace": "shop", "uid": "0a1b2c3d-4e5f-6071-8293-a4b5c6d7e8f9", "annotations": annotations},
            "spec": spec,
        }))
        .unwrap()
}

#[test]
fn plans_as_upstream() {
    let s = service(
        serde_json::json!({"type": "LoadBalancer", "ports": [{"port": 443}, {"port": 80}, {"port": 444}], "sessionAffinity": "ClientIP"}),
        serde_json::json!({}),
    );
    let p = plan(&s, "c1d2").unwrap();
    assert_eq!(p.name, "a0a1b2c3d4e5f60718293a4b5c6d7e8f");
    assert_eq!(p.description, r#"{"kubernetes.io/service-name":"shop/web"}"#);
    assert_eq!((p.protocol.as_str(), p.port_range.as_str()), ("TCP", "80-444"));
    assert_eq!(p.ports, ["80", "443-444"]);
    assert_eq!(p.source_ranges, ["0.0.0.0/0"]);
    assert_eq!(
        (p.network_tier.as_str(), p.session_affinity.as_str()),
        ("PREMIUM", "CLIENT_IP")
    );
    assert_eq!(p.health_check, ("k8s-c1d2-node".to_owned(), 10256));
    assert!(!p.local);

    let local = service(
        serde_json::json!({"type": "LoadBalancer", "ports": [{"port": 53, "protocol": "UDP"}], "externalTrafficPolicy": "Local", "healthCheckNodePort": 31000, "loadBalancerSourceRanges": ["10.0.0.0/8"]}),
        serde_json::json!({"cloud.google.com/network-tier": "Standard"}),
    );
    let p = plan(&local, "c1d2").unwrap();
    assert_eq!(
        p.health_check,
        ("a0a1b2c3d4e5f60718293a4b5c6d7e8f".to_owned(), 31000)
    );
    assert!(p.local);
    assert_eq!(
        (
            p.protocol.as_str(),
            p.port_range.as_str(),
            p.network_tier.as_str()
        ),
        ("UDP", "53-53", "STANDARD")
    );
    assert_eq!(p.source_ranges, ["10.0.0.0/8"]);
}

#[test]
fn bad_services_are_one_clear_error() {
    let cases = [
        (
            serde_json::json!({"ports": []}),
            serde_json::json!({}),
            "no ports specified",
        ),
        (
            serde_json::json!({"ports": [{"port": 80}, {"port": 53, "protocol": "UDP"}]}),
            serde_json::json!({}),
            "mixed protocol is not supported",
        ),
        (
            serde_json::json!({"ports": [{"port": 80, "protocol": "SCTP"}]}),
            serde_json::json!({}),
            "invalid protocol SCTP",
        ),
        (
            serde_json::json!({"ports": [{"port": 80}], "loadBalancerSourceRanges": ["10.0.0.0"]}),
            serde_json::json!({}),
            "is not valid",
        ),
        (
            serde_json::json!({"ports": [{"port": 80}]}),
            serde_json::json!({"cloud.google.com/network-tier": "Gold"}),
            "unsupported network tier",
        ),
    ];
    for (spec, annotations, needle) in cases {
        let error = plan(&service(spec.clone(), annotations), "c")
            .unwrap_err()
            .to_string();
        assert!(error.contains(needle), "{spec}: {error}");
    }
}

#[test]
fn ports_condense_into_ranges() {
    assert_eq!(
        condensed_ports(&BTreeSet::from([1, 2, 3, 5, 7, 8])),
        ["1-3", "5", "7-8"]
    );
    // The top of the range does not overflow.
    assert_eq!(
        condensed_ports(&BTreeSet::from([i32::MAX - 1, i32::MAX])),
        [format!("{}-{}", i32::MAX - 1, i32::MAX)]
    );
}

/// The load balancer's name for the services here.
const LB: &str = "a0a1b2c3d4e5f60718293a4b5c6d7e8f";
/// The forwarding rule's IP in the cases.
const IP: &str = "34.1.1.1";

/// TCP port 80, the shared health check (cluster ID `c1d2`), no requested IP.
fn shared() -> Plan {
    let spec = serde_json::json!({"type": "LoadBalancer", "ports": [{"port": 80}]});
    plan(&service(spec, serde_json::json!({})), "c1d2").unwrap()
}

/// As [`shared`], with the service's own health check (`externalTrafficPolicy: Local`).
fn local() -> Plan {
    Plan {
        health_check: (LB.to_owned(), 31000),
        local: true,
        ..shared()
    }
}

/// As [`shared`], with `loadBalancerIP: ip`.
fn requested(ip: &str) -> Plan {
    Plan {
        requested_ip: Some(ip.to_owned()),
        ..shared()
    }
}

/// A health check's link in `project`, as Compute returns it.
fn check(project: &str, name: &str) -> String {
    format!("https://www.googleapis.com/compute/v1/projects/{project}/global/httpHealthChecks/{name}")
}

/// A forwarding rule as Compute returns it.
fn rule(ip: Option<&str>, ports: &str, protocol: &str) -> Option<ForwardingRule> {
    let mut rule = ForwardingRule::default();
    rule.ip_address = ip.map(str::to_owned);
    rule.port_range = Some(ports.to_owned());
    rule.ip_protocol = Some(model::forwarding_rule::IPProtocol::from(protocol));
    Some(rule)
}

/// The rule [`shared`] wants, holding [`IP`].
fn good_rule() -> Option<ForwardingRule> {
    rule(Some(IP), "80-80", "TCP")
}

/// A target pool as Compute returns it.
fn pool(affinity: Option<&str>, checks: &[&str]) -> Option<TargetPool> {
    let mut pool = TargetPool::default();
    pool.session_affinity = affinity.map(model::target_pool::SessionAffinity::from);
    pool.health_checks = checks.iter().map(|c| (*c).to_owned()).collect();
    Some(pool)
}

/// The pool [`shared`] wants.
fn good_pool() -> Option<TargetPool> {
    pool(Some("NONE"), &[check("p", "k8s-c1d2-node").as_str()])
}

/// The actions as steps, in the order the ensure applies them; the load balancer's name is `<lb>`.
fn steps(actions: &Actions) -> Vec<String> {
    let mut steps = vec![match &actions.address {
        AddressAction::Use(ip) => format!("use {ip}"),
        AddressAction::CheckReserved(ip) => format!("check {ip} is reserved"),
        AddressAction::Reserve(ip) => format!("reserve {}", ip.as_deref().unwrap_or("any")),
    }];
    if actions.delete_rule {
        steps.push("delete rule".to_owned());
    }
    if actions.delete_pool {
        steps.push("delete pool".to_owned());
    }
    for (check, firewall) in &actions.delete_health_checks {
        steps.push(format!("delete health check {check} and {firewall}").replace(LB, "<lb>"));
    }
    if actions.make_pool {
        steps.push("make pool".to_owned());
    }
    if actions.make_rule {
        steps.push("make rule".to_owned());
    }
    if actions.release_address {
        steps.push("release address".to_owned());
    }
    steps
}

/// `(case, plan, the cloud's rule, the cloud's pool, the steps)`.
type Case<'a> = (
    &'a str,
    Plan,
    Option<ForwardingRule>,
    Option<TargetPool>,
    &'a [&'a str],
);

#[test]
fn actions_change_only_what_differs() {
    let (own_check, other_project) = (check("p", LB), check("q", "k8s-c1d2-node"));
    let (shared_check, other_check) = (check("p", "k8s-c1d2-node"), check("p", "other"));
    let remade = [
        "reserve 34.1.1.1",
        "delete rule",
        "delete pool",
        "make pool",
        "make rule",
        "release address",
    ];
    let cases: Vec<Case<'_>> = vec![
        (
            "nothing exists: an address is reserved, pool and rule made, then released",
            shared(),
            None,
            None,
            &["reserve any", "make pool", "make rule", "release address"],
        ),
        (
            "everything matches: the rule keeps its IP, nothing changes",
            shared(),
            good_rule(),
            good_pool(),
            &["use 34.1.1.1"],
        ),
        (
            "an unset session affinity and a health check as a path match",
            shared(),
            good_rule(),
            pool(None, &["projects/p/global/httpHealthChecks/k8s-c1d2-node"]),
            &["use 34.1.1.1"],
        ),
        (
            "other ports: the rule is made again, its IP held meanwhile",
            shared(),
            rule(Some(IP), "80-81", "TCP"),
            good_pool(),
            &["reserve 34.1.1.1", "delete rule", "make rule", "release address"],
        ),
        (
            "another protocol: the rule is made again, its IP held meanwhile",
            shared(),
            rule(Some(IP), "80-80", "UDP"),
            good_pool(),
            &["reserve 34.1.1.1", "delete rule", "make rule", "release address"],
        ),
        (
            "another session affinity: the pool is made again, and so the rule",
            shared(),
            good_rule(),
            pool(Some("CLIENT_IP"), &[shared_check.as_str()]),
            &remade,
        ),
        (
            "a health check of another project: the pool is made again, the check kept",
            shared(),
            good_rule(),
            pool(Some("NONE"), &[other_project.as_str()]),
            &remade,
        ),
        (
            "now Local: the pool is made again, the shared check goes with its firewall",
            local(),
            good_rule(),
            good_pool(),
            &[
                "reserve 34.1.1.1",
                "delete rule",
                "delete pool",
                "delete health check k8s-c1d2-node and k8s-c1d2-node-http-hc",
                "make pool",
                "make rule",
                "release address",
            ],
        ),
        (
            "Cluster again: the pool is made again, the service's own check goes",
            shared(),
            good_rule(),
            pool(Some("NONE"), &[own_check.as_str()]),
            &[
                "reserve 34.1.1.1",
                "delete rule",
                "delete pool",
                "delete health check <lb> and k8s-<lb>-http-hc",
                "make pool",
                "make rule",
                "release address",
            ],
        ),
        (
            "a second health check: the pool is made again, only that check goes",
            shared(),
            good_rule(),
            pool(Some("NONE"), &[shared_check.as_str(), other_check.as_str()]),
            &[
                "reserve 34.1.1.1",
                "delete rule",
                "delete pool",
                "delete health check other and other-http-hc",
                "make pool",
                "make rule",
                "release address",
            ],
        ),
        (
            "the rule is gone: made again to the pool, which stays",
            shared(),
            None,
            good_pool(),
            &["reserve any", "make rule", "release address"],
        ),
        (
            "the pool is gone: made again, the rule stays with its IP",
            shared(),
            good_rule(),
            None,
            &["use 34.1.1.1", "make pool"],
        ),
        (
            "a rule without an IP stays: the address is released only if reserved now",
            shared(),
            rule(None, "80-80", "TCP"),
            good_pool(),
            &["reserve any"],
        ),
        (
            "the requested IP is the rule's: used as it is",
            requested(IP),
            good_rule(),
            good_pool(),
            &["use 34.1.1.1"],
        ),
        (
            "the requested IP is the rule's, other ports: the rule is made again",
            requested(IP),
            rule(Some(IP), "443-443", "TCP"),
            good_pool(),
            &["use 34.1.1.1", "delete rule", "make rule"],
        ),
        (
            "another requested IP: it must be reserved; the rule is made again",
            requested("34.2.2.2"),
            good_rule(),
            good_pool(),
            &["check 34.2.2.2 is reserved", "delete rule", "make rule"],
        ),
        (
            "a requested IP, nothing exists: it must be reserved; pool and rule made",
            requested("34.2.2.2"),
            None,
            None,
            &["check 34.2.2.2 is reserved", "make pool", "make rule"],
        ),
    ];
    for (case, plan, rule, pool, expected) in cases {
        let actions = actions(&plan, rule.as_ref(), pool.as_ref(), "p");
        assert_eq!(steps(&actions), expected, "{case}");
    }
}

/// `(case, the pool's instances, the wanted instances, added, removed)`.
type InstanceCase<'a> = (
    &'a str,
    &'a [&'a str],
    &'a [&'a str],
    &'a [&'a str],
    &'a [&'a str],
);

#[test]
fn pools_gain_and_lose_only_the_instances_that_differ() {
    let link = "https://www.googleapis.com/compute/v1/projects/p/zones/z/instances/a";
    let cases: [InstanceCase<'_>; 5] = [
        (
            "an empty pool gains every instance",
            &[],
            &["a", "b"],
            &["a", "b"],
            &[],
        ),
        (
            "the same instances in another order: nothing changes",
            &["a", "b"],
            &["b", "a"],
            &[],
            &[],
        ),
        (
            "a link and a path are the same instance",
            &[link],
            &["projects/p/zones/z/instances/a"],
            &[],
            &[],
        ),
        (
            "drift both ways: one added, one removed",
            &["a", "b"],
            &["b", "c"],
            &["c"],
            &["a"],
        ),
        (
            "an instance named twice is added once, in order",
            &[],
            &["c", "a", "c"],
            &["a", "c"],
            &[],
        ),
    ];
    for (case, have, want, added, removed) in cases {
        let have: Vec<String> = have.iter().map(|i| (*i).to_owned()).collect();
        let want: Vec<String> = want.iter().map(|i| (*i).to_owned()).collect();
        let (add, remove) = instance_changes(&have, &want);
        assert_eq!(add, added, "{case}: added");
        assert_eq!(remove, removed, "{case}: removed");
    }
}

#[test]
fn firewalls_are_named_and_described_as_upstream() {
    let desc = r#"{"kubernetes.io/service-name":"shop/web", "kubernetes.io/service-ip":"34.1.1.1"}"#;
    let cases = [
        (
            "the shared health check's firewall is the cluster's",
            shared(),
            "k8s-c1d2-node-http-hc".to_owned(),
            r#"{"kubernetes.io/cluster-id":"c1d2"}"#,
        ),
        (
            "the service's own health check's firewall is the service's",
            local(),
            format!("k8s-{LB}-http-hc"),
            desc,
        ),
    ];
    for (case, plan, hc_firewall, hc_description) in cases {
        assert_eq!(plan.client_firewall(), format!("k8s-fw-{LB}"), "{case}");
        assert_eq!(plan.firewall_description(IP), desc, "{case}");
        assert_eq!(plan.health_check_firewall("c1d2"), hc_firewall, "{case}");
        assert_eq!(
            plan.health_check_firewall_description("c1d2", IP),
            hc_description,
            "{case}"
        );
    }
}
