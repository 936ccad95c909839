use aws_sdk_elasticloadbalancingv2::types::{Action, ActionTypeEnum, Certificate};

use super::*;

fn strings(list: &[&str]) -> Vec<String> {
    list.iter().copied().map(str::to_owned).collect()
}

fn set(list: &[&str]) -> BTreeSet<String> {
    list.iter().copied().map(str::to_owned).collect()
}

/// The NLB `lb-arn` with `scheme` and `groups`.
fn existing(scheme: LoadBalancerSchemeEnum, groups: &[&str]) -> Option<Nlb> {
    Some(
        Nlb::builder()
            .load_balancer_arn("lb-arn")
            .scheme(scheme)
            .set_security_groups(Some(strings(groups)))
            .build(),
    )
}

fn groups(ids: &[&str], managed: Option<&str>) -> NlbGroups {
    NlbGroups {
        ids: strings(ids),
        managed: managed.map(str::to_owned),
    }
}

fn planned(step: NlbStep, detached: &[&str], managed: Option<&str>, release: bool) -> NlbPlan {
    NlbPlan {
        step,
        detached: strings(detached),
        managed: managed.map(str::to_owned),
        release_unused_managed: release,
    }
}

/// The step that gives the NLB `lb-arn` the groups `ids`.
fn set_groups(ids: &[&str]) -> NlbStep {
    NlbStep::SetGroups {
        lb: "lb-arn".to_owned(),
        groups: strings(ids),
    }
}

/// `(case, internal, the NLB, the groups it is to have, the plan or the error)`.
type NlbCase<'a> = (&'a str, bool, Option<Nlb>, NlbGroups, Result<NlbPlan, &'a str>);

#[test]
fn the_nlb_is_made_kept_or_given_other_groups() {
    use aws_sdk_elasticloadbalancingv2::types::LoadBalancerSchemeEnum::{Internal, InternetFacing};
    let cases: Vec<NlbCase<'_>> = vec![
        (
            "nothing exists: made",
            false,
            None,
            groups(&[], None),
            Ok(planned(NlbStep::Create, &[], None, false)),
        ),
        (
            "nothing exists, managed groups: made with its group, whose rules are made",
            true,
            None,
            groups(&["sg-m"], Some("sg-m")),
            Ok(planned(NlbStep::Create, &[], Some("sg-m"), false)),
        ),
        (
            "as wanted: kept",
            false,
            existing(InternetFacing, &["sg-m"]),
            groups(&["sg-m"], Some("sg-m")),
            Ok(planned(NlbStep::Keep, &[], Some("sg-m"), false)),
        ),
        (
            "the groups in another order: kept",
            true,
            existing(Internal, &["sg-b", "sg-a"]),
            groups(&["sg-a", "sg-b"], None),
            Ok(planned(NlbStep::Keep, &[], None, true)),
        ),
        (
            "no groups wanted: the NLB's left as they are",
            false,
            existing(InternetFacing, &["sg-x"]),
            groups(&[], None),
            Ok(planned(NlbStep::Keep, &[], None, false)),
        ),
        (
            "annotated groups replace the managed one: set, the managed one detached",
            false,
            existing(InternetFacing, &["sg-m"]),
            groups(&["sg-a", "sg-b"], None),
            Ok(planned(set_groups(&["sg-a", "sg-b"]), &["sg-m"], None, true)),
        ),
        (
            "one annotated group of two goes: set, it detached",
            false,
            existing(InternetFacing, &["sg-a", "sg-b"]),
            groups(&["sg-a"], None),
            Ok(planned(set_groups(&["sg-a"]), &["sg-b"], None, true)),
        ),
        (
            "the managed group back after annotated ones: set, they detached",
            false,
            existing(InternetFacing, &["sg-a"]),
            groups(&["sg-m"], Some("sg-m")),
            Ok(planned(set_groups(&["sg-m"]), &["sg-a"], Some("sg-m"), false)),
        ),
        (
            "made internet-facing, now internal: refused",
            true,
            existing(InternetFacing, &[]),
            groups(&[], None),
            Err("NLB a1's scheme cannot change; recreate the service to change to internal"),
        ),
        (
            "made internal, now internet-facing: refused",
            false,
            existing(Internal, &[]),
            groups(&[], None),
            Err("NLB a1's scheme cannot change; recreate the service to change from internal"),
        ),
    ];
    for (case, internal, lb, groups, expected) in cases {
        let got = nlb("a1", internal, lb.as_ref(), &groups).map_err(|e| e.to_string());
        assert_eq!(got, expected.map_err(str::to_owned), "{case}");
    }
}

