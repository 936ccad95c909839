//! Metrics, with upstream's names where upstream has them.

use cloud_provider::CloudError;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// `{name}`: a Lease.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct LeaseLabels {
    pub(crate) name: String,
}

/// `{name, manager}`: a controller in a manager.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct ControllerLabels {
    pub(crate) name: String,
    pub(crate) manager: String,
}

/// `{controller, result}`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct ReconcileLabels {
    pub(crate) controller: String,
    pub(crate) result: String,
}

/// `{controller}`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct ControllerOnly {
    pub(crate) controller: String,
}

/// `{request, result}`: a cloud API call.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct CloudLabels {
    pub(crate) request: String,
    pub(crate) result: String,
}

/// `{code, host, method}`: client-go's `rest_client_requests_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct RestLabels {
    pub(crate) code: String,
    pub(crate) host: String,
    pub(crate) method: String,
}

/// `{verb, host}`: client-go's `rest_client_request_duration_seconds`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct RestDurationLabels {
    pub(crate) verb: String,
    pub(crate) host: String,
}

/// Every metric of the manager, and the registry that exposes them.
pub struct Metrics {
    registry: Registry,
    pub(crate) leader_election_master_status: Family<LeaseLabels, Gauge>,
    pub(crate) running_managed_controllers: Family<ControllerLabels, Gauge>,
    pub(crate) reconciles: Family<ReconcileLabels, Counter>,
    pub(crate) reconcile_duration: Family<ControllerOnly, Histogram>,
    pub(crate) cloud_request_duration: Family<CloudLabels, Histogram>,
    pub(crate) rest_client_requests: Family<RestLabels, Counter>,
    pub(crate) rest_client_request_duration: Family<RestDurationLabels, Histogram>,
    pub(crate) taint_removal_delay: Histogram,
    pub(crate) initial_node_sync_delay: Histogram,
    pub(crate) load_balancer_syncs: Counter,
    pub(crate) nodesync_errors: Counter,
    pub(crate) nodesync_latency: Histogram,
    pub(crate) update_load_balancer_host_latency: Histogram,
    pub(crate) route_syncs: Counter,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

impl Metrics {
    /// All families, registered.
    pub fn new() -> Metrics {
        let mut registry = Registry::default();
        let leader_election_master_status = Family::<LeaseLabels, Gauge>::default();
        registry.register(
            "leader_election_master_status",
            "[ALPHA] Gauge of if the reporting system is master of the relevant lease, 0 indicates backup, 1 indicates master. 'name' is the string used to identify the lease.",
            leader_election_master_status.clone(),
        );
        let running_managed_controllers = Family::<ControllerLabels, Gauge>::default();
        registry.register(
            "running_managed_controllers",
            "Indicates where instances of a controller are currently running",
            running_managed_controllers.clone(),
        );
        let reconciles = Family::<ReconcileLabels, Counter>::default();
        registry.register(
            "controller_reconciles",
            "Reconciliations by controller and result",
            reconciles.clone(),
        );
        let reconcile_duration = Family::<ControllerOnly, Histogram>::new_with_constructor(|| {
            Histogram::new(exponential_buckets(0.001, 2.0, 16))
        });
        registry.register(
            "controller_reconcile_duration_seconds",
            "Time to reconcile one object, by controller",
            reconcile_duration.clone(),
        );
        let cloud_request_duration = Family::<CloudLabels, Histogram>::new_with_constructor(|| {
            Histogram::new(exponential_buckets(0.001, 2.0, 16))
        });
        registry.register(
            "cloudprovider_api_request_duration_seconds",
            "Latency of cloud provider calls, by request and result",
            cloud_request_duration.clone(),
        );
        // Upstream: 1 s × 4^n, 6 buckets.
        let taint_removal_delay = Histogram::new(exponential_buckets(1.0, 4.0, 6));
        registry.register(
            "node_controller_cloud_provider_taint_removal_delay_seconds",
            "[ALPHA] Number of seconds after node creation when NodeController removed the cloud-provider taint of a single node",
            taint_removal_delay.clone(),
        );
        let initial_node_sync_delay = Histogram::new(exponential_buckets(1.0, 4.0, 6));
        registry.register(
            "node_controller_initial_node_sync_delay_seconds",
            "[ALPHA] Number of seconds after node creation when NodeController finished the initial synchronization of a single node",
            initial_node_sync_delay.clone(),
        );
        let load_balancer_syncs = Counter::default();
        registry.register(
            "service_controller_loadbalancer_sync",
            "[ALPHA] A metric counting the amount of times any load balancer has been configured, as an effect of service/node changes on the cluster",
            load_balancer_syncs.clone(),
        );
        let nodesync_errors = Counter::default();
        registry.register(
            "service_controller_nodesync_error",
            "[ALPHA] A metric counting the amount of times any load balancer has been configured and errored, as an effect of node changes on the cluster",
            nodesync_errors.clone(),
        );
        // Upstream: 1 s × 2^n, 15 buckets.
        let nodesync_latency = Histogram::new(exponential_buckets(1.0, 2.0, 15));
        registry.register(
            "service_controller_nodesync_latency_seconds",
            "[ALPHA] A metric measuring the latency for nodesync which updates loadbalancer hosts on cluster node updates.",
            nodesync_latency.clone(),
        );
        let update_load_balancer_host_latency = Histogram::new(exponential_buckets(1.0, 2.0, 15));
        registry.register(
            "service_controller_update_loadbalancer_host_latency_seconds",
            "[ALPHA] A metric measuring the latency for updating each load balancer hosts.",
            update_load_balancer_host_latency.clone(),
        );
        let route_syncs = Counter::default();
        registry.register(
            "route_controller_route_sync",
            "[ALPHA] A metric counting the amount of times routes have been synced with the cloud provider.",
            route_syncs.clone(),
        );
        let rest_client_requests = Family::<RestLabels, Counter>::default();
        registry.register(
            "rest_client_requests",
            "Number of HTTP requests, partitioned by status code, method, and host",
            rest_client_requests.clone(),
        );
        let rest_client_request_duration =
            Family::<RestDurationLabels, Histogram>::new_with_constructor(|| {
                // client-go's buckets.
                Histogram::new([0.005, 0.025, 0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 15.0, 30.0, 60.0])
            });
        registry.register(
            "rest_client_request_duration_seconds",
            "Request latency in seconds. Broken down by verb, and host",
            rest_client_request_duration.clone(),
        );
        registry.register_collector(Box::new(crate::process_metrics::ProcessCollector));
        Metrics {
            registry,
            rest_client_requests,
            rest_client_request_duration,
            leader_election_master_status,
            running_managed_controllers,
            reconciles,
            reconcile_duration,
            cloud_request_duration,
            taint_removal_delay,
            initial_node_sync_delay,
            load_balancer_syncs,
            nodesync_errors,
            nodesync_latency,
            update_load_balancer_host_latency,
            route_syncs,
        }
    }

