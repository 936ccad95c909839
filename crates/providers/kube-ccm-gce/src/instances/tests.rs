use super::*;

#[test]
fn provider_ids_as_upstream() {
    assert_eq!(
        parse_provider_id("gce://my-project/us-central1-a/node-1"),
        Some(("my-project", "us-central1-a", "node-1"))
    );
    for bad in [
        "gce://p/z",
        "gce://p/z/n/x",
        "gce:///z/n",
        "aws:///us-east-1a/i-1",
        "node-1",
        // Names Compute could not have: refused, never looked up (a look-up would find nothing).
        "gce://p/z/Node_1",
        "gce://p/bad_zone!/n",
        "gce://p/z/node-",
    ] {
        assert_eq!(parse_provider_id(bad), None, "{bad}");
    }
}

proptest::proptest! {
    /// Every provider ID either names a project, zone and instance, each non-empty and without a slash,
    /// or is refused: it never reaches a look-up that could answer "not found" for a misread name.
    #[test]
    fn every_provider_id_names_an_instance_or_is_refused(
        id in proptest::prop_oneof![
            proptest::string::string_regex(".{0,40}").unwrap(),
            proptest::string::string_regex("(gce://)?/{0,2}[a-z0-9-]{0,8}/{0,2}[a-z0-9-]{0,8}/{0,2}[a-z0-9.-]{0,8}/{0,2}").unwrap(),
            proptest::string::string_regex("(aws|fake|azure)://[a-z0-9/-]{0,20}").unwrap(),
        ]
    ) {
        match parse_provider_id(&id) {
            Some((project, zone, name)) => {
                for part in [project, zone, name] {
                    proptest::prop_assert!(!part.is_empty() && !part.contains('/'));
                }
                proptest::prop_assert!(is_compute_name(zone) && is_compute_name(name));
                proptest::prop_assert_eq!(format!("gce://{project}/{zone}/{name}"), id);
            }
            None => {
                let parts: Option<Vec<&str>> = id.strip_prefix("gce://").map(|rest| rest.split('/').collect());
                proptest::prop_assert!(
                    parts.is_none_or(|parts| parts.len() != 3
                        || parts[0].is_empty()
                        || !is_compute_name(parts[1])
                        || !is_compute_name(parts[2])),
                    "{id:?} has the form but was refused"
                );
            }
        }
    }
}

#[test]
fn compute_names() {
    assert!(is_compute_name("node-1"));
    for bad in ["Node-1", "1node", "node_1", "", "node.example", "node-"] {
        assert!(!is_compute_name(bad), "{bad}");
    }
}

/// Project p's list: `one` in zone-a, `two` in zone-a and zone-b, and zone-c did not answer; project
/// q's list was partial.
fn listed() -> Listed {
    let instance = |name: &str, zone: &str| -> Instance {
        serde_json::from_value(serde_json::json!({
            "name": name,
            "zone": format!("https://www.googleapis.com/compute/v1/projects/p/zones/{zone}"),
        }))
        .unwrap()
    };
    let key = |project: &str, name: &str| (project.to_owned(), name.to_owned());
    Listed {
        found: HashMap::from([
            (key("p", "one"), vec![instance("one", "zone-a")]),
            (
                key("p", "two"),
                vec![instance("two", "zone-a"), instance("two", "zone-b")],
            ),
        ]),
        unreachable: HashMap::from([("p".to_owned(), BTreeSet::from(["zone-c".to_owned()]))]),
        partial: BTreeSet::from(["q".to_owned()]),
    }
}

/// A look-up's answer, as the table below writes it.
fn said(lookup: Lookup) -> String {
    match lookup {
        Lookup::Found(instance) => format!(
            "found in {}",
            last_component(instance.zone.as_deref().unwrap_or_default())
        ),
        Lookup::Absent => "absent".to_owned(),
        Lookup::Invalid(why) => format!("invalid: {why}"),
        Lookup::Unknown(why) => format!("unknown: {why}"),
    }
}

