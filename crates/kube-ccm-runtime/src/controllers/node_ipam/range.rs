//! Upstream's `RangeAllocator`, for route-based clusters (`--cidr-allocator-type=RangeAllocator`): each
//! node gets the next free network of `--node-cidr-mask-size-ipv4` (24 by default) out of the IPv4
//! `--cluster-cidr`, and of `--node-cidr-mask-size-ipv6` (64) out of the IPv6 one when the cluster is dual
//! stack, in the order of `--cluster-cidr`, as `spec.podCIDR`/`spec.podCIDRs`.
//!
//! As upstream: when the controller starts, every node's pod CIDRs are marked taken (one outside the
//! cluster CIDRs is logged and left alone); a node without pod CIDRs gets one of each family, the search
//! going on from after the last one given; a node that is deleted gives its networks back; a full range is
//! the Event `CIDRNotAvailable` (retried), a refused write `CIDRAssignmentFailed` (its networks given
//! back). Networks given to a node whose write the cache has not shown yet are kept for it, so a second
//! look at the node does not give it others.

use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch};
use kube_ccm_provider::Cidr;
use serde_json::json;

use crate::cached_node::CachedNode;
use crate::context::ControllerContext;
use crate::controllers::Backoff;
use crate::runner::{self, Action};
use crate::written::Written;

use super::{NODE_IPAM_CONTROLLER, WORKERS, status_change};

/// The networks of one prefix inside a cluster CIDR, each free or taken (upstream's `CidrSet`).
#[derive(Debug, Clone)]
pub(crate) struct CidrSet {
    cluster: Cidr,
    prefix: u8,
    taken: Vec<bool>,
    /// Where the next search starts (after the last network given).
    next: usize,
}

/// Upstream's limit: at most 2^16 networks in a set.
pub(crate) const MAX_SUBNET_BITS: u8 = 16;

impl CidrSet {
    /// The networks of `prefix` in `cluster`; refused when `prefix` is shorter than the cluster's, longer
    /// than the family's, or makes more than 2^16 networks (upstream's limits).
    pub(crate) fn new(cluster: Cidr, prefix: u8) -> Result<CidrSet, String> {
        let cluster = cluster.network();
        if prefix < cluster.prefix() || prefix > cluster.family_bits() {
            return Err(format!(
                "the node mask size {prefix} does not fit the cluster CIDR {cluster}"
            ));
        }
        if prefix - cluster.prefix() > MAX_SUBNET_BITS {
            return Err(format!(
                "the node mask size {prefix} makes more than 2^{MAX_SUBNET_BITS} networks of the cluster CIDR {cluster}"
            ));
        }
        Ok(CidrSet {
            taken: vec![false; 1usize << (prefix - cluster.prefix())],
            cluster,
            prefix,
            next: 0,
        })
    }

    /// Whether `cidr` is of this set's family.
    pub(crate) fn same_family(&self, cidr: &Cidr) -> bool {
        self.cluster.is_ipv4() == cidr.is_ipv4()
    }

    /// The next free network, taken; `None` when all are.
    pub(crate) fn allocate(&mut self) -> Option<Cidr> {
        let count = self.taken.len();
        let index = (0..count)
            .map(|n| (self.next + n) % count)
            .find(|&i| !self.taken[i])?;
        self.taken[index] = true;
        self.next = (index + 1) % count;
        self.cluster.subnet(self.prefix, index as u128)
    }

    /// Marks the networks `cidr` covers taken; `Err` when it is not inside the cluster CIDR.
    pub(crate) fn occupy(&mut self, cidr: &Cidr) -> Result<(), String> {
        let (first, last) = self.indexes(cidr)?;
        self.taken[first..=last].iter_mut().for_each(|t| *t = true);
        Ok(())
    }

    /// Gives the networks `cidr` covers back.
    pub(crate) fn release(&mut self, cidr: &Cidr) -> Result<(), String> {
        let (first, last) = self.indexes(cidr)?;
        self.taken[first..=last].iter_mut().for_each(|t| *t = false);
        Ok(())
    }

    /// How many networks are taken.
    pub(crate) fn used(&self) -> usize {
        self.taken.iter().filter(|t| **t).count()
    }

    fn indexes(&self, cidr: &Cidr) -> Result<(usize, usize), String> {
        let (first, last) = self
            .cluster
            .subnet_indexes(self.prefix, cidr)
            .ok_or_else(|| format!("{cidr} is not inside the cluster CIDR {}", self.cluster))?;
        Ok((first as usize, last as usize))
    }
}

/// The sets of a cluster, one per `--cluster-cidr`, in its order.
pub(crate) fn sets(cluster_cidrs: &[Cidr], ipv4_mask: u8, ipv6_mask: u8) -> Result<Vec<CidrSet>, String> {
    if cluster_cidrs.is_empty() {
        return Err("--cluster-cidr is empty; the range allocator needs it".to_owned());
    }
    cluster_cidrs
        .iter()
        .map(|c| CidrSet::new(*c, if c.is_ipv4() { ipv4_mask } else { ipv6_mask }))
        .collect()
}

