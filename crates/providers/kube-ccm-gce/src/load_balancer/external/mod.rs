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

mod plan;

use std::collections::BTreeSet;
use std::sync::Arc;

use google_cloud_compute_v1::model::{
    self, Address, ForwardingRule, InstanceReference, TargetPool, TargetPoolsAddInstanceRequest,
    TargetPoolsRemoveInstanceRequest,
};
use google_cloud_lro::Poller;
use k8s_openapi::api::core::v1::{LoadBalancerIngress, LoadBalancerStatus, Node, Service};
use kube_ccm_provider::{CloudError, default_load_balancer_name};

pub use self::plan::{Plan, condensed_ports, plan};
use super::{deleted, found, inserted, is_internal_rule, link_path, service_description};
use crate::client::Attributed as _;
use crate::{GceProvider, WriteError, gce_error, last_component};

/// A target pool is created with at most this many instances; the rest are added after.
const POOL_CREATE_INSTANCES: usize = 200;
/// Instances per `addInstance`/`removeInstance`.
const POOL_UPDATE_INSTANCES: usize = 1000;

/// The firewalls' description: `{"kubernetes.io/service-name":"ns/name", "kubernetes.io/service-ip":"IP"}`
/// (upstream's, space included).
fn firewall_description(plan: &Plan, ip: &str) -> String {
    format!(
        "{{\"kubernetes.io/service-name\":\"{}\", \"kubernetes.io/service-ip\":\"{ip}\"}}",
        plan.service
    )
}

impl GceProvider {
    fn health_check_firewall(&self, plan: &Plan, cluster_id: &str) -> String {
        if plan.local {
            format!("k8s-{}-http-hc", plan.name)
        } else {
            format!("k8s-{cluster_id}-node-http-hc")
        }
    }

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