/// A TCP check on the traffic port, upstream's default for `externalTrafficPolicy: Cluster`.
fn tcp_health() -> Health {
    Health {
        protocol: ProtocolEnum::Tcp,
        port: "traffic-port".into(),
        path: None,
        interval: 30,
        timeout: 10,
        healthy: 3,
        unhealthy: 3,
    }
}

/// An HTTP check on the health-check node port, upstream's default for `externalTrafficPolicy: Local`.
fn http_health() -> Health {
    Health {
        protocol: ProtocolEnum::Http,
        port: "32000".into(),
        path: Some("/healthz".into()),
        interval: 10,
        timeout: 10,
        healthy: 2,
        unhealthy: 2,
    }
}

/// The group `tg-arn` with a health check on `port`, `path` and the thresholds.
fn group(port: &str, path: Option<&str>, healthy: i32, unhealthy: i32) -> TargetGroup {
    TargetGroup::builder()
        .target_group_arn("tg-arn")
        .health_check_port(port)
        .set_health_check_path(path.map(str::to_owned))
        .healthy_threshold_count(healthy)
        .unhealthy_threshold_count(unhealthy)
        .build()
}

#[test]
fn a_target_group_is_made_kept_or_its_health_check_modified() {
    let keep = || TargetGroupStep::Keep("tg-arn".to_owned());
    let modify = || TargetGroupStep::Modify("tg-arn".to_owned());
    let other_interval = TargetGroup::builder()
        .target_group_arn("tg-arn")
        .health_check_protocol(ProtocolEnum::Http)
        .health_check_port("traffic-port")
        .health_check_interval_seconds(10)
        .healthy_threshold_count(3)
        .unhealthy_threshold_count(3)
        .build();
    let cases: Vec<(&str, Option<TargetGroup>, Health, TargetGroupStep)> = vec![
        (
            "none has the name: made",
            None,
            tcp_health(),
            TargetGroupStep::Create,
        ),
        (
            "as wanted: kept",
            Some(group("traffic-port", None, 3, 3)),
            tcp_health(),
            keep(),
        ),
        (
            "a TCP check has no path: the group's is not compared",
            Some(group("traffic-port", Some("/"), 3, 3)),
            tcp_health(),
            keep(),
        ),
        (
            "protocol and interval are in the name: not compared",
            Some(other_interval),
            tcp_health(),
            keep(),
        ),
        (
            "the health-check port changed: modified",
            Some(group("8080", None, 3, 3)),
            tcp_health(),
            modify(),
        ),
        (
            "the healthy threshold changed: modified",
            Some(group("traffic-port", None, 5, 3)),
            tcp_health(),
            modify(),
        ),
        (
            "the unhealthy threshold changed: modified",
            Some(group("traffic-port", None, 3, 5)),
            tcp_health(),
            modify(),
        ),
        (
            "an HTTP check as wanted: kept",
            Some(group("32000", Some("/healthz"), 2, 2)),
            http_health(),
            keep(),
        ),
        (
            "an HTTP check's path changed: modified",
            Some(group("32000", Some("/"), 2, 2)),
            http_health(),
            modify(),
        ),
    ];
    for (case, found, health, expected) in cases {
        assert_eq!(target_group(found.as_ref(), &health), expected, "{case}");
    }
}

/// `(case, instances registered, instances wanted, to register, to deregister)`.
type TargetCase<'a> = (
    &'a str,
    &'a [&'a str],
    &'a [&'a str],
    &'a [&'a str],
    &'a [&'a str],
);

#[test]
fn targets_are_made_exactly_the_wanted_instances() {
    let cases: Vec<TargetCase<'_>> = vec![
        (
            "a new group: every instance registered",
            &[],
            &["i-2", "i-1"],
            &["i-1", "i-2"],
            &[],
        ),
        ("as wanted: nothing", &["i-1", "i-2"], &["i-1", "i-2"], &[], &[]),
        (
            "a node gone: deregistered",
            &["i-1", "i-2"],
            &["i-1"],
            &[],
            &["i-2"],
        ),
        (
            "one node for another",
            &["i-1", "i-2"],
            &["i-2", "i-3"],
            &["i-3"],
            &["i-1"],
        ),
        ("no node left: all deregistered", &["i-1"], &[], &[], &["i-1"]),
    ];
    for (case, have, wanted, register, deregister) in cases {
        assert_eq!(
            targets(&set(have), &set(wanted)),
            TargetChanges {
                register: strings(register),
                deregister: strings(deregister),
            },
            "{case}"
        );
    }
}

