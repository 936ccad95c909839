use super::*;

const NOW: i64 = 1_000_000;

fn lease(name: &str, holder: Option<&str>, renewed_ago: i64) -> LeaseObservation {
    LeaseObservation {
        name: name.to_owned(),
        exists: true,
        holder: holder.map(str::to_owned),
        acquired: Some(NOW - 600),
        renewed: Some(NOW - renewed_ago),
        duration_seconds: Some(15),
    }
}

fn pod(name: &str, argv: &[&str]) -> ManagerPod {
    let argv: Vec<String> = argv.iter().map(|a| (*a).to_owned()).collect();
    ManagerPod::from_command_line(name, None, &argv).unwrap()
}

fn node(name: &str, initialized: bool) -> NodeObservation {
    NodeObservation {
        name: name.to_owned(),
        provider_id: initialized,
        uninitialized_taint: !initialized,
    }
}

/// Mid-roll: kube-controller-manager `kcm-a` leads and holds the migration lock; a
/// cloud-controller-manager leads its own Lease.
fn mid_roll() -> Observation {
    Observation {
        now: NOW,
        kcm_lease: lease("kube-controller-manager", Some("kcm-a"), 1),
        ccm_lease: lease("cloud-controller-manager", Some("ccm-a"), 1),
        migration_leases: vec![(
            lease("cloud-provider-extraction-migration", Some("kcm-a"), 1),
            vec!["service-lb-controller".to_owned()],
        )],
        pods: Visibility::Visible(vec![
            pod(
                "kube-controller-manager-cp1",
                &[
                    "kube-controller-manager",
                    "--cloud-provider=external",
                    "--enable-leader-migration",
                ],
            ),
            pod(
                "cloud-controller-manager-cp1",
                &[
                    "/usr/bin/cloud-controller-manager",
                    "--cloud-provider",
                    "aws",
                    "--enable-leader-migration",
                ],
            ),
        ]),
        nodes: Visibility::Visible(vec![node("a", true), node("b", false)]),
        server_version: None,
    }
}

fn status_of<'a>(conditions: &'a [Condition], kind: &str) -> &'a Condition {
    conditions.iter().find(|c| c.kind == kind).unwrap()
}

#[test]
fn conditions_come_in_their_documented_order() {
    let kinds: Vec<&str> = assess(&mid_roll()).iter().map(|c| c.kind).collect();
    assert_eq!(kinds, CONDITIONS);
}

/// [`mid_roll`] with kube-controller-manager's in-tree cloud provider still on.
fn mid_roll_in_tree() -> Observation {
    let mut observation = mid_roll();
    if let Visibility::Visible(pods) = &mut observation.pods {
        pods[0] = pod(
            "kube-controller-manager-cp1",
            &[
                "kube-controller-manager",
                "--cloud-provider=gce",
                "--enable-leader-migration",
            ],
        );
    }
    observation
}

#[test]
fn a_kube_controller_manager_without_a_cloud_provider_holding_the_lock_runs_them_nowhere() {
    let reason = |observation: &Observation| {
        let conditions = assess(observation);
        let locks = status_of(&conditions, "MigrationLocksOnCloudSide").clone();
        (locks.status, locks.reason, locks.message)
    };
    // Its pods say --cloud-provider=external (mid_roll's).
    let (status, why, message) = reason(&mid_roll());
    assert_eq!(
        (status, why),
        (Status::False, "HeldByExternalKubeControllerManager")
    );
    for part in [
        "cloud-provider-extraction-migration (held by kcm-a)",
        "--cloud-provider=external",
        "they run nowhere",
        "Restart kube-controller-manager without --enable-leader-migration",
    ] {
        assert!(message.contains(part), "{part:?} in {message}");
    }
    // No pod visible: the API server's version tells (v1.32+: kube-controller-manager is v1.31+).
    let mut hidden = mid_roll();
    hidden.pods = Visibility::Hidden("forbidden".to_owned());
    for (version, expected) in [
        (None, "HeldByKubeControllerManager"),
        (Some((1, 31)), "HeldByKubeControllerManager"),
        (Some((1, 32)), "HeldByExternalKubeControllerManager"),
        (Some((1, 37)), "HeldByExternalKubeControllerManager"),
    ] {
        hidden.server_version = version;
        let (_, why, message) = reason(&hidden);
        assert_eq!(why, expected, "{version:?}: {message}");
        if version == Some((1, 37)) {
            assert!(
                message.contains("the API server is v1.37, so kube-controller-manager is v1.36 or later"),
                "{message}"
            );
        }
    }
    // An in-tree provider on any visible pod: it may run them, whatever the version.
    let mut in_tree = mid_roll_in_tree();
    in_tree.server_version = Some((1, 37));
    assert_eq!(reason(&in_tree).1, "HeldByKubeControllerManager");
}