    /// Adds and removes instances so the pool holds exactly `wanted`.
    async fn update_pool(&self, pool: &TargetPool, wanted: &[String]) -> Result<(), CloudError> {
        let name = pool.name.clone().unwrap_or_default();
        let have: BTreeSet<&str> = pool.instances.iter().map(|i| link_path(i)).collect();
        let want: BTreeSet<&str> = wanted.iter().map(|i| link_path(i)).collect();
        let reference = |link: &&str| {
            let mut r = InstanceReference::default();
            r.instance = Some((*link).to_owned());
            r
        };
        let add: Vec<&str> = want.difference(&have).copied().collect();
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
        let remove: Vec<&str> = have.difference(&want).copied().collect();
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

    /// The IP to use, and whether a temporary address was reserved for it (to release afterwards).
    async fn address_for(
        &self,
        plan: &Plan,
        service: &Service,
        rule: Option<&ForwardingRule>,
    ) -> Result<(String, bool), CloudError> {
        let rule_ip = rule.and_then(|r| r.ip_address.clone());
        if let Some(requested) = &plan.requested_ip {
            if rule_ip.as_deref() == Some(requested.as_str()) {
                return Ok((requested.clone(), false));
            }
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
            return Ok((requested.clone(), false));
        }
        let mut address = Address::default();
        address.name = Some(plan.name.clone());
        address.description = Some(service_description(service));
        address.address = rule_ip;
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
        let (hc_name, hc_port) = plan.health_check.clone();
        let hc_path = format!("projects/{}/global/httpHealthChecks/{hc_name}", self.project());
        let recreate_pool = pool.as_ref().is_some_and(|p| {
            let affinity = p
                .session_affinity
                .as_ref()
                .and_then(|a| a.name())
                .unwrap_or_default();
            (!affinity.is_empty() && affinity != plan.session_affinity)
                || p.health_checks
                    .iter()
                    .map(|h| link_path(h))
                    .ne([hc_path.as_str()])
        });
        let rule_stale = rule.as_ref().is_some_and(|r| {
            plan.requested_ip
                .as_ref()
                .is_some_and(|ip| r.ip_address.as_ref() != Some(ip))
                || r.port_range.as_deref() != Some(plan.port_range.as_str())
                || r.ip_protocol.as_ref().and_then(|p| p.name()) != Some(plan.protocol.as_str())
        });
        // The rule keeps its IP while it stays; one about to be made (again) gets a reserved one.
        let (ip, reserved_now) = match rule.as_ref().and_then(|r| r.ip_address.clone()) {
            Some(ip) if plan.requested_ip.is_none() && !rule_stale && !recreate_pool => (ip, false),
            _ => self.address_for(&plan, service, rule.as_ref()).await?,
        };
        let fw = self.firewall(
            format!("k8s-fw-{}", plan.name),
            firewall_description(&plan, &ip),
            plan.source_ranges.clone(),
            Some(&ip),
            (&plan.protocol, plan.ports.clone()),
            tags.clone(),
        )?;
        self.ensure_firewall(fw).await?;

        if rule.is_some() && (rule_stale || recreate_pool) {
            self.delete_rule(&plan.name).await?;
        }
        if let (true, Some(old)) = (recreate_pool, &pool) {
            self.delete_pool(&plan.name).await?;
            // The health check the old pool used, when the traffic policy flipped.
            for old_check in &old.health_checks {
                let old_name = last_component(old_check);
                if old_name != hc_name {
                    let firewall = if old_name == plan.name {
                        format!("k8s-{}-http-hc", plan.name)
                    } else {
                        // The shared `k8s-<cluster ID>-node`.
                        format!("{old_name}-http-hc")
                    };
                    self.delete_health_check(old_name, &firewall).await?;
                }
            }
        }

        let hc_fw = self.firewall(
            self.health_check_firewall(&plan, &cluster_id),
            if plan.local {
                firewall_description(&plan, &ip)
            } else {
                format!("{{\"kubernetes.io/cluster-id\":\"{cluster_id}\"}}")
            },
            self.load_balancer_source_ranges(),
            Some(&ip),
            ("TCP", vec![hc_port.to_string()]),
            tags,
        )?;
        self.ensure_firewall(hc_fw).await?;
        let hc_link = self.ensure_health_check(&hc_name, hc_port).await?;

        let pool = match pool.filter(|_| !recreate_pool) {
            Some(pool) => pool,
            None => {
                let mut wanted = TargetPool::default();
                wanted.name = Some(plan.name.clone());
                wanted.description = Some(plan.description.clone());
                wanted.instances = instances.iter().take(POOL_CREATE_INSTANCES).cloned().collect();
                wanted.health_checks = vec![hc_link];
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
                })?
            }
        };
        self.update_pool(&pool, &instances).await?;

        let make_rule = rule.is_none() || rule_stale || recreate_pool;
        if make_rule {
            let mut wanted = ForwardingRule::default();
            wanted.name = Some(plan.name.clone());
            wanted.description = Some(plan.description.clone());
            wanted.ip_address = Some(ip.clone());
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
            let done = self
                .clients
                .forwarding_rules
                .insert()
                .set_project(self.project())
                .set_region(self.region())
                .set_body(wanted)
                .attributed()
                .poller()
                .until_done()
                .await;
            inserted(WriteError::check(done), "forwardingRules.insert")?;
        }
        // The rule holds the IP now: the temporary reservation goes, as upstream.
        if plan.requested_ip.is_none() && (reserved_now || make_rule) {
            self.delete_address(&plan.name).await?;
        }
        Ok(LoadBalancerStatus {
            ingress: Some(vec![LoadBalancerIngress {
                ip: Some(ip),
                ..LoadBalancerIngress::default()
            }]),
        })
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
        if let (false, Ok(cluster_id)) = (local, self.load_cluster_id().await) {
            self.delete_health_check(
                &format!("k8s-{cluster_id}-node"),
                &format!("k8s-{cluster_id}-node-http-hc"),
            )
            .await?;
        }
        Ok(())
    }
}
