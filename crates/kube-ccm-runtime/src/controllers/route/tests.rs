use super::*;

fn node(name: &str, pod_cidrs: &[&str], provider_id: &str, ip: &str) -> Arc<CachedNode> {
    let node = json!({
        "metadata": {"name": name, "uid": format!("uid-{name}")},
        "spec": {"podCIDRs": pod_cidrs, "providerID": provider_id},
        "status": {"addresses": [{"type": "InternalIP", "address": ip}]},
    });
    Arc::new(serde_json::from_value(node).expect("a node"))
}

fn route(target: &str, cidr: &str) -> Route {
    Route {
        name: format!("{target}-{cidr}"),
        target_node: target.to_owned(),
        destination_cidr: cidr.to_owned(),
        ..Route::default()
    }
}

fn by_address(target: &str, cidr: &str, ip: &str) -> Route {
    Route {
        enable_node_addresses: true,
        target_node_addresses: vec![NodeAddress {
            type_: "InternalIP".to_owned(),
            address: ip.to_owned(),
        }],
        ..route(target, cidr)
    }
}

/// `(case, nodes, the cloud's routes, creates as node:cidr, stale as target:cidr, deletes first,
/// nodes whose condition is set as node:routed, outside as node:cidr)`.
type Case<'a> = (
    &'a str,
    Vec<Arc<CachedNode>>,
    Vec<Route>,
    &'a [&'a str],
    &'a [&'a str],
    bool,
    &'a [&'a str],
    &'a [&'a str],
);

#[test]
fn the_plan_keeps_creates_replaces_and_deletes() {
    let a = || node("a", &["10.244.1.0/24"], "fake://a", "10.0.0.1");
    let cases: Vec<Case<'_>> = vec![
        (
            "a node without its route gets one",
            vec![a()],
            vec![],
            &["a:10.244.1.0/24"],
            &[],
            false,
            &["a:true"],
            &[],
        ),
        (
            "an existing route is kept",
            vec![a()],
            vec![route("a", "10.244.1.0/24")],
            &[],
            &[],
            false,
            &["a:true"],
            &[],
        ),
        (
            "a route by address follows the node's addresses, deleted first",
            vec![a()],
            vec![by_address("a", "10.244.1.0/24", "10.0.0.9")],
            &["a:10.244.1.0/24"],
            &["a:10.244.1.0/24"],
            true,
            &["a:true"],
            &[],
        ),
        (
            "a route by the node's own address is kept",
            vec![a()],
            vec![by_address("a", "10.244.1.0/24", "10.0.0.1")],
            &[],
            &[],
            false,
            &["a:true"],
            &[],
        ),
        (
            "a blackhole is replaced",
            vec![a()],
            vec![Route {
                blackhole: true,
                ..route("a", "10.244.1.0/24")
            }],
            &["a:10.244.1.0/24"],
            &["a:10.244.1.0/24"],
            false,
            &["a:true"],
            &[],
        ),
        (
            "a gone node's route goes; a supernet route is not ours",
            vec![],
            vec![route("gone", "10.244.9.0/24"), route("vpc", "10.0.0.0/8")],
            &[],
            &["gone:10.244.9.0/24"],
            false,
            &[],
            &[],
        ),
        (
            "a route named by provider ID is its node's",
            vec![a()],
            vec![route("fake://a", "10.244.1.0/24")],
            &[],
            &[],
            false,
            &["a:true"],
            &[],
        ),
        (
            "a pod CIDR outside the cluster is warned about, not routed",
            vec![node("b", &["192.168.0.0/24"], "", "10.0.0.2")],
            vec![],
            &[],
            &[],
            false,
            &[],
            &["b:192.168.0.0/24"],
        ),
        (
            "a node with routes but no pod CIDRs has no network",
            vec![node("c", &[], "", "10.0.0.3")],
            vec![route("c", "10.244.3.0/24")],
            &[],
            &["c:10.244.3.0/24"],
            false,
            &["c:false"],
            &[],
        ),
    ];
    let cluster = vec!["10.244.0.0/16".parse::<Cidr>().expect("a CIDR")];
    for (case, nodes, existing, creates, stale, deletes_first, conditions, outside) in cases {
        let plan = plan(&nodes, existing, &cluster);
        let made: Vec<String> = plan
            .nodes
            .iter()
            .flat_map(|n| {
                n.create
                    .iter()
                    .map(|r| format!("{}:{}", r.target_node, r.destination_cidr))
            })
            .collect();
        assert_eq!(made, creates, "{case}: creates");
        let gone: Vec<String> = plan
            .stale
            .iter()
            .map(|r| format!("{}:{}", r.target_node, r.destination_cidr))
            .collect();
        assert_eq!(gone, stale, "{case}: deletes");
        assert_eq!(plan.deletes_first, deletes_first, "{case}: deletes first");
        let set: Vec<String> = plan
            .nodes
            .iter()
            .map(|n| format!("{}:{}", n.node.name(), n.routed))
            .collect();
        assert_eq!(set, conditions, "{case}: conditions");
        let warned: Vec<String> = plan
            .outside
            .iter()
            .map(|(n, cidr)| format!("{}:{cidr}", n.name()))
            .collect();
        assert_eq!(warned, outside, "{case}: outside");
    }
}

#[test]
fn durations_read_as_gos() {
    assert_eq!(go_duration(Duration::from_nanos(500)), "500ns");
    assert_eq!(go_duration(Duration::from_micros(1500)), "1.5ms");
    assert_eq!(go_duration(Duration::from_millis(2004)), "2.004s");
    assert_eq!(go_duration(Duration::from_secs(3)), "3s");
}