#[test]
fn mid_roll_is_in_progress_naming_what_is_missing() {
    let conditions = assess(&mid_roll_in_tree());
    let locks = status_of(&conditions, "MigrationLocksOnCloudSide");
    assert_eq!(
        (locks.status, locks.reason),
        (Status::False, "HeldByKubeControllerManager")
    );
    assert!(
        locks
            .message
            .contains("cloud-provider-extraction-migration (held by kcm-a)"),
        "{}",
        locks.message
    );
    let nodes = status_of(&conditions, "NodesInitialized");
    assert_eq!(nodes.status, Status::False);
    assert!(
        nodes.message.starts_with("1 of 2 nodes initialised"),
        "{}",
        nodes.message
    );
    let completed = status_of(&conditions, "Completed");
    assert_eq!(completed.status, Status::False);
    assert!(
        completed.message.contains("MigrationLocksOnCloudSide is False"),
        "{}",
        completed.message
    );
    assert!(
        completed.message.contains("NodesInitialized is False"),
        "{}",
        completed.message
    );
}

#[test]
fn completed_when_every_criterion_holds_since_the_last_of_them() {
    let mut observation = mid_roll();
    observation.migration_leases[0].0 = LeaseObservation {
        acquired: Some(NOW - 30),
        ..lease("cloud-provider-extraction-migration", Some("ccm-a"), 2)
    };
    observation.nodes = Visibility::Visible(vec![node("a", true), node("b", true)]);
    let conditions = assess(&observation);
    for condition in &conditions {
        assert_eq!(condition.status, Status::True, "{condition:?}");
    }
    // Nodes tell no time, so neither does Completed.
    assert_eq!(status_of(&conditions, "Completed").since, None);
    assert_eq!(
        status_of(&conditions, "MigrationLocksOnCloudSide").since,
        Some(NOW - 30)
    );
}

#[test]
fn an_empty_set_is_never_complete() {
    let mut observation = mid_roll();
    observation.migration_leases[0].0.holder = Some("ccm-a".into());
    observation.nodes = Visibility::Visible(Vec::new());
    let conditions = assess(&observation);
    assert_eq!(status_of(&conditions, "NodesInitialized").reason, "NoNodes");
    assert_eq!(status_of(&conditions, "Completed").status, Status::Unknown);

    observation.nodes = Visibility::Visible(vec![node("a", true)]);
    observation.pods = Visibility::Visible(Vec::new());
    let conditions = assess(&observation);
    assert_eq!(
        status_of(&conditions, "KubeControllerManagerExternal").status,
        Status::Unknown
    );
    assert_eq!(status_of(&conditions, "Completed").status, Status::Unknown);

    observation.pods = Visibility::Hidden("forbidden".into());
    assert_eq!(
        status_of(&assess(&observation), "Completed").status,
        Status::Unknown
    );
}