/// The networks to give a node, one from each set; none taken when one set is full.
pub(crate) fn allocate(sets: &mut [CidrSet]) -> Option<Vec<Cidr>> {
    let mut given = Vec::with_capacity(sets.len());
    for index in 0..sets.len() {
        match sets[index].allocate() {
            Some(cidr) => given.push(cidr),
            None => {
                for (set, cidr) in sets.iter_mut().zip(&given) {
                    let _ = set.release(cidr);
                }
                return None;
            }
        }
    }
    Some(given)
}

/// Marks `cidrs` (a node's) taken in the set of each one's family.
pub(crate) fn occupy(sets: &mut [CidrSet], cidrs: &[Cidr]) -> Result<(), String> {
    for cidr in cidrs {
        let set = sets
            .iter_mut()
            .find(|s| s.same_family(cidr))
            .ok_or_else(|| format!("no cluster CIDR of the family of {cidr}"))?;
        set.occupy(cidr)?;
    }
    Ok(())
}

/// Gives `cidrs` back to the sets of their families.
pub(crate) fn release(sets: &mut [CidrSet], cidrs: &[Cidr]) {
    for cidr in cidrs {
        if let Some(set) = sets.iter_mut().find(|s| s.same_family(cidr)) {
            let _ = set.release(cidr);
        }
    }
}

fn node_cidrs(node: &CachedNode) -> Vec<Cidr> {
    node.pod_cidrs().filter_map(|c| c.parse().ok()).collect()
}

#[derive(Debug, thiserror::Error)]
enum RangeError {
    #[error(
        "failed to allocate cidr from cluster cidr: CIDR allocation failed; there are no remaining CIDRs left to allocate in the accepted range"
    )]
    Full,
    #[error("failed to update the node's pod CIDRs: {0}")]
    Spec(#[source] kube::Error),
}

struct Ranges {
    controller: ControllerContext,
    api: Api<Written<Node>>,
    backoff: Backoff,
    sets: Mutex<Vec<CidrSet>>,
    /// Per node (uid), the networks given to it whose write the cache has not shown yet.
    given: Mutex<HashMap<String, Vec<Cidr>>>,
}

/// Runs the range allocator with `sets` until the controller stops.
pub(super) async fn run(controller: ControllerContext, sets: Vec<CidrSet>) {
    let informer = controller.nodes();
    tokio::select! {
        () = controller.stop().cancelled() => return,
        () = informer.ready() => {}
    }
    let mut sets = sets;
    for node in informer.store().state() {
        let cidrs = node_cidrs(&node);
        if let Err(error) = occupy(&mut sets, &cidrs) {
            tracing::error!(controller = NODE_IPAM_CONTROLLER, node = node.name(), %error, "failed to mark the node's pod CIDRs as occupied");
        }
    }
    let used: Vec<usize> = sets.iter().map(CidrSet::used).collect();
    tracing::info!(
        controller = NODE_IPAM_CONTROLLER,
        ?used,
        "allocating pod CIDRs from the cluster CIDRs"
    );
    let context = Arc::new(Ranges {
        api: Api::all(controller.client().clone()),
        backoff: Backoff::per_key(Duration::from_millis(250), Duration::from_secs(300)),
        sets: Mutex::new(sets),
        given: Mutex::default(),
        controller: controller.clone(),
    });
    let forget = tokio::spawn(give_back_deleted(context.clone()));
    controller.set_started();
    let queued = controller.clone();
    let changes = informer
        .subscribe()
        .filter(|node| std::future::ready(!node.deleting()))
        .map(move |node| queued.queue().add(node.name()));
    let (queued, store) = (controller.clone(), informer.store());
    let all = futures::stream::once(async move {
        queued.queue().add_all(
            store
                .state()
                .iter()
                .filter(|n| n.pod_cidrs().next().is_none())
                .map(|n| n.name()),
        );
    });
    controller
        .runner(runner::by_key(informer.store()))
        .concurrency(WORKERS)
        .feed(changes)
        .feed(all)
        .run(controller.stop(), reconcile, error_policy, context)
        .await;
    forget.abort();
}

async fn reconcile(node: Arc<CachedNode>, context: Arc<Ranges>) -> Result<Action, RangeError> {
    if node.deleting() {
        return Ok(Action::await_change());
    }
    let uid = node.uid();
    let current = node_cidrs(&node);
    if !current.is_empty() {
        // Set (by this controller or another): taken, and nothing waits for the cache any more.
        context.given.lock().remove(uid);
        let _ = occupy(&mut context.sets.lock(), &current);
        context.backoff.forget(uid);
        return Ok(Action::await_change());
    }
    if context.given.lock().contains_key(uid) {
        return Ok(Action::await_change());
    }
    let controller = &context.controller;
    let started = Instant::now();
    let Some(cidrs) = allocate(&mut context.sets.lock()) else {
        controller.record_reconcile(false, started.elapsed());
        status_change(controller, &node, "CIDRNotAvailable").await;
        return Err(RangeError::Full);
    };
    context.given.lock().insert(uid.to_owned(), cidrs.clone());
    let texts: Vec<String> = cidrs.iter().map(ToString::to_string).collect();
    let patch = json!({"spec": {"podCIDR": texts[0], "podCIDRs": texts}});
    let outcome = context
        .api
        .patch(node.name(), &crate::written::patch_params(), &Patch::Merge(patch))
        .await;
    controller.record_reconcile(outcome.is_ok(), started.elapsed());
    match outcome {
        Ok(_) => {
            tracing::info!(node = node.name(), cidrs = ?texts, "set the node's pod CIDRs");
            context.backoff.forget(uid);
            Ok(Action::await_change())
        }
        Err(error) => {
            context.given.lock().remove(uid);
            release(&mut context.sets.lock(), &cidrs);
            status_change(controller, &node, "CIDRAssignmentFailed").await;
            Err(RangeError::Spec(error))
        }
    }
}