#[test]
fn each_reference_is_found_absent_or_unknown_by_what_the_lists_showed() {
    let listed = listed();
    let managed = |zone: &str| ["zone-a", "zone-b", "zone-c"].contains(&zone);
    // (case, project, the provider ID's zone, name, what Compute says)
    let cases = [
        (
            "a name Compute could not have",
            "p",
            None,
            "Node_1",
            "invalid: \"Node_1\" is not a Compute instance name, so no instance can be looked up for it",
        ),
        (
            "in the provider ID's zone",
            "p",
            Some("zone-a"),
            "one",
            "found in zone-a",
        ),
        ("by name, in a managed zone", "p", None, "one", "found in zone-a"),
        (
            "not in the provider ID's zone",
            "p",
            Some("zone-b"),
            "one",
            "absent",
        ),
        (
            "by name, in two managed zones",
            "p",
            None,
            "two",
            "unknown: instance two is in zones zone-a and zone-b: give the node a provider ID",
        ),
        (
            "one of two, by provider ID",
            "p",
            Some("zone-b"),
            "two",
            "found in zone-b",
        ),
        (
            "not listed, and a zone it could be in did not answer",
            "p",
            None,
            "three",
            "unknown: zone zone-c did not answer, and instance three could be there",
        ),
        (
            "not listed, and only a zone it could not be in did not answer",
            "p",
            Some("zone-a"),
            "three",
            "absent",
        ),
        (
            "not listed, in a project listed only in part",
            "q",
            Some("zone-a"),
            "one",
            "unknown: Compute listed the instances of project q only in part",
        ),
    ];
    for (case, project, zone, name, expected) in cases {
        let wanted = InstanceRef {
            project: project.to_owned(),
            zone: zone.map(str::to_owned),
            name: name.to_owned(),
        };
        assert_eq!(said(lookup(&wanted, &listed, managed)), expected, "{case}");
    }
}

#[test]
fn the_ipv6_address_is_the_internal_one_else_the_last_external_one() {
    let nic = |value: serde_json::Value| -> NetworkInterface { serde_json::from_value(value).unwrap() };
    let both = nic(
        serde_json::json!({"ipv6Address": "fd20::3", "ipv6AccessType": "EXTERNAL",
            "ipv6AccessConfigs": [{"externalIpv6": "2600::3"}]}),
    );
    assert_eq!(ipv6_address(&both), Some("fd20::3"));
    let external = nic(serde_json::json!({"ipv6AccessType": "EXTERNAL",
            "ipv6AccessConfigs": [{"externalIpv6": "2600::3"}, {"externalIpv6": "2600::4"}]}));
    assert_eq!(ipv6_address(&external), Some("2600::4"));
    let internal_type = nic(serde_json::json!({"ipv6AccessType": "INTERNAL",
            "ipv6AccessConfigs": [{"externalIpv6": "2600::3"}]}));
    assert_eq!(ipv6_address(&internal_type), None);
}

#[test]
fn addresses_in_upstreams_order() {
    let instance: Instance = serde_json::from_value(serde_json::json!({
        "networkInterfaces": [
            {"networkIP": "10.0.0.2", "accessConfigs": [{"natIP": "34.1.1.1"}], "ipv6Address": "fd20::2"},
            {"networkIP": "10.1.0.2", "ipv6AccessType": "EXTERNAL",
             "ipv6AccessConfigs": [{"externalIpv6": "2600::1"}, {"externalIpv6": "2600::2"}]}
        ]
    }))
    .unwrap();
    let pairs = |stack| {
        addresses(&instance, stack)
            .into_iter()
            .map(|a| format!("{}={}", a.type_, a.address))
            .collect::<Vec<_>>()
    };
    assert_eq!(
        pairs(StackType::Ipv4),
        [
            "InternalIP=10.0.0.2",
            "ExternalIP=34.1.1.1",
            "InternalIP=10.1.0.2",
            "InternalIP=fd20::2",
            "InternalIP=2600::2"
        ]
    );
    assert_eq!(
        pairs(StackType::Ipv6),
        [
            "InternalIP=fd20::2",
            "InternalIP=2600::2",
            "InternalIP=10.0.0.2",
            "ExternalIP=34.1.1.1",
            "InternalIP=10.1.0.2"
        ]
    );
}