#[test]
fn an_in_tree_kube_controller_manager_keeps_it_from_completing() {
    let mut observation = mid_roll();
    observation.migration_leases[0].0.holder = Some("ccm-a".into());
    observation.nodes = Visibility::Visible(vec![node("a", true)]);
    observation.pods = Visibility::Visible(vec![pod(
        "kcm-cp2",
        &["kube-controller-manager", "--cloud-provider=gce"],
    )]);
    let conditions = assess(&observation);
    let external = status_of(&conditions, "KubeControllerManagerExternal");
    assert_eq!(
        (external.status, external.reason),
        (Status::False, "InTreeCloudProvider")
    );
    assert!(external.message.contains("kcm-cp2 (--cloud-provider=gce)"));
    assert_eq!(status_of(&conditions, "Completed").status, Status::False);
}

#[test]
fn after_migration_is_switched_off_the_unused_lock_counts_as_cloud_side() {
    let mut observation = mid_roll();
    // The migration Lease was released by the last holder; the managers run without migration.
    observation.migration_leases[0].0.holder = None;
    observation.pods = Visibility::Visible(vec![
        pod("kcm", &["kube-controller-manager", "--cloud-provider=external"]),
        pod("ccm", &["cloud-controller-manager", "--cloud-provider=aws"]),
    ]);
    observation.nodes = Visibility::Visible(vec![node("a", true)]);
    let conditions = assess(&observation);
    let locks = status_of(&conditions, "MigrationLocksOnCloudSide");
    assert_eq!(locks.status, Status::True, "{locks:?}");
    assert!(locks.message.contains("leader migration is off"));
    assert_eq!(status_of(&conditions, "Completed").status, Status::True);

    // With migration still on, an unheld lock means its controllers run nowhere.
    observation.pods = Visibility::Visible(vec![
        pod("kcm", &["kube-controller-manager", "--cloud-provider=external"]),
        pod(
            "ccm",
            &["cloud-controller-manager", "--enable-leader-migration=true"],
        ),
    ]);
    let locks = status_of(&assess(&observation), "MigrationLocksOnCloudSide").clone();
    assert_eq!((locks.status, locks.reason), (Status::False, "NotHeld"));
}

#[test]
fn migration_is_off_only_when_every_visible_cloud_controller_manager_runs_without_it() {
    let ccm = |name: &str, migration: bool| {
        let mut argv = vec!["cloud-controller-manager"];
        if migration {
            argv.push("--enable-leader-migration");
        }
        pod(name, &argv)
    };
    let kcm = || pod("kcm", &["kube-controller-manager", "--enable-leader-migration"]);
    type Case = (&'static str, Visibility<Vec<ManagerPod>>, Option<bool>);
    let cases: Vec<Case> = vec![
        (
            "pods not visible",
            Visibility::Hidden("forbidden".to_owned()),
            None,
        ),
        (
            "no cloud-controller-manager pod",
            Visibility::Visible(vec![kcm()]),
            None,
        ),
        (
            "one without leader migration",
            Visibility::Visible(vec![kcm(), ccm("a", false)]),
            Some(true),
        ),
        (
            "one with it",
            Visibility::Visible(vec![ccm("a", true)]),
            Some(false),
        ),
        (
            "mid-roll: one without it, one with it",
            Visibility::Visible(vec![ccm("a", false), ccm("b", true)]),
            Some(false),
        ),
    ];
    for (case, pods, expected) in cases {
        let observation = Observation { pods, ..mid_roll() };
        assert_eq!(ccm_migration_off(&observation), expected, "{case}");
    }
}

/// `(case, the migration Lease's holder, whether an unheld lock is on the cloud side, the locks on
/// kube-controller-manager, unheld and unattributed, since)`.
type HoldersCase<'a> = (
    &'a str,
    Option<&'a str>,
    bool,
    &'a [&'a str],
    &'a [&'a str],
    &'a [&'a str],
    Option<i64>,
);