fn error_policy(node: Arc<CachedNode>, error: &RangeError, context: Arc<Ranges>) -> Action {
    let after = context.backoff.failed(node.uid());
    tracing::warn!(node = node.name(), %error, retry_in = ?after, "node-ipam: cannot allocate");
    Action::requeue(after)
}

/// Gives the networks of deleted nodes back.
async fn give_back_deleted(context: Arc<Ranges>) {
    let mut deletions = std::pin::pin!(context.controller.nodes().deletions());
    while let Some(node) = deletions.next().await {
        let mut cidrs = node_cidrs(&node);
        if let Some(given) = context.given.lock().remove(node.uid())
            && cidrs.is_empty()
        {
            cidrs = given;
        }
        release(&mut context.sets.lock(), &cidrs);
        context.backoff.forget(node.uid());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn cidr(text: &str) -> Cidr {
        text.parse().unwrap()
    }

    #[test]
    fn networks_are_given_in_turn_and_taken_ones_skipped() {
        let mut set = CidrSet::new(cidr("10.64.0.0/22"), 24).unwrap();
        set.occupy(&cidr("10.64.1.0/24")).unwrap();
        assert_eq!(set.allocate().unwrap().to_string(), "10.64.0.0/24");
        assert_eq!(set.allocate().unwrap().to_string(), "10.64.2.0/24");
        assert_eq!(set.allocate().unwrap().to_string(), "10.64.3.0/24");
        assert_eq!(set.allocate(), None);
        set.release(&cidr("10.64.2.0/24")).unwrap();
        assert_eq!(set.allocate().unwrap().to_string(), "10.64.2.0/24");
        assert!(set.occupy(&cidr("10.65.0.0/24")).is_err());
        assert!(CidrSet::new(cidr("10.64.0.0/16"), 8).is_err());
        assert!(CidrSet::new(cidr("10.0.0.0/8"), 25).is_err(), "2^17 networks");
        assert!(CidrSet::new(cidr("10.0.0.0/8"), 33).is_err());
    }

    #[test]
    fn a_dual_stack_node_gets_one_of_each_family_or_none() {
        let mut sets = sets(&[cidr("10.64.0.0/23"), cidr("fd00:10::/63")], 24, 64).unwrap();
        let first = allocate(&mut sets).unwrap();
        assert_eq!(
            first.iter().map(ToString::to_string).collect::<Vec<_>>(),
            ["10.64.0.0/24", "fd00:10::/64"]
        );
        occupy(&mut sets, &[cidr("fd00:10:0:1::/64")]).unwrap();
        assert_eq!(allocate(&mut sets), None, "IPv6 is full: nothing is taken");
        assert_eq!(sets[0].used(), 1, "the IPv4 network went back");
        assert!(super::sets(&[], 24, 64).is_err());
    }

    proptest! {
        /// Whatever the order of allocations, occupations and releases, no two nodes hold one network,
        /// and every network given is inside the cluster CIDR and of the mask size.
        #[test]
        fn never_two_nodes_on_one_range(ops in proptest::collection::vec((0u8..3, 0usize..40), 1..200)) {
            let cluster = cidr("10.64.0.0/26");
            let mut set = CidrSet::new(cluster, 29).unwrap();
            let mut held: Vec<Cidr> = Vec::new();
            for (op, n) in ops {
                match op {
                    0 => {
                        if let Some(given) = set.allocate() {
                            prop_assert!(cluster.contains(&given) && given.prefix() == 29);
                            prop_assert!(!held.iter().any(|h| h.overlaps(&given)), "{given} given twice");
                            held.push(given);
                        } else {
                            prop_assert_eq!(held.len(), 8);
                        }
                    }
                    1 if !held.is_empty() => {
                        let gone = held.remove(n % held.len());
                        set.release(&gone).unwrap();
                    }
                    _ => {
                        // A node found at start with a network: taken from then on.
                        let found = cluster.subnet(29, (n % 8) as u128).unwrap();
                        if !held.contains(&found) {
                            set.occupy(&found).unwrap();
                            held.push(found);
                        }
                    }
                }
                prop_assert_eq!(set.used(), held.len());
            }
        }
    }
}
