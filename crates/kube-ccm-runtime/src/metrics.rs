//! Metrics, with upstream's names where upstream has them.

use std::sync::Arc;
use std::time::Duration;

use kube_ccm_provider::RateBudget;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

mod cloud;

use crate::workqueue::{QueueCollector, QueueFamilies, Queues, WorkQueue};
use cloud::CloudCollector;
pub(crate) use cloud::{CloudMetrics, batch_outcome};

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

/// `{code, webhook}`: upstream's `cloud_provider_webhook_request_*`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct WebhookLabels {
    pub(crate) code: String,
    pub(crate) webhook: String,
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

/// `{name, stage}`: component-base's `kubernetes_feature_enabled`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct FeatureLabels {
    pub(crate) name: String,
    pub(crate) stage: String,
}

/// What a binary is, as component-base's `kubernetes_build_info` labels it.
#[derive(Clone, Debug, Default, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct BuildInfo {
    /// Major version.
    pub major: String,
    /// Minor version.
    pub minor: String,
    /// `vX.Y.Z`.
    pub git_version: String,
    /// The commit it was built from (empty when not known).
    pub git_commit: String,
    /// `clean` or `dirty` (empty when not known).
    pub git_tree_state: String,
    /// When (RFC 3339; empty when not known).
    pub build_date: String,
    /// The compiler's version (upstream: Go's).
    pub go_version: String,
    /// The compiler.
    pub compiler: String,
    /// `os/arch`, as Go names them.
    pub platform: String,
}

/// client-go's buckets for its request and rate-limiter latencies.
const CLIENT_GO_BUCKETS: [f64; 12] = [0.005, 0.025, 0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 15.0, 30.0, 60.0];