#[test]
fn the_migration_locks_are_sorted_by_holder() {
    let cases: Vec<HoldersCase<'_>> = vec![
        (
            "held by cloud-controller-manager's leader: since it took the lock",
            Some("ccm-a"),
            false,
            &[],
            &[],
            &[],
            Some(NOW - 30),
        ),
        (
            "held by kube-controller-manager's leader",
            Some("kcm-a"),
            false,
            &["cloud-provider-extraction-migration (held by kcm-a)"],
            &[],
            &[],
            None,
        ),
        (
            "held by neither leader",
            Some("other"),
            false,
            &[],
            &[],
            &["cloud-provider-extraction-migration (held by other)"],
            None,
        ),
        (
            "held by no one",
            None,
            false,
            &[],
            &["cloud-provider-extraction-migration"],
            &[],
            None,
        ),
        (
            "unused, leader migration being off: since the leader took its main Lease",
            None,
            true,
            &[],
            &[],
            &[],
            Some(NOW - 600),
        ),
    ];
    for (case, holder, unheld_is_cloud_side, on_kcm, unheld, unattributed, since) in cases {
        let mut observation = mid_roll();
        observation.migration_leases[0].0 = LeaseObservation {
            acquired: Some(NOW - 30),
            ..lease("cloud-provider-extraction-migration", holder, 1)
        };
        let holders = lock_holders(&observation, unheld_is_cloud_side);
        assert_eq!(holders.on_kcm, on_kcm, "{case}: on kube-controller-manager");
        assert_eq!(holders.unheld, unheld, "{case}: unheld");
        assert_eq!(holders.unattributed, unattributed, "{case}: unattributed");
        assert_eq!(holders.since, since, "{case}: since");
    }
}

#[test]
fn a_holder_that_stopped_renewing_is_stale_and_no_longer_leads() {
    let mut observation = mid_roll();
    observation.kcm_lease = lease("kube-controller-manager", Some("kcm-a"), 40);
    observation.migration_leases[0].0 = lease("cloud-provider-extraction-migration", Some("kcm-a"), 40);
    let conditions = assess(&observation);
    let kcm = status_of(&conditions, "KubeControllerManagerLeading");
    assert_eq!((kcm.status, kcm.reason), (Status::False, "Stale"));
    assert_eq!(kcm.since, Some(NOW - 40 + 15));
    let stale = status_of(&conditions, "NoStaleHolders");
    assert_eq!(stale.status, Status::False);
    assert!(
        stale
            .message
            .contains("kube-controller-manager (held by kcm-a, expired 25s ago)"),
        "{}",
        stale.message
    );
    // A stale holder is no one's: the lock is not attributed to kube-controller-manager any more.
    assert_eq!(
        status_of(&conditions, "MigrationLocksOnCloudSide").reason,
        "NotHeld"
    );
}

#[test]
fn a_missing_lease_is_reported_as_absent() {
    let mut observation = mid_roll();
    observation.ccm_lease = LeaseObservation {
        name: "cloud-controller-manager".into(),
        ..LeaseObservation::default()
    };
    let ccm = status_of(&assess(&observation), "CloudControllerManagerLeading").clone();
    assert_eq!((ccm.status, ccm.reason), (Status::False, "LeaseAbsent"));
}

#[test]
fn command_lines_are_read_as_pflag_reads_them() {
    let argv: Vec<String> = [
        "/usr/local/bin/kube-controller-manager",
        "--cloud-provider",
        "external",
        "--enable-leader-migration",
        "--leader-migration-config=/etc/lm.yaml",
        "-v=2",
        "--controllers=*,-route",
    ]
    .iter()
    .map(|a| (*a).to_owned())
    .collect();
    let pod = ManagerPod::from_command_line("p", None, &argv).unwrap();
    assert_eq!(pod.component, "kube-controller-manager");
    assert_eq!(pod.cloud_provider.as_deref(), Some("external"));
    assert!(pod.leader_migration);
    assert_eq!(pod.leader_migration_config.as_deref(), Some("/etc/lm.yaml"));
    assert_eq!(pod.controllers.as_deref(), Some("*,-route"));
    // Recognised by kubeadm's label when the program has another name.
    let other: Vec<String> = vec!["/hyperkube".into(), "--enable-leader-migration=false".into()];
    let pod = ManagerPod::from_command_line("q", Some("cloud-controller-manager"), &other).unwrap();
    assert!(!pod.leader_migration);
    assert!(ManagerPod::from_command_line("r", None, &["etcd".to_owned()]).is_none());
}
