//! A test double of the Compute Engine REST API (`compute/v1`), for the GCE provider's tests and demo.
//!
//! Google ships no Compute Engine emulator, so this serves exactly the endpoints the provider calls, over
//! real HTTP on 127.0.0.1:
//!
//! - instances: `get`, `list` and `aggregatedList` (seeded by the test: [`ComputeDouble::put_instance`]);
//! - routes, firewalls and HTTP health checks (global), target pools, forwarding rules and addresses
//!   (regional, with `aggregatedList`): `get`, `list`, `insert`, `delete`; `patch` and `update` of
//!   firewalls and health checks; the target pools' `addInstance`/`removeInstance`;
//! - subnetworks (regional): `get` and `list` of those the test seeds ([`ComputeDouble::put`]);
//! - Compute's own refusals: a name taken (409), a health check a target pool uses (400
//!   `resourceInUseByAnotherResource`), an IPv6 forwarding rule to a target pool, in the Standard tier, or
//!   in a subnet without an IPv6 range of its scheme's access type (400); and a route whose next-hop
//!   instance is gone carries the `NEXT_HOP_INSTANCE_NOT_FOUND` warning;
//! - an IPv6 forwarding rule made without an address gets a `/96` of its subnet's range, in that CIDR
//!   form;
//! - long-running operations: every write answers with an operation that is `PENDING` until it has been
//!   polled [`ComputeDouble::set_operation_polls`] times, then `DONE`, and only then takes effect; `get`
//!   and `wait` on `global`, `regions/R` and `zones/Z` operations;
//! - `list` filters of one clause (`name eq "RE2"`, `name = "x"`, also `!=`/`ne`), `maxResults` and
//!   `pageToken` paging; 404 `notFound`, 409 `alreadyExists` and 400 `invalid` as Compute answers them.
//!
//! **Shapes cannot drift**: every body read and every body written goes through `google-cloud-compute-v1`'s
//! own model types (the ones the provider deserialises), and `gcloud` is pointed at the double in this
//! repository's tests as a second, independent client.
//!
//! The metadata server's values the provider reads (`/computeMetadata/v1/project/project-id`,
//! `…/instance/zone`), set by [`ComputeDouble::set_metadata`].
//!
//! Fault and latency knobs: [`ComputeDouble::fail_requests`] (an HTTP error for matching requests: 429
//! `rateLimitExceeded`, 500, …), [`ComputeDouble::fail_operations`] (operations that end `DONE` with an
//! error), [`ComputeDouble::set_latency`], [`ComputeDouble::set_rate_limit`] (a project's rate quota). [`ComputeDouble::requests`] lists what was asked, in order;
//! [`ComputeDouble::writes`] every write with its `User-Agent` (the GCE provider names the calling
//! controller there), for an audit of who changed the cloud when.

mod resources;
mod server;

use parking_lot::{Mutex, MutexGuard};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use google_cloud_compute_v1::model;
use tokio_util::sync::CancellationToken;

pub use resources::Collection;
use resources::State;

/// A running double; stops when dropped.
pub struct ComputeDouble {
    addr: SocketAddr,
    state: Arc<Mutex<State>>,
    stop: CancellationToken,
}

impl std::fmt::Debug for ComputeDouble {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ComputeDouble")
            .field("addr", &self.addr)
            .finish_non_exhaustive()
    }
}

/// Requests that fail with an HTTP error instead of being served.
#[derive(Debug, Clone)]
pub struct Fault {
    /// The HTTP method, or any.
    pub method: Option<http::Method>,
    /// A substring of the path (`/global/routes`, `/aggregated/instances`).
    pub path_contains: String,
    /// The HTTP status.
    pub status: u16,
    /// Compute's error reason (`rateLimitExceeded`, `backendError`).
    pub reason: String,
    /// How many requests fail; then the fault is spent.
    pub times: u32,
}

/// A write request (not a `GET`) as the double received it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Write {
    /// When it arrived, microseconds since the epoch.
    pub time_us: i64,
    /// `POST`, `PATCH`, `PUT` or `DELETE`.
    pub method: String,
    /// The path, without the query.
    pub path: String,
    /// Its `User-Agent` (empty when it had none).
    pub user_agent: String,
    /// The HTTP status it was answered with.
    pub status: u16,
}

/// Microseconds since the epoch.
fn now_us() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_micros()).unwrap_or(i64::MAX))
}

impl Drop for ComputeDouble {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

impl ComputeDouble {
    /// Starts a double on a free port of 127.0.0.1.
    pub async fn start() -> std::io::Result<ComputeDouble> {
        ComputeDouble::start_on("127.0.0.1:0".parse().expect("an address")).await
    }

