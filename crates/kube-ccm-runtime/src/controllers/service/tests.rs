use kube_ccm_provider::names::FINALIZER_LOAD_BALANCER_CLEANUP;
use serde_json::json;

use super::*;

fn service(value: serde_json::Value) -> Service {
    serde_json::from_value(value).unwrap()
}

/// A node set that changes while the cache still holds the service as it was before this process
/// published its address is a hosts update (upstream's `UpdatedLoadBalancer`), not a new ensure.
#[test]
fn the_step_after_the_last_sync() {
    let synced = |spec, nodes| Synced { spec, nodes };
    let last = Some(synced(1, 1));
    assert_eq!(next_step(None, synced(1, 1), true), Step::Ensure);
    assert_eq!(next_step(last, synced(1, 1), true), Step::Nothing);
    assert_eq!(
        next_step(last, synced(1, 1), false),
        Step::Ensure,
        "the address was removed"
    );
    assert_eq!(next_step(last, synced(1, 2), true), Step::UpdateHosts);
    assert_eq!(next_step(last, synced(1, 2), false), Step::Ensure);
    assert_eq!(next_step(last, synced(2, 1), true), Step::Ensure);
    assert_eq!(next_step(last, synced(2, 2), true), Step::Ensure);
}

#[test]
fn wanting_and_cleaning_up() {
    let plain = LoadBalancerClasses::default();
    let lb = service(json!({"metadata": {"name": "s"}, "spec": {"type": "LoadBalancer"}}));
    assert!(wants_load_balancer(&lb, &plain) && !needs_cleanup(&lb, &plain));
    let classed = service(
        json!({"metadata": {"name": "s"}, "spec": {"type": "LoadBalancer", "loadBalancerClass": "x.io/lb"}}),
    );
    assert!(!wants_load_balancer(&classed, &plain));
    // A class never makes a live service with our finalizer need clean-up (upstream's needsCleanup).
    let classed_with_finalizer = service(
        json!({"metadata": {"name": "s", "finalizers": [FINALIZER_LOAD_BALANCER_CLEANUP]}, "spec": {"type": "LoadBalancer", "loadBalancerClass": "x.io/lb"}}),
    );
    assert!(
        !wants_load_balancer(&classed_with_finalizer, &plain)
            && !needs_cleanup(&classed_with_finalizer, &plain)
    );
    let changed_type = service(
        json!({"metadata": {"name": "s", "finalizers": [FINALIZER_LOAD_BALANCER_CLEANUP]}, "spec": {"type": "ClusterIP"}}),
    );
    assert!(needs_cleanup(&changed_type, &plain));
    let deleting = |class: Option<&str>| {
        service(
            json!({"metadata": {"name": "s", "finalizers": [FINALIZER_LOAD_BALANCER_CLEANUP], "deletionTimestamp": "2026-01-01T00:00:00Z"}, "spec": {"type": "LoadBalancer", "loadBalancerClass": class}}),
        )
    };
    assert!(needs_cleanup(&deleting(None), &plain));
    // Another class's service, deleting with the (shared) finalizer: its own manager's to clean up.
    assert!(!needs_cleanup(&deleting(Some("x.io/lb")), &plain));

    let only_x = LoadBalancerClasses::new(false, ["x.io/lb"]).unwrap();
    assert!(wants_load_balancer(&classed, &only_x) && !wants_load_balancer(&lb, &only_x));
    assert!(needs_cleanup(&deleting(Some("x.io/lb")), &only_x));
    assert!(!needs_cleanup(&deleting(None), &only_x));
    // The class is erased with the type: the one recorded with the finalizer says whose it is.
    assert!(!needs_cleanup(&changed_type, &only_x));
    let left_x = service(
        json!({"metadata": {"name": "s", "finalizers": [FINALIZER_LOAD_BALANCER_CLEANUP], "annotations": {ANNOTATION_LOAD_BALANCER_CLASS: "x.io/lb"}}, "spec": {"type": "ClusterIP"}}),
    );
    assert!(needs_cleanup(&left_x, &only_x) && !needs_cleanup(&left_x, &plain));
}
