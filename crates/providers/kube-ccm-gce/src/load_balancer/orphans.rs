//! The orphan sweep's questions (decision 0035): which load balancers are provably this cluster's, and
//! deleting one whole.
//!
//! A per-service part (named `a` + 31 hex digits, described `{"kubernetes.io/service-name":"ns/name"}`)
//! carries no cluster ID, as upstream's: every cluster of a project and region makes the same kind of
//! parts. So a load balancer is claimed only through a link to a part named for this cluster's ID:
//! - **external**: its target pool's health check is the cluster's `httpHealthChecks/k8s-<ID>-node`;
//! - **internal**: its backend service sends to the cluster's instance groups `k8s-ig--<ID>` or checks
//!   `healthChecks/k8s-<ID>-node`, or its forwarding rule uses the cluster's shared backend service
//!   `k8s-<ID>-internal-…`.
//!
//! The forwarding rule of a claimed pool or backend service is listed with it. Not listed, since nothing
//! links them to the cluster: an external load balancer that keeps traffic local (its pool checks its own
//! health check), and parts left without a pool, backend service or rule (an address, a firewall, a
//! health check). Shared parts (`k8s-<ID>-node`, `k8s-ig--<ID>`, `k8s-<ID>-internal-…`) are never
//! deleted here: the service controller's deletes take them down with the last load balancer using them.
//!
//! Deleting drives the provider's own deletes for a stand-in service carrying the UID the name holds.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Service;
use kube_ccm_provider::{CloudError, ClusterLoadBalancer, is_default_load_balancer_name};

use super::ANNOTATION_LOAD_BALANCER_TYPE;
use crate::client::{Attributed as _, turn};
use crate::{GceProvider, gce_error, last_component};

/// Compute's filter for names this provider gives a service's parts (a regular expression, anchored).
const NAME_FILTER: &str = "name eq \"a[0-9a-f]{31}\"";
const POOL: &str = "targetPools/";
const BACKEND: &str = "backendServices/";
const RULE: &str = "forwardingRules/";

/// The service a part's description names (`{"kubernetes.io/service-name":"ns/name"}`).
fn described_service(description: Option<&str>) -> Option<String> {
    let value: serde_json::Value = serde_json::from_str(description?).ok()?;
    value
        .get("kubernetes.io/service-name")?
        .as_str()
        .filter(|s| s.contains('/'))
        .map(str::to_owned)
}

/// A service whose load balancer is `lb`: its recorded namespace and name, the UID its name carries, and
/// the kind its parts say.
fn stand_in(lb: &ClusterLoadBalancer, internal: bool) -> Result<Service, CloudError> {
    if !is_default_load_balancer_name(&lb.name) {
        return Err(CloudError::provider(format!(
            "{:?} is not a name this provider gives a load balancer",
            lb.name
        )));
    }
    let (namespace, name) = lb
        .service
        .as_deref()
        .and_then(|s| s.split_once('/'))
        .unwrap_or(("default", ""));
    let annotations = if internal {
        serde_json::json!({ANNOTATION_LOAD_BALANCER_TYPE: "Internal"})
    } else {
        serde_json::json!({})
    };
    serde_json::from_value(serde_json::json!({
        "metadata": {"namespace": namespace, "name": name, "uid": &lb.name[1..], "annotations": annotations},
    }))
    .map_err(CloudError::provider)
}

fn entry<'a>(
    found: &'a mut BTreeMap<String, ClusterLoadBalancer>,
    name: &str,
    description: Option<&str>,
) -> &'a mut ClusterLoadBalancer {
    let entry = found
        .entry(name.to_owned())
        .or_insert_with(|| ClusterLoadBalancer {
            name: name.to_owned(),
            service: None,
            parts: Vec::new(),
        });
    if entry.service.is_none() {
        entry.service = described_service(description);
    }
    entry
}

/// Every page of the region's `list` (`$list`, a request builder made anew for each page), the names
/// filtered to services' (`NAME_FILTER`); a page token answered twice is an error, not a loop. The
/// builder is written out at each use, so the IAM role's test finds the call.
macro_rules! list_all {
    ($provider:expr, $list:expr, $request:literal) => {{
        let mut items = Vec::new();
        let mut token = String::new();
        loop {
            turn().await?;
            let page = $list
                .set_project($provider.project())
                .set_region($provider.region())
                .set_filter(NAME_FILTER)
                .set_max_results(500_u32)
                .set_page_token(token.clone())
                .attributed()
                .send()
                .await
                .map_err(|e| gce_error($request, e))?;
            items.extend(page.items);
            match page.next_page_token.filter(|t| !t.is_empty()) {
                Some(next) if next == token => {
                    break Err(CloudError::provider(format!(
                        "{}: the page token {next:?} was answered twice",
                        $request
                    )));
                }
                Some(next) => token = next,
                None => break Ok(items),
            }
        }
    }};
}