    /// Starts a double on `addr`.
    pub async fn start_on(addr: SocketAddr) -> std::io::Result<ComputeDouble> {
        let listener = tokio::net::TcpListener::bind(addr).await?;
        let addr = listener.local_addr()?;
        let state = Arc::new(Mutex::new(State::new(format!("http://{addr}"))));
        let stop = CancellationToken::new();
        tokio::spawn(server::serve(listener, state.clone(), stop.clone()));
        Ok(ComputeDouble { addr, state, stop })
    }

    /// Where it listens.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The API endpoint, as `gce.conf`'s `api-endpoint` and gcloud's `api_endpoint_overrides/compute`
    /// take it: `http://127.0.0.1:PORT/compute/v1/`.
    pub fn endpoint(&self) -> String {
        format!("http://{}/compute/v1/", self.addr)
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock()
    }

    /// Adds (or replaces) an instance in `project`/`zone`; its `id`, `selfLink`, `zone`, `kind`, `status`
    /// (`RUNNING`) and creation time are filled in where unset.
    pub fn put_instance(&self, project: &str, zone: &str, instance: model::Instance) {
        let value = serde_json::to_value(instance).expect("an instance serialises");
        self.state()
            .put(Collection::Instances, project, &format!("zones/{zone}"), value);
    }

    /// Sets an instance's status (`TERMINATED`, `STOPPED`, …); `false` when there is no such instance.
    pub fn set_instance_status(&self, project: &str, zone: &str, name: &str, status: &str) -> bool {
        self.state().patch(
            Collection::Instances,
            project,
            &format!("zones/{zone}"),
            name,
            |v| {
                v["status"] = status.into();
            },
        )
    }

    /// Deletes an instance (as if it were deleted outside the cluster); `false` when there was none.
    pub fn delete_instance(&self, project: &str, zone: &str, name: &str) -> bool {
        self.state()
            .remove(Collection::Instances, project, &format!("zones/{zone}"), name)
            .is_some()
    }

    /// An instance, if it exists.
    pub fn instance(&self, project: &str, zone: &str, name: &str) -> Option<model::Instance> {
        self.get(Collection::Instances, project, &format!("zones/{zone}"), name)
    }

    /// The project's instances (all zones), by name.
    pub fn instances(&self, project: &str) -> Vec<model::Instance> {
        self.all(Collection::Instances, project)
    }

    /// The project's routes, by name.
    pub fn routes(&self, project: &str) -> Vec<model::Route> {
        self.all(Collection::Routes, project)
    }

    /// The project's firewall rules, by name.
    pub fn firewalls(&self, project: &str) -> Vec<model::Firewall> {
        self.all(Collection::Firewalls, project)
    }

    /// The project's legacy HTTP health checks, by name.
    pub fn http_health_checks(&self, project: &str) -> Vec<model::HttpHealthCheck> {
        self.all(Collection::HttpHealthChecks, project)
    }

    /// The project's target pools (all regions), by name.
    pub fn target_pools(&self, project: &str) -> Vec<model::TargetPool> {
        self.all(Collection::TargetPools, project)
    }

    /// The project's forwarding rules (all regions), by name.
    pub fn forwarding_rules(&self, project: &str) -> Vec<model::ForwardingRule> {
        self.all(Collection::ForwardingRules, project)
    }

    /// The project's reserved addresses (all regions), by name.
    pub fn addresses(&self, project: &str) -> Vec<model::Address> {
        self.all(Collection::Addresses, project)
    }

    /// The project's health checks (global), by name.
    pub fn health_checks(&self, project: &str) -> Vec<model::HealthCheck> {
        self.all(Collection::HealthChecks, project)
    }

    /// The project's backend services (all regions), by name.
    pub fn backend_services(&self, project: &str) -> Vec<model::BackendService> {
        self.all(Collection::BackendServices, project)
    }

    /// The project's instance groups (all zones), by name.
    pub fn instance_groups(&self, project: &str) -> Vec<model::InstanceGroup> {
        self.all(Collection::InstanceGroups, project)
    }

    /// The instances (links, in the order added) of the instance group `name` in `zone`; `None` when the
    /// group does not exist.
    pub fn instance_group_members(&self, project: &str, zone: &str, name: &str) -> Option<Vec<String>> {
        self.state().members(project, &format!("zones/{zone}"), name)
    }

