//! Routes for node pod ranges, as upstream's `gce_routes.go`:
//!
//! - A cluster's routes are named `<cluster name, at most 26 characters>-<name hint>` (the hint is the
//!   node's UID), described `k8s-node-route`, in the cluster's network (`network-name`), priority 1000,
//!   next hop the node's instance. The same names as upstream, so routes the in-tree provider made are
//!   this provider's after a migration (with the same `--cluster-name`).
//! - Listing asks for the name prefix and keeps the routes in the network with that description. A route
//!   whose next-hop instance is gone (Compute warns `NEXT_HOP_INSTANCE_NOT_FOUND`) is reported as a
//!   blackhole, and the route controller deletes it.
//! - Inserts and deletes are long-running operations, awaited within the call's deadline. An insert
//!   that finds the route made already (409) is done: a retried call, perhaps by another process. A delete
//!   that finds nothing (404) is done too.

use async_trait::async_trait;
use google_cloud_compute_v1::model;
use google_cloud_lro::Poller;
use kube_ccm_provider::{CallContext, CloudError, Route, Routes};

use crate::client::{Attributed as _, turn};
use crate::instances::InstanceRef;
use crate::{GceProvider, WriteError, gce_error, last_component};

/// The description upstream gives the routes it makes.
pub const ROUTE_DESCRIPTION: &str = "k8s-node-route";
/// Route names start with at most this much of the cluster name.
const CLUSTER_NAME_LENGTH: usize = 26;
/// Upstream's priority for node routes.
const PRIORITY: u32 = 1000;

/// The cluster name as route names carry it (upstream's `truncateClusterName`).
pub fn route_prefix(cluster_name: &str) -> &str {
    match cluster_name.char_indices().nth(CLUSTER_NAME_LENGTH) {
        Some((at, _)) => &cluster_name[..at],
        None => cluster_name,
    }
}

/// Whether two network references (URLs or `projects/…` paths) name the same network.
fn same_network(a: &str, b: &str) -> bool {
    let path = |n: &str| n.find("projects/").map_or(n, |at| &n[at..]).to_owned();
    path(a) == path(b)
}

impl GceProvider {
    fn network(&self) -> Result<String, CloudError> {
        self.config.network_path().ok_or_else(|| {
            CloudError::provider("routes need network-name in the cloud-config ([global] network-name)")
        })
    }

    async fn list(&self, cluster_name: &str) -> Result<Vec<Route>, CloudError> {
        let network = self.network()?;
        let filter = format!("name eq \"{}-.*\"", regex_escape(route_prefix(cluster_name)));
        let mut routes = Vec::new();
        let mut token = String::new();
        loop {
            turn().await?;
            let page = self
                .clients
                .routes
                .list()
                .set_project(self.config.network_project())
                .set_filter(filter.clone())
                .set_max_results(500_u32)
                .set_page_token(token.clone())
                .attributed()
                .send()
                .await
                .map_err(|e| gce_error("routes.list", e))?;
            for route in page.items {
                if route.description.as_deref() != Some(ROUTE_DESCRIPTION)
                    || !same_network(route.network.as_deref().unwrap_or_default(), &network)
                {
                    continue;
                }
                let blackhole = route.warnings.iter().any(|w| {
                    w.code
                        .as_ref()
                        .is_some_and(|c| c.name() == Some("NEXT_HOP_INSTANCE_NOT_FOUND"))
                });
                routes.push(Route {
                    name: route.name.unwrap_or_default(),
                    target_node: last_component(route.next_hop_instance.as_deref().unwrap_or_default())
                        .to_owned(),
                    destination_cidr: route.dest_range.unwrap_or_default(),
                    blackhole,
                    ..Route::default()
                });
            }
            match page.next_page_token.filter(|t| !t.is_empty()) {
                Some(next) => token = next,
                None => break,
            }
        }
        Ok(routes)
    }

    async fn create(&self, cluster_name: &str, name_hint: &str, route: &Route) -> Result<(), CloudError> {
        let network = self.network()?;
        let target = InstanceRef {
            project: self.config.project_id.clone(),
            zone: None,
            name: route.target_node.split('.').next().unwrap_or_default().to_owned(),
        };
        let instance = self
            .find(std::slice::from_ref(&target))
            .await?
            .pop()
            .map_or(Ok(None), crate::instances::Lookup::certain)?
            .ok_or_else(|| {
                CloudError::provider(format!("no instance {} for the route's node", target.name))
            })?;
        let zone = last_component(instance.zone.as_deref().unwrap_or_default());
        let mut body = model::Route::default();
        body.name = Some(format!("{}-{name_hint}", route_prefix(cluster_name)));
        body.dest_range = Some(route.destination_cidr.clone());
        body.next_hop_instance = Some(format!(
            "projects/{}/zones/{zone}/instances/{}",
            target.project, target.name
        ));
        body.network = Some(format!("https://www.googleapis.com/compute/v1/{network}"));
        body.priority = Some(PRIORITY);
        body.description = Some(ROUTE_DESCRIPTION.to_owned());
        turn().await?;
        let done = self
            .clients
            .routes
            .insert()
            .set_project(self.config.network_project())
            .set_body(body)
            .attributed()
            .poller()
            .until_done()
            .await;
        match WriteError::check(done) {
            Err(error) if error.is_conflict() => Ok(()),
            outcome => outcome.map_err(|e| e.into_cloud("routes.insert")),
        }
    }

    async fn delete(&self, route: &Route) -> Result<(), CloudError> {
        let done = self
            .clients
            .routes
            .delete()
            .set_project(self.config.network_project())
            .set_route(route.name.clone())
            .attributed()
            .poller()
            .until_done()
            .await;
        match WriteError::check(done) {
            Err(error) if error.is_not_found() => Ok(()),
            outcome => outcome.map_err(|e| e.into_cloud("routes.delete")),
        }
    }
}

/// `text` with regular-expression metacharacters escaped (cluster names are free text).
fn regex_escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if "\\.+*?()|[]{}^$".contains(c) {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

#[async_trait]
impl Routes for GceProvider {
    async fn list_routes(&self, cx: &CallContext, cluster_name: &str) -> Result<Vec<Route>, CloudError> {
        cx.call("routes.list", self.list(cluster_name)).await
    }

    async fn create_route(
        &self,
        cx: &CallContext,
        cluster_name: &str,
        name_hint: &str,
        route: &Route,
    ) -> Result<(), CloudError> {
        cx.call("routes.insert", self.create(cluster_name, name_hint, route))
            .await
    }

    async fn delete_route(
        &self,
        cx: &CallContext,
        _cluster_name: &str,
        route: &Route,
    ) -> Result<(), CloudError> {
        cx.request("routes.delete", self.delete(route)).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefixes_are_the_cluster_name_cut_at_26() {
        assert_eq!(route_prefix("kubernetes"), "kubernetes");
        assert_eq!(
            route_prefix("a-very-long-cluster-name-that-goes-on"),
            "a-very-long-cluster-name-t"
        );
    }

    #[test]
    fn networks_compare_by_path() {
        assert!(same_network(
            "https://www.googleapis.com/compute/v1/projects/p/global/networks/n",
            "projects/p/global/networks/n"
        ));
        assert!(!same_network(
            "projects/p/global/networks/n",
            "projects/q/global/networks/n"
        ));
        assert_eq!(regex_escape("a.b(c)"), "a\\.b\\(c\\)");
    }
}
