use std::time::Duration;

use kube_ccm_provider::{CallObserver, CloudError};

use super::*;

#[test]
fn upstream_names_are_exposed() {
    let metrics = Metrics::new();
    metrics
        .leader_election_master_status
        .get_or_create(&LeaseLabels {
            name: "cloud-controller-manager".into(),
        })
        .set(1);
    metrics
        .running_managed_controllers
        .get_or_create(&ControllerLabels {
            name: "service-lb-controller".into(),
            manager: "cloud-controller-manager".into(),
        })
        .set(1);
    metrics.reconciled("cloud-node-controller", true, 0.01);
    metrics.api_request("10.0.0.1:6443", "PATCH", "409", 0.02);
    metrics.api_request("10.0.0.1:6443", "GET", "<error>", 0.3);
    metrics.set_provider("my-cloud");
    let throttled = CloudError::Throttled {
        after: Duration::from_secs(1),
        message: "RequestLimitExceeded".into(),
    };
    metrics
        .cloud
        .observe("DescribeInstances", Duration::from_millis(20), Err(&throttled));
    let later = CloudError::Retry {
        after: Duration::from_secs(5),
        message: "DependencyViolation".into(),
    };
    metrics
        .cloud
        .observe("DeleteSecurityGroup", Duration::from_millis(20), Err(&later));
    metrics
        .cloud
        .observe("DescribeInstances", Duration::from_millis(20), Ok(()));
    metrics.cloud.observe(
        "get_load_balancer",
        Duration::from_millis(5),
        Err(&CloudError::InstanceNotFound),
    );
    metrics.work_queue("cloud-node-controller").add("node-1");
    let text = metrics.encode();
    for needle in [
        "leader_election_master_status{name=\"cloud-controller-manager\"} 1",
        "running_managed_controllers{name=\"service-lb-controller\",manager=\"cloud-controller-manager\"} 1",
        "controller_reconciles_total{controller=\"cloud-node-controller\",result=\"success\"} 1",
        "node_controller_cloud_provider_taint_removal_delay_seconds_bucket",
        "service_controller_loadbalancer_sync_total 0",
        "route_controller_route_sync_total 0",
        "rest_client_requests_total{code=\"409\",host=\"10.0.0.1:6443\",method=\"PATCH\"} 1",
        "rest_client_requests_total{code=\"<error>\",host=\"10.0.0.1:6443\",method=\"GET\"} 1",
        "rest_client_request_duration_seconds_bucket{le=\"0.025\",verb=\"PATCH\",host=\"10.0.0.1:6443\"} 1",
        "cloudprovider_my_cloud_api_request_duration_seconds_count{request=\"DescribeInstances\"} 2",
        "cloudprovider_my_cloud_api_request_duration_seconds_count{request=\"get_load_balancer\"} 1",
        "cloudprovider_my_cloud_api_request_errors_total{request=\"DescribeInstances\",error=\"throttled\"} 1",
        "cloudprovider_my_cloud_api_request_errors_total{request=\"DeleteSecurityGroup\",error=\"retry\"} 1",
        "workqueue_adds_total{name=\"cloud-node-controller\"} 1",
        "workqueue_depth{name=\"cloud-node-controller\"} 1",
    ] {
        assert!(text.contains(needle), "{needle} missing from\n{text}");
    }
    assert!(
        !text.contains("request=\"get_load_balancer\",error="),
        "an instance that does not exist is an answer, not an error:\n{text}"
    );
    let classic = metrics.encode_text();
    for needle in [
        "# HELP controller_reconciles_total Reconciliations by controller and result.\n# TYPE controller_reconciles_total counter\n",
        "# TYPE leader_election_master_status gauge\n",
        "# TYPE cloudprovider_my_cloud_api_request_errors_total counter\n",
    ] {
        assert!(classic.contains(needle), "{needle} missing from\n{classic}");
    }
    assert!(!classic.contains("# EOF") && text.ends_with("# EOF\n"));
    if std::path::Path::new("/proc/self/stat").exists() {
        for family in [
            "# TYPE process_cpu_seconds counter",
            "process_cpu_seconds_total ",
            "process_resident_memory_bytes ",
            "process_virtual_memory_bytes ",
            "process_start_time_seconds ",
            "process_open_fds ",
            "process_max_fds ",
        ] {
            assert!(text.contains(family), "{family} missing from\n{text}");
        }
    }
}
