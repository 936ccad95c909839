//! External network load balancers for `type: LoadBalancer` services, as upstream's target-pool based
//! `ensureExternalLoadBalancer`, with upstream's names so the in-tree provider's load balancers are adopted:
//!
//! | object | name |
//! |---|---|
//! | forwarding rule, target pool, temporary address | `a` + the service UID without dashes, 32 characters |
//! | firewall for clients | `k8s-fw-<lb>` |
//! | HTTP health check | `k8s-<cluster ID>-node` on kube-proxy's `:10256/healthz` (shared), or `<lb>` on the `healthCheckNodePort` (`externalTrafficPolicy: Local`) |
//! | firewall for health checks | `k8s-<cluster ID>-node-http-hc` or `k8s-<lb>-http-hc` |
//!
//! The cluster ID is upstream's: the ConfigMap `kube-system/ingress-uid` (`provider-uid`, else `uid`),
//! made with a random ID when missing, read when this process starts leading.
//!
//! Each call compares what exists with what is wanted and changes only what differs: the target pool's
//! instances by `addInstance`/`removeInstance`; the pool recreated when its session affinity or health
//! check changes; the forwarding rule recreated when its address, ports or protocol change (or its pool
//! was recreated); firewalls and health checks patched. Without `loadBalancerIP` an address is reserved
//! under the load balancer's name to keep the IP across a recreation, and released once the forwarding
//! rule holds it, as upstream; with it, the IP must be a reserved address or the rule's current one.
//!
//! The decisions are pure functions in `plan.rs` ([`actions`], [`instance_changes`]), table-tested; an
//! ensure reads the rule and the pool, plans, then applies the plan with the Compute calls. What a write
//! decides stays in the apply step: the reserved address's IP (read back after the insert) and whether
//! this ensure reserved it, the health check's link, and a new pool's instances (read back after the
//! insert).

mod plan;

use std::sync::Arc;

use google_cloud_compute_v1::model::{
    self, Address, ForwardingRule, InstanceReference, TargetPool, TargetPoolsAddInstanceRequest,
    TargetPoolsRemoveInstanceRequest,
};
use google_cloud_lro::Poller;
use k8s_openapi::api::core::v1::{LoadBalancerStatus, Node, Service};
use kube_ccm_provider::{CloudError, default_load_balancer_name};

pub use self::plan::{Actions, AddressAction, Plan, actions, condensed_ports, instance_changes, plan};
use super::{deleted, found, inserted, is_internal_rule, service_description};
use crate::client::Attributed as _;
use crate::{GceProvider, WriteError, gce_error};

/// A target pool is created with at most this many instances; the rest are added after.
const POOL_CREATE_INSTANCES: usize = 200;
/// Instances per `addInstance`/`removeInstance`.
const POOL_UPDATE_INSTANCES: usize = 1000;

impl GceProvider {
    async fn get_pool(&self, name: &str) -> Result<Option<TargetPool>, CloudError> {
        found(
            self.clients
                .target_pools
                .get()
                .set_project(self.project())
                .set_region(self.region())
                .set_target_pool(name)
                .attributed()
                .send()
                .await,
            "targetPools.get",
        )
    }

    async fn delete_pool(&self, name: &str) -> Result<(), CloudError> {
        let done = self
            .clients
            .target_pools
            .delete()
            .set_project(self.project())
            .set_region(self.region())
            .set_target_pool(name)
            .attributed()
            .poller()
            .until_done()
            .await;
        deleted(WriteError::check(done), "targetPools.delete")
    }

    /// Adds and removes instances so the pool holds exactly `wanted` ([`instance_changes`]), adds first.
    async fn update_pool(&self, pool: &TargetPool, wanted: &[String]) -> Result<(), CloudError> {
        let name = pool.name.clone().unwrap_or_default();
        let (add, remove) = instance_changes(&pool.instances, wanted);
        let reference = |link: &&str| {
            let mut r = InstanceReference::default();
            r.instance = Some((*link).to_owned());
            r
        };
        for chunk in add.chunks(POOL_UPDATE_INSTANCES) {
            let mut body = TargetPoolsAddInstanceRequest::default();
            body.instances = chunk.iter().map(reference).collect();
            let done = self
                .clients
                .target_pools
                .add_instance()
                .set_project(self.project())
                .set_region(self.region())
                .set_target_pool(&name)
                .set_body(body)
                .attributed()
                .poller()
                .until_done()
                .await;
            WriteError::check(done).map_err(|e| e.into_cloud("targetPools.addInstance"))?;
        }
        for chunk in remove.chunks(POOL_UPDATE_INSTANCES) {
            let mut body = TargetPoolsRemoveInstanceRequest::default();
            body.instances = chunk.iter().map(reference).collect();
            let done = self
                .clients
                .target_pools
                .remove_instance()
                .set_project(self.project())
                .set_region(self.region())
                .set_target_pool(&name)
                .set_body(body)
                .attributed()
                .poller()
                .until_done()
                .await;
            WriteError::check(done).map_err(|e| e.into_cloud("targetPools.removeInstance"))?;
        }
        Ok(())
    }

