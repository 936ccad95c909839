//! The contract checks: what the controllers rely on, asked of the provider call by call.
//!
//! Each check starts from a fresh [`Fixture`], makes what it needs (instances, services), asks the
//! provider, and compares the answers with what the cloud holds as the fixture reads it. Waits for the
//! cloud (eventual consistency) are bounded by [`SETTLE`]; the deadline checks, which watch that a late
//! write does *not* land, watch for a fixed window ([`WATCH`]), the one place a fixed wait is the test.
//!
//! Rooms: `lookups.rs` (instances and provider IDs), `balancers.rs` (load balancers), `routing.rs`
//! (routes), `deadlines.rs` (calls abandoned at their deadline or cancelled); here, what they share. The
//! list of every check, of all three suites, is [`crate::CHECKS`].

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{LoadBalancerStatus, Node, Service};
use kube_ccm_provider::{CallContext, CloudError, CloudProvider, InstancesV2, LoadBalancer, Route, Routes};
use tokio_util::sync::CancellationToken;

use crate::{Capability, CloudLoadBalancer, CloudRoute, Failure, Fixture, NOT_APPLICABLE};

mod balancers;
mod deadlines;
mod lookups;
mod routing;

pub use balancers::*;
pub use deadlines::*;
pub use lookups::*;
pub use routing::*;

/// How long the cloud may take to show a change (a stopped instance reported stopped, say).
pub const SETTLE: Duration = Duration::from_secs(30);

/// Each call's deadline in the checks that do not test deadlines.
const CALL: Duration = Duration::from_secs(30);

pub(crate) fn cx() -> CallContext {
    CallContext::new(
        tokio::time::Instant::now() + CALL,
        CancellationToken::new(),
        "conformance",
    )
}

pub(crate) fn fail<T>(message: impl Into<String>) -> Result<T, Failure> {
    Err(Failure(message.into()))
}

pub(crate) fn ensure(condition: bool, message: impl FnOnce() -> String) -> Result<(), Failure> {
    if condition {
        Ok(())
    } else {
        Err(Failure(message()))
    }
}

pub(crate) fn answer<T>(what: &str, outcome: Result<T, CloudError>) -> Result<T, Failure> {
    outcome.map_err(|e| Failure(format!("{what}: the provider failed: {e}")))
}

/// Polls `probe` for at most [`SETTLE`] until it answers `Ok(Ok(value))`; `Ok(Err(seen))` means not yet
/// (the failure names `what` and the last thing seen), `Err` fails at once.
pub(crate) async fn eventually<T, F>(what: &str, probe: impl FnMut() -> F) -> Result<T, Failure>
where
    F: Future<Output = Result<Result<T, String>, Failure>>,
{
    eventually_within(SETTLE, what, probe).await
}

/// [`eventually`], for at most `limit`.
pub(crate) async fn eventually_within<T, F>(
    limit: Duration,
    what: &str,
    mut probe: impl FnMut() -> F,
) -> Result<T, Failure>
where
    F: Future<Output = Result<Result<T, String>, Failure>>,
{
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        let seen = match probe().await? {
            Ok(value) => return Ok(value),
            Err(seen) => seen,
        };
        if tokio::time::Instant::now() >= deadline {
            return fail(format!("{what}: not so within {limit:?}; last seen: {seen}"));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// For [`eventually`]: whether the provider answered `want`, or what it answered instead.
fn is<T: PartialEq + std::fmt::Debug>(answer: Result<T, CloudError>, want: T) -> Result<(), String> {
    match answer {
        Ok(value) if value == want => Ok(()),
        other => Err(format!("{other:?}")),
    }
}

pub(crate) fn instances(provider: &dyn CloudProvider) -> Result<&dyn InstancesV2, Failure> {
    provider.instances_v2().ok_or_else(|| {
        Failure(
            "the provider has no InstancesV2 (CloudProvider::instances_v2 is None): the node controllers need it"
                .into(),
        )
    })
}

/// `capability` of the provider: `Some` when it has it; an error saying "not applicable" when it lacks it
/// as the fixture declares; a failure when the two disagree.
fn capability<'p, T: ?Sized>(
    fixture: &dyn Fixture,
    capability: Capability,
    found: Option<&'p T>,
    needed_by: &str,
) -> Result<&'p T, Failure> {
    let declared = fixture.lacks().contains(&capability);
    match (found, declared) {
        (Some(found), false) => Ok(found),
        (None, true) => Err(Failure(format!(
            "{NOT_APPLICABLE}the provider has no {capability:?}, as its fixture declares"
        ))),
        (None, false) => fail(format!(
            "the provider has no {capability:?} (None from CloudProvider): the {needed_by} needs it; if that is meant, list it in Fixture::lacks"
        )),
        (Some(_), true) => fail(format!(
            "the fixture declares that the provider lacks {capability:?}, but it has it"
        )),
    }
}

