use ccm_audit::Overlap;
use clap::FromArgMatches as _;

use super::*;

#[test]
fn the_arguments_that_cannot_work_together_are_refused() {
    let cases: [(&[&str], Result<From, &str>); 6] = [
        (&[], Ok(From::Ours)),
        (
            &["--from", "kcm"],
            Err("--from kcm: the Go programs run on the real API server"),
        ),
        (
            &["--from", "go-ccm", "--apiserver", "kube", "--cloud", "aws"],
            Err("act on the fake cloud only"),
        ),
        (
            &["--from", "kcm", "--apiserver", "kube", "--rollback"],
            Err("--from kcm --rollback"),
        ),
        (&["--from", "kcm", "--apiserver", "kube"], Ok(From::Kcm)),
        (
            &["--from", "go-ccm", "--apiserver", "kube", "--rollback"],
            Ok(From::GoCcm),
        ),
    ];
    for (flags, expected) in cases {
        let command = <Args as clap::Args>::augment_args(clap::Command::new("demo"));
        let matches = command
            .try_get_matches_from(std::iter::once(&"demo").chain(flags))
            .expect("flags parse");
        let args = Args::from_arg_matches(&matches).expect("arguments");
        match (from_of(&args), expected) {
            (Ok(from), Ok(expected)) => assert_eq!(from, expected, "{flags:?}"),
            (Err(error), Err(expected)) => {
                assert!(error.to_string().contains(expected), "{flags:?}: {error}")
            }
            (got, expected) => panic!("{flags:?}: {got:?}, expected {expected:?}"),
        }
    }
}

fn outcome() -> Outcome {
    Outcome {
        report: AuditReport {
            writes_checked: 10,
            ..AuditReport::default()
        },
        migrated: true,
        rollback: false,
        migration_lease_ends_with: Some(Side::Ccm),
        registered: Created {
            nodes: 3,
            services: 1,
        },
        nodes_initialized: 3,
        services_with_ingress: 1,
        invalid_writes: 0,
        cloud_writes: 4,
        unattributed_cloud_writes: Vec::new(),
        inventory: Inventory {
            instances: 3,
            load_balancers: vec![harness::CloudLoadBalancer {
                name: "a1".to_owned(),
                address: "10.0.0.1".to_owned(),
                backends: 3,
            }],
            routes: 3,
        },
        apiserver: serde_json::json!({"kind": "test"}),
        judged_from: "the test API server's records".to_owned(),
        from: serde_json::json!({"kind": "ours"}),
    }
}

#[test]
fn the_verdict_fails_on_any_overlap_or_unfinished_work() {
    assert!(outcome().ok());
    let mut overlapping = outcome();
    overlapping.report.overlaps.push(Overlap::ConcurrentTenures {
        lease: MIGRATION_LEASE.to_owned(),
        first: "a".to_owned(),
        second: "b".to_owned(),
    });
    assert!(!overlapping.ok());
    let nothing_judged = Outcome {
        report: AuditReport::default(),
        ..outcome()
    };
    assert!(!nothing_judged.ok(), "a run without writes proves nothing");
    let not_migrated = Outcome {
        migrated: false,
        ..outcome()
    };
    assert!(!not_migrated.ok());
    let ended_elsewhere = Outcome {
        migration_lease_ends_with: Some(Side::Kcm),
        ..outcome()
    };
    assert!(
        !ended_elsewhere.ok(),
        "a migration ends with the cloud-controller-manager"
    );
    let rolled_back = Outcome {
        rollback: true,
        migration_lease_ends_with: Some(Side::Kcm),
        ..outcome()
    };
    assert!(rolled_back.ok());
    let not_rolled_back = Outcome {
        rollback: true,
        ..outcome()
    };
    assert!(
        !not_rolled_back.ok(),
        "a rollback ends with kube-controller-manager"
    );
    let unfinished = Outcome {
        nodes_initialized: 2,
        ..outcome()
    };
    assert!(!unfinished.ok());
    let unattributed = Outcome {
        unattributed_cloud_writes: vec!["CreateLoadBalancer".to_owned()],
        ..outcome()
    };
    assert!(!unattributed.ok(), "a cloud change nobody can be held to");
    let orphaned = Outcome {
        inventory: Inventory {
            load_balancers: vec![outcome().inventory.load_balancers[0].clone(); 2],
            ..outcome().inventory
        },
        ..outcome()
    };
    assert!(!orphaned.ok(), "a load balancer without a service");
}