impl GceProvider {
    /// The cluster's load balancers, as the module says.
    pub(super) async fn cluster_load_balancers(&self) -> Result<Vec<ClusterLoadBalancer>, CloudError> {
        let id = self.load_cluster_id().await?;
        let node_check = format!("/httpHealthChecks/k8s-{id}-node");
        let global_check = format!("/healthChecks/k8s-{id}-node");
        let groups = format!("/instanceGroups/k8s-ig--{id}");
        let shared_backend = format!("k8s-{id}-internal-");
        let mut found: BTreeMap<String, ClusterLoadBalancer> = BTreeMap::new();
        for pool in self.list_pools().await? {
            let name = pool.name.as_deref().unwrap_or_default();
            if is_default_load_balancer_name(name)
                && pool.health_checks.iter().any(|c| c.ends_with(&node_check))
            {
                entry(&mut found, name, pool.description.as_deref())
                    .parts
                    .push(format!("{POOL}{name}"));
            }
        }
        for backend in self.list_backend_services().await? {
            let name = backend.name.as_deref().unwrap_or_default();
            let linked = backend
                .backends
                .iter()
                .any(|b| b.group.as_deref().is_some_and(|g| g.ends_with(&groups)))
                || backend.health_checks.iter().any(|c| c.ends_with(&global_check));
            if is_default_load_balancer_name(name) && linked {
                entry(&mut found, name, backend.description.as_deref())
                    .parts
                    .push(format!("{BACKEND}{name}"));
            }
        }
        for rule in self.list_rules().await? {
            let name = rule.name.as_deref().unwrap_or_default();
            let backend = rule.backend_service.as_deref().map(last_component);
            let claimed = found.contains_key(name) || backend.is_some_and(|b| b.starts_with(&shared_backend));
            if !is_default_load_balancer_name(name) || !claimed {
                continue;
            }
            let entry = entry(&mut found, name, rule.description.as_deref());
            entry.parts.push(format!("{RULE}{name}"));
            if let Some(shared) = backend.filter(|b| b.starts_with(&shared_backend)) {
                entry.parts.push(format!("{BACKEND}{shared}"));
            }
        }
        Ok(found.into_values().collect())
    }

    /// Deletes every part of `lb` (listed by [`Self::cluster_load_balancers`]).
    pub(super) async fn delete_cluster_load_balancer(
        &self,
        lb: &ClusterLoadBalancer,
    ) -> Result<(), CloudError> {
        let internal = lb.parts.iter().any(|p| p.starts_with(BACKEND));
        let service = stand_in(lb, internal)?;
        if internal {
            self.delete_internal_parts(&service, false).await
        } else {
            self.delete_external_parts(&service, false).await
        }
    }

    async fn list_pools(&self) -> Result<Vec<google_cloud_compute_v1::model::TargetPool>, CloudError> {
        list_all!(self, self.clients.target_pools.list(), "targetPools.list")
    }

    async fn list_backend_services(
        &self,
    ) -> Result<Vec<google_cloud_compute_v1::model::BackendService>, CloudError> {
        list_all!(
            self,
            self.clients.backend_services.list(),
            "regionBackendServices.list"
        )
    }

    async fn list_rules(&self) -> Result<Vec<google_cloud_compute_v1::model::ForwardingRule>, CloudError> {
        list_all!(self, self.clients.forwarding_rules.list(), "forwardingRules.list")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_service_is_read_from_the_description_as_upstream_writes_it() {
        let described = |d: &str| described_service(Some(d));
        assert_eq!(
            described(r#"{"kubernetes.io/service-name":"shop/web"}"#).as_deref(),
            Some("shop/web")
        );
        assert_eq!(
            described(r#"{"kubernetes.io/service-name":"shop/web", "kubernetes.io/service-ip":"1.2.3.4"}"#)
                .as_deref(),
            Some("shop/web")
        );
        assert_eq!(described("not json"), None);
        assert_eq!(described(r#"{"kubernetes.io/cluster-id":"c1"}"#), None);
        assert_eq!(described_service(None), None);
    }

    #[test]
    fn the_stand_in_service_gives_the_load_balancer_its_name_and_kind() {
        let lb = ClusterLoadBalancer {
            name: "a0a1b2c3d4e5f60718293a4b5c6d7e8f".into(),
            service: Some("shop/web".into()),
            parts: vec![],
        };
        let internal = stand_in(&lb, true).unwrap();
        assert_eq!(kube_ccm_provider::default_load_balancer_name(&internal), lb.name);
        assert!(super::super::wants_internal(&internal));
        assert!(!super::super::wants_internal(&stand_in(&lb, false).unwrap()));
        let foreign = ClusterLoadBalancer {
            name: "k8s2-abc".into(),
            ..lb
        };
        assert!(stand_in(&foreign, false).is_err());
    }
}