    /// Inserts an unmanaged instance group directly (no operation), holding `members` (instance links),
    /// as if it had been made before the test.
    pub fn put_instance_group(
        &self,
        project: &str,
        zone: &str,
        group: model::InstanceGroup,
        members: &[String],
    ) {
        let value = serde_json::to_value(group).expect("a group serialises");
        let mut state = self.state();
        let name = value["name"].as_str().expect("a group has a name").to_owned();
        let scope = format!("zones/{zone}");
        state.put(Collection::InstanceGroups, project, &scope, value);
        state.set_members(project, &scope, &name, members);
    }

    /// Inserts a resource directly (no operation), as if it had been made before the test: a route, a
    /// firewall, a target pool, … in `scope` (`global`, `regions/R`, `zones/Z`).
    pub fn put<T: serde::Serialize>(&self, collection: Collection, project: &str, scope: &str, resource: T) {
        let value = serde_json::to_value(resource).expect("a resource serialises");
        self.state().put(collection, project, scope, value);
    }

    fn get<T: serde::de::DeserializeOwned>(
        &self,
        collection: Collection,
        project: &str,
        scope: &str,
        name: &str,
    ) -> Option<T> {
        let value = self.state().get(collection, project, scope, name)?;
        Some(serde_json::from_value(value).expect("stored resources are model-shaped"))
    }

    fn all<T: serde::de::DeserializeOwned>(&self, collection: Collection, project: &str) -> Vec<T> {
        self.state()
            .all(collection, project)
            .into_iter()
            .map(|value| serde_json::from_value(value).expect("stored resources are model-shaped"))
            .collect()
    }

    /// How many times an operation is polled `PENDING`/`RUNNING` before it is `DONE` (default 1).
    pub fn set_operation_polls(&self, polls: u32) {
        self.state().operation_polls = polls;
    }

    /// Makes `zone` of `project` unreachable (`reachable: false`) or reachable again: its requests fail
    /// with 503, and aggregated lists leave it out with a scope warning `UNREACHABLE`.
    pub fn set_zone_reachable(&self, project: &str, zone: &str, reachable: bool) {
        let key = (project.to_owned(), zone.to_owned());
        let mut state = self.state();
        if reachable {
            state.unreachable_zones.remove(&key);
        } else {
            state.unreachable_zones.insert(key);
        }
    }

    /// Makes matching requests fail (see [`Fault`]).
    pub fn fail_requests(&self, fault: Fault) {
        self.state().faults.push(fault);
    }

    /// Ends every fault [`ComputeDouble::fail_requests`] set (an outage over).
    pub fn clear_faults(&self) {
        self.state().faults.clear();
    }

    /// Makes the next `times` writes whose path contains `path_contains` end as operations `DONE` with
    /// `http_status` and `code` (`QUOTA_EXCEEDED`, `RESOURCE_NOT_READY`), their effect not applied.
    pub fn fail_operations(&self, path_contains: &str, http_status: u16, code: &str, times: u32) {
        self.state().operation_faults.push(resources::OperationFault {
            path_contains: path_contains.to_owned(),
            http_status,
            code: code.to_owned(),
            times,
        });
    }

    /// Serves `value` at the metadata server's `/computeMetadata/v1/<key>` (`project/project-id`,
    /// `instance/zone`); with this, the double's address is also a metadata server (`GCE_METADATA_HOST`).
    pub fn set_metadata(&self, key: &str, value: &str) {
        self.state().metadata.insert(key.to_owned(), value.to_owned());
    }

    /// Delays every answer by `latency`.
    pub fn set_latency(&self, latency: Duration) {
        self.state().latency = latency;
    }

    /// Refuses requests beyond `per_second` a second (a bucket of one second's requests; Compute counts a
    /// minute's, a second keeps a test short) with 403 `rateLimitExceeded`, as Compute refuses a project
    /// over its rate quota; zero lifts the limit. The metadata server is not limited.
    pub fn set_rate_limit(&self, per_second: f64) {
        self.state().rate_limit = (per_second > 0.0).then(|| kube_ccm_fake::RateLimit::new(per_second));
    }

    /// Requests refused so far for the rate limit ([`ComputeDouble::set_rate_limit`]).
    pub fn throttled(&self) -> u64 {
        self.state().throttled
    }

    /// Every request so far, `METHOD /path` without the query, in order.
    pub fn requests(&self) -> Vec<String> {
        self.state().log.clone()
    }

    /// Every write request so far (inserts, deletes, patches, updates, target-pool membership), in order of
    /// arrival.
    pub fn writes(&self) -> Vec<Write> {
        self.state().writes.clone()
    }

    /// How many requests so far started with `prefix` (`GET /compute/v1/projects/p/aggregated/instances`).
    pub fn count(&self, prefix: &str) -> usize {
        self.state().log.iter().filter(|r| r.starts_with(prefix)).count()
    }
}