    /// The IP `action` gives, and whether this call reserved a temporary address for it (to release
    /// afterwards): a requested IP the rule lacks is checked to be reserved; a reservation is read back
    /// for its IP.
    async fn address_for(
        &self,
        plan: &Plan,
        service: &Service,
        action: &AddressAction,
    ) -> Result<(String, bool), CloudError> {
        match action {
            AddressAction::Use(ip) => Ok((ip.clone(), false)),
            AddressAction::CheckReserved(requested) => {
                let reserved = self
                    .clients
                    .addresses
                    .list()
                    .set_project(self.project())
                    .set_region(self.region())
                    .set_filter(format!("address = \"{requested}\""))
                    .attributed()
                    .send()
                    .await
                    .map_err(|e| gce_error("addresses.list", e))?;
                if reserved.items.is_empty() {
                    return Err(CloudError::provider(format!(
                        "requested ip {requested:?} is neither static nor assigned to the LB"
                    )));
                }
                Ok((requested.clone(), false))
            }
            AddressAction::Reserve(rule_ip) => {
                let mut address = Address::default();
                address.name = Some(plan.name.clone());
                address.description = Some(service_description(service));
                address.address = rule_ip.clone();
                address.network_tier = Some(model::address::NetworkTier::from(plan.network_tier.as_str()));
                let done = self
                    .clients
                    .addresses
                    .insert()
                    .set_project(self.project())
                    .set_region(self.region())
                    .set_body(address)
                    .attributed()
                    .poller()
                    .until_done()
                    .await;
                let reserved_now = inserted(WriteError::check(done), "addresses.insert")?;
                Ok((self.address_ip(&plan.name).await?, reserved_now))
            }
        }
    }

    /// Makes the target pool with the first [`POOL_CREATE_INSTANCES`] instances and `health_check`, and
    /// reads it back: what it holds decides the instances still to add.
    async fn make_pool(
        &self,
        plan: &Plan,
        instances: &[String],
        health_check: String,
    ) -> Result<TargetPool, CloudError> {
        let mut wanted = TargetPool::default();
        wanted.name = Some(plan.name.clone());
        wanted.description = Some(plan.description.clone());
        wanted.instances = instances.iter().take(POOL_CREATE_INSTANCES).cloned().collect();
        wanted.health_checks = vec![health_check];
        wanted.session_affinity = Some(model::target_pool::SessionAffinity::from(
            plan.session_affinity.as_str(),
        ));
        let done = self
            .clients
            .target_pools
            .insert()
            .set_project(self.project())
            .set_region(self.region())
            .set_body(wanted)
            .attributed()
            .poller()
            .until_done()
            .await;
        inserted(WriteError::check(done), "targetPools.insert")?;
        self.get_pool(&plan.name).await?.ok_or_else(|| {
            CloudError::provider(format!("target pool {} vanished after it was made", plan.name))
        })
    }

    /// Makes the forwarding rule: `ip`, the plan's protocol and port range, to the target pool.
    async fn make_rule(&self, plan: &Plan, ip: &str) -> Result<(), CloudError> {
        let mut wanted = ForwardingRule::default();
        wanted.name = Some(plan.name.clone());
        wanted.description = Some(plan.description.clone());
        wanted.ip_address = Some(ip.to_owned());
        wanted.ip_protocol = Some(model::forwarding_rule::IPProtocol::from(plan.protocol.as_str()));
        wanted.port_range = Some(plan.port_range.clone());
        wanted.target = Some(format!(
            "https://www.googleapis.com/compute/v1/projects/{}/regions/{}/targetPools/{}",
            self.project(),
            self.region(),
            plan.name
        ));
        wanted.network_tier = Some(model::forwarding_rule::NetworkTier::from(
            plan.network_tier.as_str(),
        ));
        self.insert_rule(wanted).await.map(drop)
    }