pub(crate) fn load_balancer<'p>(
    fixture: &dyn Fixture,
    provider: &'p dyn CloudProvider,
) -> Result<&'p dyn LoadBalancer, Failure> {
    capability(
        fixture,
        Capability::LoadBalancer,
        provider.load_balancer(),
        "service controller",
    )
}

pub(crate) fn routes<'p>(
    fixture: &dyn Fixture,
    provider: &'p dyn CloudProvider,
) -> Result<&'p dyn Routes, Failure> {
    capability(fixture, Capability::Routes, provider.routes(), "route controller")
}

/// `node` as the cloud-node controller leaves it: with the provider ID the cloud gave.
fn initialised(node: &Node, provider_id: &str) -> Node {
    let mut node = node.clone();
    node.spec.get_or_insert_with(Default::default).provider_id = Some(provider_id.to_owned());
    node
}

pub(crate) fn name_of(node: &Node) -> String {
    node.metadata.name.clone().unwrap_or_default()
}

/// Launches an instance for node `name` and returns the node as registered and as initialised.
async fn launched(
    fixture: &dyn Fixture,
    provider: &dyn CloudProvider,
    name: &str,
) -> Result<(Node, Node), Failure> {
    let node = fixture.launch(name).await?;
    let instances = instances(provider)?;
    let metadata = eventually(
        &format!("instance_metadata of the new instance of {name} answers"),
        || async {
            Ok(instances
                .instance_metadata(&cx(), &node)
                .await
                .map_err(|e| e.to_string()))
        },
    )
    .await?;
    ensure(!metadata.provider_id.is_empty(), || {
        format!("instance_metadata of {name} has no provider ID: the node would stay tainted")
    })?;
    let init = initialised(&node, &metadata.provider_id);
    Ok((node, init))
}

/// A `type: LoadBalancer` service with a fresh UID.
fn service(name: &str) -> Service {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": name, "namespace": "conformance", "uid": uuid::Uuid::new_v4().to_string()},
        "spec": {
            "type": "LoadBalancer",
            "selector": {"app": name},
            "ports": [{"name": "http", "protocol": "TCP", "port": 80, "targetPort": 8080, "nodePort": 30080}],
            "externalTrafficPolicy": "Cluster",
        },
    }))
    .expect("a valid Service")
}

fn arcs(nodes: &[&Node]) -> Vec<Arc<Node>> {
    nodes.iter().map(|n| Arc::new((*n).clone())).collect()
}

fn names(nodes: &[&Node]) -> Vec<String> {
    let mut names: Vec<String> = nodes.iter().map(|n| name_of(n)).collect();
    names.sort();
    names
}

/// The load balancer the cloud holds for `service`, if any; more than one is a failure.
async fn cloud_load_balancer(
    fixture: &dyn Fixture,
    lb: &dyn LoadBalancer,
    service: &Service,
) -> Result<Option<CloudLoadBalancer>, Failure> {
    let name = lb.load_balancer_name(fixture.cluster_name(), service);
    let all = fixture.load_balancers().await?;
    let mut mine: Vec<CloudLoadBalancer> = all.iter().filter(|l| l.name == name).cloned().collect();
    ensure(mine.len() <= 1, || {
        format!(
            "the cloud holds {} load balancers named {name}: {mine:?}",
            mine.len()
        )
    })?;
    Ok(mine.pop())
}

pub(crate) fn has_address(status: &LoadBalancerStatus) -> bool {
    status.ingress.iter().flatten().any(|i| {
        i.ip.as_deref().is_some_and(|s| !s.is_empty()) || i.hostname.as_deref().is_some_and(|s| !s.is_empty())
    })
}