    /// The Prometheus text exposition of every metric.
    pub fn encode(&self) -> String {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &self.registry)
            .expect("writing to a String cannot fail");
        text
    }

    /// One API request answered with `code` (`<error>` when none came), as client-go counts it.
    pub(crate) fn api_request(&self, host: &str, method: &str, code: &str, seconds: f64) {
        self.rest_client_requests
            .get_or_create(&RestLabels {
                code: code.to_owned(),
                host: host.to_owned(),
                method: method.to_owned(),
            })
            .inc();
        self.rest_client_request_duration
            .get_or_create(&RestDurationLabels {
                verb: method.to_owned(),
                host: host.to_owned(),
            })
            .observe(seconds);
    }

    pub(crate) fn reconciled(&self, controller: &str, ok: bool, seconds: f64) {
        let result = if ok { "success" } else { "error" };
        self.reconciles
            .get_or_create(&ReconcileLabels {
                controller: controller.to_owned(),
                result: result.to_owned(),
            })
            .inc();
        self.reconcile_duration
            .get_or_create(&ControllerOnly {
                controller: controller.to_owned(),
            })
            .observe(seconds);
    }

    /// A cloud call that answered `answers`: an error unless every answer is a value or an expected "no"
    /// (`InstanceNotFound`, `NotImplemented`).
    pub(crate) fn cloud_call<T>(&self, request: &str, answers: &[Result<T, CloudError>], seconds: f64) {
        let ok = answers.iter().all(|a| {
            matches!(
                a,
                Ok(_) | Err(CloudError::InstanceNotFound | CloudError::NotImplemented)
            )
        });
        let result = if ok { "success" } else { "error" };
        self.cloud_request_duration
            .get_or_create(&CloudLabels {
                request: request.to_owned(),
                result: result.to_owned(),
            })
            .observe(seconds);
    }
}

#[cfg(test)]
mod tests {
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
        ] {
            assert!(text.contains(needle), "{needle} missing from\n{text}");
        }
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
}
