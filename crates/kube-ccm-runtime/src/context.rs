//! What a running controller gets, whoever registered it.

use std::any::Any;
use std::sync::Arc;
use std::time::Duration;

use crate::cached::Referable;
use k8s_openapi::api::core::v1::{ObjectReference, Service};
use kube_ccm_leadermigration::ControllerName;
use kube_ccm_provider::{CallContext, CloudProvider, Priority};
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::cached_node::CachedNode;
use crate::compact::Compact;
use crate::config::ControllerSettings;
use crate::events::{EventRecorder, EventType};
use crate::informers::{Informer, Informers};
use crate::metrics::Metrics;
use crate::runner::Runner;
use crate::transport::Fence;
use crate::workqueue::{WorkQueue, Working};

/// A running controller's world: its own client, the provider, the shared caches, its Event recorder,
/// and the signals to start and stop by.
///
/// The client names the controller in its `User-Agent` and, when the controller runs under a lock, is
/// fenced on it: once the lock's `valid_until` passes, writes fail locally.
#[derive(Clone)]
pub struct ControllerContext {
    pub(crate) name: ControllerName,
    pub(crate) client: kube::Client,
    pub(crate) provider: Arc<dyn CloudProvider>,
    pub(crate) informers: Arc<Informers>,
    pub(crate) settings: Arc<ControllerSettings>,
    pub(crate) metrics: Arc<Metrics>,
    pub(crate) recorder: Arc<EventRecorder>,
    pub(crate) stop: CancellationToken,
    pub(crate) started: Arc<watch::Sender<bool>>,
    /// The lock the controller runs under (none without leader election).
    pub(crate) fence: Option<Fence>,
    /// That lock's Lease name (empty without leader election), for traces.
    pub(crate) lease: Arc<str>,
    /// The controller's `User-Agent` (component, version, identity, controller), naming the caller of cloud
    /// calls so a cloud's logs can be judged against lock tenures as the API server's are.
    pub(crate) caller: Arc<str>,
    /// The controller's work queue (as its metrics see it), and its work in progress, for the `stuck`
    /// health verdict.
    pub(crate) queue: Arc<WorkQueue>,
}

impl ControllerContext {
    /// The controller's canonical name.
    pub fn name(&self) -> ControllerName {
        self.name
    }

    /// The controller's own Kubernetes client (its `User-Agent`, rate limit, and fence).
    pub fn client(&self) -> &kube::Client {
        &self.client
    }

    /// The cloud provider.
    pub fn provider(&self) -> &Arc<dyn CloudProvider> {
        &self.provider
    }

    /// The cloud provider as its concrete type, for a provider's own controllers.
    pub fn provider_as<P: CloudProvider>(&self) -> Option<Arc<P>> {
        let any: Arc<dyn Any + Send + Sync> = self.provider.clone();
        any.downcast::<P>().ok()
    }

    /// The manager's controller settings (upstream's flags).
    pub fn settings(&self) -> &ControllerSettings {
        &self.settings
    }

    /// The shared node cache (its watch starts on first use).
    pub fn nodes(&self) -> &Informer<CachedNode> {
        self.informers.nodes()
    }

    /// The shared service cache (its watch starts on first use).
    pub fn services(&self) -> &Informer<Compact<Service>> {
        self.informers.services()
    }

    /// Fires when the controller must stop; its task then returns promptly.
    pub fn stop(&self) -> &CancellationToken {
        &self.stop
    }

    /// The context for one cloud call: its deadline is the call timeout from now, and never later than the
    /// validity of the lock this controller runs under, read live (a renewal while the call runs lets it go
    /// on; a process that lost its lock cannot go on acting on the cloud); it is cancelled when the
    /// controller stops. Its requests take their turns from the process's cloud budget at `reconcile`
    /// priority ([`Self::call_context_at`] for another).
    pub fn call_context(&self) -> CallContext {
        self.call_context_at(Priority::Reconcile)
    }