/// A mapping of `port` (node port `port + 30000`), TLS with `certificate` and `policy` when given.
fn mapping(port: i32, certificate: Option<&str>, policy: Option<&str>) -> Mapping {
    Mapping {
        port,
        protocol: if certificate.is_some() {
            ProtocolEnum::Tls
        } else {
            ProtocolEnum::Tcp
        },
        traffic_protocol: ProtocolEnum::Tcp,
        node_port: port + 30000,
        certificate: certificate.map(str::to_owned),
        ssl_policy: policy.map(str::to_owned),
        health: tcp_health(),
    }
}

/// The listener `listener-<port>` on `port`, forwarding to `group`.
fn listener_on(
    port: i32,
    protocol: ProtocolEnum,
    certificate: Option<&str>,
    policy: Option<&str>,
    group: &str,
) -> Listener {
    Listener::builder()
        .listener_arn(format!("listener-{port}"))
        .port(port)
        .protocol(protocol)
        .set_certificates(certificate.map(|arn| vec![Certificate::builder().certificate_arn(arn).build()]))
        .set_ssl_policy(policy.map(str::to_owned))
        .default_actions(
            Action::builder()
                .r#type(ActionTypeEnum::Forward)
                .target_group_arn(group)
                .build(),
        )
        .build()
}

fn tcp_on(port: i32, group: &str) -> Listener {
    listener_on(port, ProtocolEnum::Tcp, None, None, group)
}

#[test]
fn a_listener_is_made_kept_or_modified() {
    use aws_sdk_elasticloadbalancingv2::types::ProtocolEnum::{Tls, Udp};
    let policy = Some("ELBSecurityPolicy-TLS13-1-2-2021-06");
    let modify = |retired: &str| ListenerStep::Modify {
        listener: "listener-80".to_owned(),
        retired: Some(retired.to_owned()),
    };
    // (case, the NLB's listeners, the mapping, the step for its listener; its group is `tg-80`)
    let cases: Vec<(&str, Vec<Listener>, Mapping, ListenerStep)> = vec![
        (
            "none: made",
            vec![],
            mapping(80, None, None),
            ListenerStep::Create,
        ),
        (
            "only on other ports: made",
            vec![tcp_on(443, "tg-443")],
            mapping(80, None, None),
            ListenerStep::Create,
        ),
        (
            "as wanted: kept",
            vec![tcp_on(443, "tg-443"), tcp_on(80, "tg-80")],
            mapping(80, None, None),
            ListenerStep::Keep,
        ),
        (
            "another group (a new node port or health check): modified, the old one retired",
            vec![tcp_on(80, "tg-old")],
            mapping(80, None, None),
            modify("tg-old"),
        ),
        (
            "UDP where TCP is wanted: modified",
            vec![listener_on(80, Udp, None, None, "tg-80")],
            mapping(80, None, None),
            modify("tg-80"),
        ),
        (
            "a certificate annotated: TCP made TLS",
            vec![tcp_on(80, "tg-80")],
            mapping(80, Some("arn:c"), policy),
            modify("tg-80"),
        ),
        (
            "TLS as wanted: kept",
            vec![listener_on(80, Tls, Some("arn:c"), policy, "tg-80")],
            mapping(80, Some("arn:c"), policy),
            ListenerStep::Keep,
        ),
        (
            "another certificate: modified",
            vec![listener_on(80, Tls, Some("arn:old"), policy, "tg-80")],
            mapping(80, Some("arn:c"), policy),
            modify("tg-80"),
        ),
        (
            "another policy: modified",
            vec![listener_on(
                80,
                Tls,
                Some("arn:c"),
                Some("ELBSecurityPolicy-2016-08"),
                "tg-80",
            )],
            mapping(80, Some("arn:c"), policy),
            modify("tg-80"),
        ),
    ];
    for (case, listeners, mapping, expected) in cases {
        assert_eq!(listener(&listeners, &mapping, "tg-80"), expected, "{case}");
    }
}

/// The NLB's attributes: cross-zone on or off, access logs to `(bucket, prefix)` when given.
fn attributes(cross_zone: bool, logs: Option<(&str, &str)>) -> NlbAttributes {
    NlbAttributes {
        cross_zone,
        access_log_enabled: logs.is_some(),
        access_log_bucket: logs.map(|(bucket, _)| bucket.to_owned()).unwrap_or_default(),
        access_log_prefix: logs.map(|(_, prefix)| prefix.to_owned()).unwrap_or_default(),
    }
}