/// Every metric of the manager, and the registry that exposes them.
pub struct Metrics {
    registry: Registry,
    pub(crate) leader_election_master_status: Family<LeaseLabels, Gauge>,
    pub(crate) running_managed_controllers: Family<ControllerLabels, Gauge>,
    pub(crate) reconciles: Family<ReconcileLabels, Counter>,
    pub(crate) reconcile_duration: Family<ControllerOnly, Histogram>,
    pub(crate) leader_holder_changes: Family<LeaseLabels, Counter>,
    pub(crate) leader_lost: Family<LeaseLabels, Counter>,
    pub(crate) cloud: Arc<CloudMetrics>,
    queue_families: QueueFamilies,
    queues: Queues,
    pub(crate) rest_client_requests: Family<RestLabels, Counter>,
    pub(crate) rest_client_request_duration: Family<RestDurationLabels, Histogram>,
    pub(crate) rest_client_rate_limiter_duration: Family<RestDurationLabels, Histogram>,
    pub(crate) taint_removal_delay: Histogram,
    pub(crate) uninitialized_nodes: Gauge,
    pub(crate) uninterpretable_provider_ids: Gauge,
    pub(crate) node_deletion_breaker_trips: Counter,
    pub(crate) nodes_deleted: Counter,
    pub(crate) nodes_awaiting_deletion: Gauge,
    pub(crate) oldest_uninitialized_node_age: Gauge<f64, std::sync::atomic::AtomicU64>,
    pub(crate) initial_node_sync_delay: Histogram,
    pub(crate) load_balancer_syncs: Counter,
    pub(crate) nodesync_errors: Counter,
    pub(crate) nodesync_latency: Histogram,
    pub(crate) update_load_balancer_host_latency: Histogram,
    pub(crate) orphaned_load_balancers: Gauge,
    pub(crate) orphaned_load_balancers_deleted: Counter,
    pub(crate) route_syncs: Counter,
    pub(crate) webhook_requests: Family<WebhookLabels, Counter>,
    pub(crate) webhook_request_duration: Family<WebhookLabels, Histogram>,
    build_info: Family<BuildInfo, Gauge>,
    feature_enabled: Family<FeatureLabels, Gauge>,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

impl Metrics {
    /// All families, registered.
    // Long on purpose: one registration per metric family, in the order `/metrics` shows them; a table
    // split across functions would only hide which names and help texts the manager exposes.
    pub fn new() -> Metrics {
        let mut registry = Registry::default();
        let leader_election_master_status = Family::<LeaseLabels, Gauge>::default();
        registry.register(
            "leader_election_master_status",
            "[ALPHA] Gauge of if the reporting system is master of the relevant lease, 0 indicates backup, 1 indicates master. 'name' is the string used to identify the lease",
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
        let leader_holder_changes = Family::<LeaseLabels, Counter>::default();
        registry.register(
            "leader_election_holder_changes",
            "Changes of a Lease's holder this process observed (hand-offs, whoever the holders were), by Lease",
            leader_holder_changes.clone(),
        );
        let leader_lost = Family::<LeaseLabels, Counter>::default();
        registry.register(
            "leader_election_lost",
            "Times this process stopped leading a Lease it held (lost or released), by Lease",
            leader_lost.clone(),
        );
        let cloud = Arc::new(CloudMetrics::default());
        registry.register_collector(Box::new(CloudCollector(cloud.clone())));
        let queue_families = QueueFamilies::new();
        registry.register(
            "workqueue_adds",
            "Total number of adds handled by workqueue",
            queue_families.adds.clone(),
        );
        registry.register(
            "workqueue_retries",
            "Total number of retries handled by workqueue",
            queue_families.retries.clone(),
        );
        registry.register(
            "workqueue_queue_duration_seconds",
            "How long in seconds an item stays in workqueue before being requested",
            queue_families.queue_duration.clone(),
        );
        registry.register(
            "workqueue_work_duration_seconds",
            "How long in seconds processing an item from workqueue takes",
            queue_families.work_duration.clone(),
        );
        let queues = Queues::default();
        registry.register_collector(Box::new(QueueCollector(queues.clone())));
        // Upstream: 1 s × 4^n, 6 buckets.
        let taint_removal_delay = Histogram::new(exponential_buckets(1.0, 4.0, 6));
        registry.register(
            "node_controller_cloud_provider_taint_removal_delay_seconds",
            "[ALPHA] Number of seconds after node creation when NodeController removed the cloud-provider taint of a single node",
            taint_removal_delay.clone(),
        );
        let uninitialized_nodes = Gauge::default();
        registry.register(
            "node_controller_uninitialized_nodes",
            "Nodes that still carry the cloud provider's uninitialized taint, as the running cloud-node-controller sees them (0 where it does not run)",
            uninitialized_nodes.clone(),
        );
        let uninterpretable_provider_ids = Gauge::default();
        registry.register(
            "node_lifecycle_uninterpretable_provider_ids",
            "Not-ready nodes whose provider ID the cloud provider cannot interpret, in the cloud-node-lifecycle-controller's last round: never looked up, so never deleted or tainted (0 where it does not run)",
            uninterpretable_provider_ids.clone(),
        );
        let node_deletion_breaker_trips = Counter::default();
        registry.register(
            "node_lifecycle_deletion_breaker_trips",
            "Rounds of the cloud-node-lifecycle-controller that deleted no node because the cloud answered \"gone\" for more of the nodes asked about than --node-deletion-breaker-ratio allows",
            node_deletion_breaker_trips.clone(),
        );
        let nodes_deleted = Counter::default();
        registry.register(
            "node_lifecycle_deleted_nodes",
            "Nodes the cloud-node-lifecycle-controller deleted because their instances were certainly gone",
            nodes_deleted.clone(),
        );
        let nodes_awaiting_deletion = Gauge::default();
        registry.register(
            "node_lifecycle_nodes_awaiting_deletion",
            "Not-ready nodes the cloud answered \"gone\" for, not deleted yet: awaiting confirmation, held by the breaker or over --node-deletion-max-per-round (0 where the cloud-node-lifecycle-controller does not run)",
            nodes_awaiting_deletion.clone(),
        );
        let oldest_uninitialized_node_age = Gauge::<f64, std::sync::atomic::AtomicU64>::default();
        registry.register(
            "node_controller_oldest_uninitialized_node_age_seconds",
            "Age of the oldest node that still carries the cloud provider's uninitialized taint (0 when there is none, or where the cloud-node-controller does not run)",
            oldest_uninitialized_node_age.clone(),
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
            "[ALPHA] A metric measuring the latency for nodesync which updates loadbalancer hosts on cluster node updates",
            nodesync_latency.clone(),
        );
        let update_load_balancer_host_latency = Histogram::new(exponential_buckets(1.0, 2.0, 15));
        registry.register(
            "service_controller_update_loadbalancer_host_latency_seconds",
            "[ALPHA] A metric measuring the latency for updating each load balancer hosts",
            update_load_balancer_host_latency.clone(),
        );
        let orphaned_load_balancers = Gauge::default();
        registry.register(
            "service_controller_orphaned_load_balancers",
            "Load balancers of this cluster that no service claims, found by the service controller's last orphan sweep and not deleted (yet: in their grace period, over a sweep's limit, failed, or kept by --load-balancer-orphan-dry-run)",
            orphaned_load_balancers.clone(),
        );
        let orphaned_load_balancers_deleted = Counter::default();
        registry.register(
            "service_controller_orphaned_load_balancers_deleted",
            "Load balancers of this cluster the orphan sweep deleted because no service claimed them for --load-balancer-orphan-grace",
            orphaned_load_balancers_deleted.clone(),
        );
        let route_syncs = Counter::default();
        registry.register(
            "route_controller_route_sync",
            "[ALPHA] A metric counting the amount of times routes have been synced with the cloud provider",
            route_syncs.clone(),
        );
        let webhook_requests = Family::<WebhookLabels, Counter>::default();
        registry.register(
            "cloud_provider_webhook_request",
            "[ALPHA] Number of HTTP requests partitioned by status code.",
            webhook_requests.clone(),
        );
        let webhook_request_duration = Family::<WebhookLabels, Histogram>::new_with_constructor(|| {
            Histogram::new([0.25, 0.5, 0.7, 1.0, 1.5, 3.0, 5.0, 10.0])
        });
        registry.register(
            "cloud_provider_webhook_request_duration_seconds",
            "[ALPHA] Request latency in seconds. Broken down by status code.",
            webhook_request_duration.clone(),
        );
        let build_info = Family::<BuildInfo, Gauge>::default();
        registry.register(
            "kubernetes_build_info",
            "[ALPHA] A metric with a constant '1' value labeled by major, minor, git version, git commit, git tree state, build date, Go version, and compiler from which Kubernetes was built, and platform on which it is running.",
            build_info.clone(),
        );
        let feature_enabled = Family::<FeatureLabels, Gauge>::default();
        registry.register(
            "kubernetes_feature_enabled",
            "[BETA] This metric records the data about the stage and enablement of a k8s feature.",
            feature_enabled.clone(),
        );
        let rest_client_requests = Family::<RestLabels, Counter>::default();
        registry.register(
            "rest_client_requests",
            "Number of HTTP requests, partitioned by status code, method, and host",
            rest_client_requests.clone(),
        );
        let rest_client_request_duration =
            Family::<RestDurationLabels, Histogram>::new_with_constructor(|| {
                Histogram::new(CLIENT_GO_BUCKETS)
            });
        registry.register(
            "rest_client_request_duration_seconds",
            "Request latency in seconds. Broken down by verb, and host",
            rest_client_request_duration.clone(),
        );
        let rest_client_rate_limiter_duration =
            Family::<RestDurationLabels, Histogram>::new_with_constructor(|| {
                Histogram::new(CLIENT_GO_BUCKETS)
            });
        registry.register(
            "rest_client_rate_limiter_duration_seconds",
            "Client side rate limiter latency in seconds. Broken down by verb, and host",
            rest_client_rate_limiter_duration.clone(),
        );
        registry.register_collector(Box::new(crate::process_metrics::ProcessCollector));
        Metrics {
            registry,
            rest_client_requests,
            rest_client_request_duration,
            rest_client_rate_limiter_duration,
            leader_election_master_status,
            running_managed_controllers,
            reconciles,
            reconcile_duration,
            leader_holder_changes,
            leader_lost,
            cloud,
            queue_families,
            queues,
            taint_removal_delay,
            uninitialized_nodes,
            uninterpretable_provider_ids,
            node_deletion_breaker_trips,
            nodes_deleted,
            nodes_awaiting_deletion,
            oldest_uninitialized_node_age,
            initial_node_sync_delay,
            load_balancer_syncs,
            nodesync_errors,
            nodesync_latency,
            update_load_balancer_host_latency,
            orphaned_load_balancers,
            orphaned_load_balancers_deleted,
            route_syncs,
            webhook_requests,
            webhook_request_duration,
            build_info,
            feature_enabled,
        }
    }

    /// An admission request to `webhook` answered with `status` after `elapsed`.
    pub(crate) fn webhook_request(&self, webhook: &str, status: u16, elapsed: Duration) {
        let labels = WebhookLabels {
            code: status.to_string(),
            webhook: webhook.to_owned(),
        };
        self.webhook_requests.get_or_create(&labels).inc();
        self.webhook_request_duration
            .get_or_create(&labels)
            .observe(elapsed.as_secs_f64());
    }

    /// `kubernetes_build_info`: 1, labelled with what this binary is.
    pub fn set_build_info(&self, info: &BuildInfo) {
        self.build_info.clear();
        self.build_info.get_or_create(info).set(1);
    }

    /// `kubernetes_feature_enabled` of a feature gate (`stage`: `ALPHA`, `BETA`, `` for GA, `DEPRECATED`).
    pub fn set_feature(&self, name: &str, stage: &str, enabled: bool) {
        self.feature_enabled
            .get_or_create(&FeatureLabels {
                name: name.to_owned(),
                stage: stage.to_owned(),
            })
            .set(i64::from(enabled));
    }

    /// Every metric, in OpenMetrics text.
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

    /// One request's wait for the client's rate limiter (`--kube-api-qps`, `--kube-api-burst`).
    pub(crate) fn rate_limited(&self, host: &str, method: &str, seconds: f64) {
        self.rest_client_rate_limiter_duration
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

    /// The work queue of controller `name` (made on first use, kept across the controller's restarts).
    pub(crate) fn work_queue(&self, name: &str) -> Arc<WorkQueue> {
        let mut queues = self.queues.lock();
        queues
            .entry(name.to_owned())
            .or_insert_with(|| Arc::new(WorkQueue::new(name, &self.queue_families)))
            .clone()
    }

    /// Names the provider in the cloud families (`cloudprovider_<provider>_…`); the first name set stays.
    /// The process's cloud budget (set once; later calls change nothing).
    pub(crate) fn set_budget(&self, budget: Arc<RateBudget>) {
        let _ = self.cloud.budget.set(budget);
    }

    pub(crate) fn set_provider(&self, provider: &str) {
        let name: String = provider
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() {
                    c.to_ascii_lowercase()
                } else {
                    '_'
                }
            })
            .collect();
        let _ = self.cloud.provider.set(name);
    }
}

#[cfg(test)]
mod tests;