    /// Ensures the service's external load balancer: reads the rule (an internal load balancer's is
    /// taken down first) and the pool, plans with [`actions`], and applies the plan in upstream's order:
    /// the address, the clients' firewall, the deletions, the health check's firewall and the health
    /// check, the pool and its instances, the rule, the temporary address released.
    pub(super) async fn ensure_external(
        &self,
        service: &Service,
        nodes: &[Arc<Node>],
    ) -> Result<LoadBalancerStatus, CloudError> {
        let cluster_id = self.load_cluster_id().await?;
        let plan = plan(service, &cluster_id)?;
        let (instances, vms) = self.node_instances(nodes).await?;
        let tags = self.target_tags(&vms)?;
        let mut rule = self.get_rule(&plan.name).await?;
        if rule.as_ref().is_some_and(is_internal_rule) {
            // The service had an internal load balancer: it goes first.
            self.delete_internal(service).await?;
            rule = None;
        }
        let pool = self.get_pool(&plan.name).await?;
        let actions = actions(&plan, rule.as_ref(), pool.as_ref(), self.project());
        let (ip, reserved_now) = self.address_for(&plan, service, &actions.address).await?;
        let fw = self.firewall(
            plan.client_firewall(),
            plan.firewall_description(&ip),
            plan.source_ranges.clone(),
            Some(&ip),
            (&plan.protocol, plan.ports.clone()),
            tags.clone(),
        )?;
        self.ensure_firewall(fw).await?;

        if actions.delete_rule {
            self.delete_rule(&plan.name).await?;
        }
        if actions.delete_pool {
            self.delete_pool(&plan.name).await?;
        }
        for (old_check, firewall) in &actions.delete_health_checks {
            self.delete_health_check(old_check, firewall).await?;
        }

        let (hc_name, hc_port) = &plan.health_check;
        let hc_fw = self.firewall(
            plan.health_check_firewall(&cluster_id),
            plan.health_check_firewall_description(&cluster_id, &ip),
            self.load_balancer_source_ranges(),
            Some(&ip),
            ("TCP", vec![hc_port.to_string()]),
            tags,
        )?;
        self.ensure_firewall(hc_fw).await?;
        let hc_link = self.ensure_health_check(hc_name, *hc_port).await?;

        let pool = match pool.filter(|_| !actions.make_pool) {
            Some(pool) => pool,
            None => self.make_pool(&plan, &instances, hc_link).await?,
        };
        self.update_pool(&pool, &instances).await?;
        if actions.make_rule {
            self.make_rule(&plan, &ip).await?;
        }
        // The rule holds the IP now: the temporary reservation goes, as upstream; so does one this ensure
        // made for a rule that stayed (never with `loadBalancerIP`: nothing is reserved then).
        if actions.release_address || reserved_now {
            self.delete_address(&plan.name).await?;
        }
        Ok(super::passthrough(ip))
    }

    pub(super) async fn update_external(
        &self,
        service: &Service,
        nodes: &[Arc<Node>],
    ) -> Result<(), CloudError> {
        let name = default_load_balancer_name(service);
        let (instances, _) = self.node_instances(nodes).await?;
        let pool = self
            .get_pool(&name)
            .await?
            .ok_or_else(|| CloudError::provider(format!("target pool {name} does not exist")))?;
        self.update_pool(&pool, &instances).await
    }

    pub(super) async fn delete_external(&self, service: &Service) -> Result<(), CloudError> {
        self.delete_external_parts(service, true).await
    }

    /// [`Self::delete_external`]; with `shared: false` the cluster's shared health check is left alone
    /// (the orphan sweep's delete: another deleter of shared parts would race the ensures that make them).
    pub(super) async fn delete_external_parts(
        &self,
        service: &Service,
        shared: bool,
    ) -> Result<(), CloudError> {
        let name = default_load_balancer_name(service);
        self.delete_firewall(&format!("k8s-fw-{name}")).await?;
        self.delete_address(&name).await?;
        self.delete_rule(&name).await?;
        self.delete_pool(&name).await?;
        let local = found(
            self.clients
                .http_health_checks
                .get()
                .set_project(self.project())
                .set_http_health_check(&name)
                .attributed()
                .send()
                .await,
            "httpHealthChecks.get",
        )?
        .is_some();
        self.delete_health_check(&name, &format!("k8s-{name}-http-hc"))
            .await?;
        if let (false, true, Ok(cluster_id)) = (local, shared, self.load_cluster_id().await) {
            self.delete_health_check(
                &format!("k8s-{cluster_id}-node"),
                &format!("k8s-{cluster_id}-node-http-hc"),
            )
            .await?;
        }
        Ok(())
    }
}