#[test]
fn only_the_attributes_that_differ_are_set() {
    const CROSS_ZONE: &str = "load_balancing.cross_zone.enabled";
    const LOGS: &str = "access_logs.s3.enabled";
    const BUCKET: &str = "access_logs.s3.bucket";
    const PREFIX: &str = "access_logs.s3.prefix";
    // (case, the NLB's attributes, the wanted ones, those set)
    type Case<'a> = (
        &'a str,
        &'a [(&'a str, &'a str)],
        NlbAttributes,
        &'a [(&'a str, &'a str)],
    );
    let defaults: &[(&str, &str)] = &[(CROSS_ZONE, "false"), (LOGS, "false"), (BUCKET, "old")];
    let cases: Vec<Case<'_>> = vec![
        (
            "none described: each set",
            &[],
            attributes(false, None),
            &[(CROSS_ZONE, "false"), (LOGS, "false")],
        ),
        (
            "as wanted (the bucket not compared with logs off): nothing",
            defaults,
            attributes(false, None),
            &[],
        ),
        (
            "cross-zone turned on",
            defaults,
            attributes(true, None),
            &[(CROSS_ZONE, "true")],
        ),
        (
            "access logs turned on: with their bucket and prefix",
            defaults,
            attributes(false, Some(("logs", "nlb"))),
            &[(LOGS, "true"), (BUCKET, "logs"), (PREFIX, "nlb")],
        ),
        (
            "another bucket",
            &[
                (CROSS_ZONE, "false"),
                (LOGS, "true"),
                (BUCKET, "old"),
                (PREFIX, "nlb"),
            ],
            attributes(false, Some(("logs", "nlb"))),
            &[(BUCKET, "logs")],
        ),
        (
            "access logs turned off: the bucket and prefix left",
            &[
                (CROSS_ZONE, "false"),
                (LOGS, "true"),
                (BUCKET, "logs"),
                (PREFIX, "nlb"),
            ],
            attributes(false, None),
            &[(LOGS, "false")],
        ),
    ];
    for (case, have, wanted, expected) in cases {
        let have: BTreeMap<&str, &str> = have.iter().copied().collect();
        let changes = attribute_changes(&have, &wanted);
        let got: Vec<(&str, &str)> = changes.iter().map(|(k, v)| (*k, v.as_str())).collect();
        assert_eq!(got, expected, "{case}");
    }
}

/// `(case, the NLB's listeners, the mappings' ports, retired groups, kept groups, listeners deleted,
/// groups deleted)`.
type RemovalCase<'a> = (
    &'a str,
    Vec<Listener>,
    &'a [i32],
    &'a [&'a str],
    &'a [&'a str],
    &'a [&'a str],
    &'a [&'a str],
);

#[test]
fn what_no_mapping_wants_goes() {
    let cases: Vec<RemovalCase<'_>> = vec![
        (
            "every port still wanted, nothing retired: nothing",
            vec![tcp_on(80, "tg-80"), tcp_on(53, "tg-53")],
            &[80, 53],
            &[],
            &["tg-53", "tg-80"],
            &[],
            &[],
        ),
        (
            "a port no longer wanted: its listener and group deleted",
            vec![tcp_on(80, "tg-80"), tcp_on(53, "tg-53")],
            &[80],
            &[],
            &["tg-80"],
            &["listener-53"],
            &["tg-53"],
        ),
        (
            "a modified listener's old group deleted",
            vec![tcp_on(80, "tg-old")],
            &[80],
            &["tg-old"],
            &["tg-80"],
            &[],
            &["tg-old"],
        ),
        (
            "a modified listener's group that a mapping keeps stays",
            vec![tcp_on(80, "tg-80")],
            &[80],
            &["tg-80"],
            &["tg-80"],
            &[],
            &[],
        ),
        (
            "a deleted listener's group that a mapping keeps stays",
            vec![tcp_on(80, "tg-80"), tcp_on(8080, "tg-80")],
            &[80],
            &[],
            &["tg-80"],
            &["listener-8080"],
            &[],
        ),
        (
            "groups deleted once each, in ARN order",
            vec![tcp_on(80, "tg-b"), tcp_on(81, "tg-a"), tcp_on(82, "tg-b")],
            &[],
            &["tg-b"],
            &[],
            &["listener-80", "listener-81", "listener-82"],
            &["tg-a", "tg-b"],
        ),
    ];
    for (case, listeners, ports, retired, kept, deleted, groups) in cases {
        let mappings: Vec<Mapping> = ports.iter().map(|&port| mapping(port, None, None)).collect();
        assert_eq!(
            removals(&listeners, &mappings, &set(retired), &set(kept)),
            Removals {
                listeners: strings(deleted),
                target_groups: strings(groups),
            },
            "{case}"
        );
    }
}
