//! The cluster and the cloud, compared: what is left to do, and what was left behind.

use std::collections::{BTreeMap, BTreeSet};

use anyhow::{Result, bail};
use k8s_openapi::api::core::v1::{Node, Service};
use kube::api::{Api, ListParams};
use kube_ccm_fake::{AdminRequest, CloudResponse, FakeCloudClient};

use super::faults::cloud_call;

/// The cluster and the cloud, compared.
pub(super) struct State {
    pub(super) nodes: usize,
    pub(super) uninitialized: Vec<String>,
    pub(super) retired_left: Vec<String>,
    /// Nodes the run made and never retired that are gone: deleted though their instances exist.
    pub(super) wrongly_deleted: Vec<String>,
    /// `namespace/name` of every LoadBalancer service.
    pub(super) wanted: BTreeSet<String>,
    /// `(service, load balancer)` of each load balancer whose service is gone.
    pub(super) orphaned: Vec<(String, String)>,
    /// `(service, load balancer)` of each load balancer beyond the first of a service: one service, one
    /// load balancer; a second is a leak.
    pub(super) duplicated: Vec<(String, String)>,
    /// Services being deleted whose load balancer is still there: their controller's work in progress.
    pub(super) undeleted: Vec<String>,
    pub(super) missing: Vec<String>,
}

fn name(service: &Service) -> String {
    format!("default/{}", service.metadata.name.as_deref().unwrap_or_default())
}

impl State {
    pub(super) async fn read(
        nodes: &Api<Node>,
        services: &Api<Service>,
        cloud: &FakeCloudClient,
        retired: &BTreeSet<String>,
        created: u32,
    ) -> Result<State> {
        let node_list = nodes.list(&ListParams::default()).await?.items;
        let names = |n: &Node| n.metadata.name.clone().unwrap_or_default();
        let present: BTreeSet<String> = node_list.iter().map(names).collect();
        let wrongly_deleted = (0..created)
            .map(|i| format!("node-{i}"))
            .filter(|n| !retired.contains(n) && !present.contains(n))
            .collect();
        let uninitialized = node_list
            .iter()
            .filter(|n| !retired.contains(&names(n)) && !harness::initialized(n))
            .map(names)
            .collect();
        let retired_left = node_list
            .iter()
            .map(names)
            .filter(|n| retired.contains(n))
            .collect();
        let mut service_list = services.list(&ListParams::default()).await?.items;
        let present: BTreeSet<String> = service_list.iter().map(name).collect();
        service_list.retain(harness::is_load_balancer);
        let wanted: BTreeSet<String> = service_list
            .iter()
            .filter(|s| s.metadata.deletion_timestamp.is_none())
            .map(name)
            .collect();
        let served: BTreeSet<String> = service_list
            .iter()
            .filter(|s| s.metadata.deletion_timestamp.is_none() && harness::has_ingress(s))
            .map(name)
            .collect();
        // service -> its load balancers' names
        let mut load_balancers: BTreeMap<String, Vec<String>> = BTreeMap::new();
        match cloud_call(cloud, AdminRequest::Snapshot).await? {
            CloudResponse::Snapshot {
                load_balancers: listed,
                ..
            } => {
                for lb in listed {
                    load_balancers.entry(lb.service).or_default().push(lb.name);
                }
            }
            other => bail!("unexpected snapshot answer {other:?}"),
        }
        let (mut orphaned, mut duplicated, mut undeleted) = (Vec::new(), Vec::new(), Vec::new());
        for (service, names) in &load_balancers {
            let pairs = names.iter().map(|lb| (service.clone(), lb.clone()));
            if wanted.contains(service) {
                duplicated.extend(pairs.skip(1));
            } else if present.contains(service) {
                undeleted.push(service.clone());
            } else {
                orphaned.extend(pairs);
            }
        }
        Ok(State {
            nodes: node_list.len(),
            uninitialized,
            retired_left,
            wrongly_deleted,
            orphaned,
            duplicated,
            undeleted,
            missing: wanted
                .iter()
                .filter(|s| !load_balancers.contains_key(*s) || !served.contains(*s))
                .cloned()
                .collect(),
            wanted,
        })
    }

    /// Nothing left to do.
    pub(super) fn converged(&self) -> bool {
        self.orphaned.is_empty() && self.converged_but_for_orphans()
    }

    /// Nothing left to do but load balancers whose service is gone. Ours deletes one it ensured for a
    /// service deleted without its finalizer, so the run waits for them until its deadline; what is left
    /// then is judged by who created it (`orphans.rs`).
    pub(super) fn converged_but_for_orphans(&self) -> bool {
        self.uninitialized.is_empty()
            && self.retired_left.is_empty()
            && self.undeleted.is_empty()
            && self.missing.is_empty()
            && self.duplicated.is_empty()
    }
}