    /// [`Self::call_context`], its requests at `priority` in the process's cloud budget (the node
    /// controller's: initialising before refreshing).
    pub fn call_context_at(&self, priority: Priority) -> CallContext {
        let deadline = Instant::now() + self.settings.cloud_call_timeout;
        let mut cx = CallContext::new(deadline, self.stop.clone(), &self.caller)
            .with_observer(self.metrics.cloud.clone());
        if let Some(budget) = self.metrics.cloud.budget() {
            cx = cx.with_budget(budget, priority);
        }
        match &self.fence {
            Some(fence) => cx.with_lock(Arc::new(fence.clone())),
            None => cx,
        }
    }

    /// Marks one periodic pass as in progress until the returned guard is dropped. A unit of work running
    /// far longer than every call in it could (see `--cloud-call-timeout`) turns the controller's health
    /// check red: it is stuck.
    pub fn working(&self) -> Working {
        self.queue.start(None)
    }

    /// Marks the sync of `key` as in progress until the returned guard is dropped (as [`Self::working`]),
    /// and takes it off the work queue ([`Self::queue`]).
    pub fn working_on(&self, key: &str) -> Working {
        self.queue.start(Some(key))
    }

    /// The span of one reconcile of `key` (`reconcile`, with the controller, the object and the Lease the
    /// controller runs under): run the sync in it, and its cloud calls and API requests are its children.
    pub fn reconcile_span(&self, key: &str) -> tracing::Span {
        tracing::info_span!(
            "reconcile",
            controller = %self.name,
            object = key,
            lease = %self.lease
        )
    }

    /// The controller's work queue (client-go's `workqueue_*` metrics count it): add what schedules a sync
    /// ([`WorkQueue::add`], [`WorkQueue::add_after`]). A controller run by [`Self::runner`] is handed its
    /// keys from it; one with its own loop starts each sync with [`Self::working_on`].
    pub fn queue(&self) -> &WorkQueue {
        &self.queue
    }

    /// The controller's loop over its work queue: reconciles the object `lookup` finds for each key
    /// ([`crate::runner::by_key`] over an informer's cache); give it its feeds and run it.
    pub fn runner<K: Send + Sync + 'static>(
        &self,
        lookup: impl Fn(&str) -> Option<Arc<K>> + Send + Sync + 'static,
    ) -> Runner<K> {
        Runner::new(self.queue.clone(), lookup)
    }

    /// Tells readiness the controller is working (its caches are synced).
    pub fn set_started(&self) {
        self.started.send_replace(true);
    }

    /// Records one reconciliation's outcome and duration (`controller_reconciles_total`,
    /// `controller_reconcile_duration_seconds`).
    pub fn record_reconcile(&self, ok: bool, duration: Duration) {
        self.metrics
            .reconciled(self.name.as_str(), ok, duration.as_secs_f64());
    }

    /// Records an Event about `about`, reported by this controller (upstream's reporter name) and process,
    /// in core/v1 as upstream's managers record them (`events.rs`). A message longer than 1024 bytes
    /// is cut. Returns once the Event is queued: one background task writes this controller's Events in
    /// order, as client-go's broadcaster (a sync never waits for the API server to take them; past 1,000
    /// waiting, new ones are dropped). Failures are logged: an Event is never worth failing a sync.
    pub async fn event(
        &self,
        about: &ObjectReference,
        kind: EventType,
        reason: &str,
        action: &str,
        note: String,
    ) {
        self.recorder.record(about, kind, reason, action, note).await;
    }
}

/// A reference to `object` for Events: without the resourceVersion, so that an Event repeated about an
/// object that changed in between is one Event with a series, as client-go's correlator makes it, not a new
/// Event per version.
pub fn event_reference<K: Referable + ?Sized>(object: &K) -> ObjectReference {
    object.event_reference()
}
