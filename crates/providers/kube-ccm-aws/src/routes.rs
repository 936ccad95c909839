//! Routes for node pod ranges in the cluster's VPC route table, as upstream:
//!
//! - The table is `RouteTableID` from the cloud-config, else the one route table tagged with the cluster
//!   ID (`kubernetes.io/cluster/<id>`, or the legacy `KubernetesCluster=<id>`); none or several is an
//!   error naming what to set. It is found once.
//! - Listing reports every route to an instance (its node: the instance's private DNS name) and every
//!   blackhole route (its target is gone: the route controller deletes it), named `<cluster>-<cidr>`.
//! - Creating disables the target instance's source/destination check (once), replaces a blackhole
//!   route to the same range, then creates the route; the same route again is done already (a retried
//!   call). IPv4 only, as upstream.
//!
//! A route's target is listed as the name of the node on its instance, from the manager's shared node
//! cache (`node_index.rs`, as upstream's node informer), and a route for a node goes to the instance
//! its provider ID names. Without the cache (not leading, not synced yet, or no node on the instance), the
//! target is the instance's private DNS name, or, when that name is resource-based
//! (`i-….<region>.compute.internal`: the node may be named after the instance ID or the DNS name), the
//! instance's provider ID, which the route controller matches to the node's `spec.providerID`; and a node
//! is found by an instance ID in its name or by private DNS name.

use async_trait::async_trait;
use aws_sdk_ec2::types::{Filter, RouteState};
use kube_ccm_provider::{CallContext, CloudError, Route, Routes};

use crate::instances::{InstanceKey, instance_id_of, provider_id};
use crate::{AwsProvider, aws_error};

/// How a listed route names its instance: the private DNS name, or the provider ID when that name is
/// resource-based (it starts with the instance ID) or missing.
fn route_target(instance: &aws_sdk_ec2::types::Instance) -> String {
    let id = instance.instance_id().unwrap_or_default();
    match instance.private_dns_name() {
        Some(dns) if !dns.is_empty() && (id.is_empty() || !dns.starts_with(id)) => dns.to_owned(),
        _ if id.is_empty() => String::new(),
        _ => provider_id(instance),
    }
}

impl AwsProvider {
    /// The cluster's route table (cached after the first look-up).
    async fn route_table(&self) -> Result<String, CloudError> {
        if !self.config.route_table_id.is_empty() {
            return Ok(self.config.route_table_id.clone());
        }
        if let Some(id) = self.route_table.lock().await.clone() {
            return Ok(id);
        }
        let cluster = self.config.cluster_id();
        if cluster.is_empty() {
            return Err(CloudError::provider(
                "routes need RouteTableID or a cluster ID in the cloud-config",
            ));
        }
        let mut found: Vec<String> = Vec::new();
        for filter in [
            Filter::builder()
                .name("tag-key")
                .values(format!("kubernetes.io/cluster/{cluster}"))
                .build(),
            Filter::builder()
                .name("tag:KubernetesCluster")
                .values(cluster)
                .build(),
        ] {
            let output = self
                .ec2
                .describe_route_tables()
                .filters(filter)
                .send()
                .await
                .map_err(aws_error)?;
            for table in output.route_tables() {
                if let Some(id) = table.route_table_id().filter(|id| !found.iter().any(|f| f == id)) {
                    found.push(id.to_owned());
                }
            }
        }
        match found.as_slice() {
            [one] => {
                *self.route_table.lock().await = Some(one.clone());
                Ok(one.clone())
            }
            [] => Err(CloudError::provider(format!(
                "no route table is tagged kubernetes.io/cluster/{cluster}: tag the cluster's route table or set RouteTableID"
            ))),
            several => Err(CloudError::provider(format!(
                "{} route tables are tagged for cluster {cluster} ({}): set RouteTableID",
                several.len(),
                several.join(", ")
            ))),
        }
    }

    async fn list(&self, cluster_name: &str) -> Result<Vec<Route>, CloudError> {
        let table = self.route_table().await?;
        let output = self
            .ec2
            .describe_route_tables()
            .route_table_ids(&table)
            .send()
            .await
            .map_err(aws_error)?;
        let Some(table) = output.route_tables().first() else {
            return Err(CloudError::provider(format!(
                "route table {table} does not exist"
            )));
        };
        let mut pending: Vec<(String, String, bool)> = Vec::new(); // (cidr, instance, blackhole)
        for route in table.routes() {
            let Some(cidr) = route.destination_cidr_block() else {
                continue;
            };
            let blackhole = route.state() == Some(&RouteState::Blackhole);
            match route.instance_id() {
                Some(instance) => pending.push((cidr.to_owned(), instance.to_owned(), blackhole)),
                None if blackhole => pending.push((cidr.to_owned(), String::new(), true)),
                None => {}
            }
        }
        let keys: Vec<InstanceKey> = pending
            .iter()
            .filter(|(_, instance, _)| !instance.is_empty())
            .map(|(_, instance, _)| InstanceKey::Id(instance.clone()))
            .collect();
        let instances = self.describe(&keys).await?;
        Ok(pending
            .into_iter()
            .map(|(cidr, instance, blackhole)| {
                let found = instances.get(&InstanceKey::Id(instance.clone()));
                let node = match (found, self.nodes.node_on(&instance)) {
                    (Some(_), Some(name)) => name,
                    (found, _) => found.map(route_target).unwrap_or_default(),
                };
                Route {
                    name: format!("{cluster_name}-{cidr}"),
                    blackhole: blackhole || node.is_empty(),
                    target_node: node,
                    destination_cidr: cidr,
                    ..Route::default()
                }
            })
            .collect())
    }

    async fn create(&self, route: &Route) -> Result<(), CloudError> {
        let table = self.route_table().await?;
        let name = route.target_node.as_str();
        let key = match self.nodes.instance_of(name) {
            Some(id) => InstanceKey::Id(id),
            None => match instance_id_of(name.split('.').next().unwrap_or(name)) {
                Some(id) => InstanceKey::Id(id.to_owned()),
                None => InstanceKey::PrivateDns(name.to_owned()),
            },
        };
        let instances = self.describe(std::slice::from_ref(&key)).await?;
        let instance = instances
            .get(&key)
            .ok_or_else(|| CloudError::provider(format!("no instance for node {name}")))?;
        let id = instance.instance_id().unwrap_or_default().to_owned();
        if instance.source_dest_check() != Some(false) {
            self.ec2
                .modify_instance_attribute()
                .instance_id(&id)
                .source_dest_check(
                    aws_sdk_ec2::types::AttributeBooleanValue::builder()
                        .value(false)
                        .build(),
                )
                .send()
                .await
                .map_err(aws_error)?;
        }
        let existing = self.list("").await?;
        let same_range = existing
            .iter()
            .find(|r| r.destination_cidr == route.destination_cidr);
        match same_range {
            // Made already (a retried call whose first answer was lost): done.
            Some(r) if !r.blackhole && (r.target_node == route_target(instance) || r.target_node == name) => {
                return Ok(());
            }
            Some(r) if r.blackhole => self.delete(&route.destination_cidr).await?,
            _ => {}
        }
        self.ec2
            .create_route()
            .route_table_id(&table)
            .destination_cidr_block(&route.destination_cidr)
            .instance_id(&id)
            .send()
            .await
            .map_err(aws_error)?;
        Ok(())
    }

    async fn delete(&self, cidr: &str) -> Result<(), CloudError> {
        let table = self.route_table().await?;
        self.ec2
            .delete_route()
            .route_table_id(&table)
            .destination_cidr_block(cidr)
            .send()
            .await
            .map_err(aws_error)?;
        Ok(())
    }
}

#[async_trait]
impl Routes for AwsProvider {
    async fn list_routes(&self, cx: &CallContext, cluster_name: &str) -> Result<Vec<Route>, CloudError> {
        cx.guard(self.list(cluster_name)).await
    }

    async fn create_route(
        &self,
        cx: &CallContext,
        _cluster_name: &str,
        _name_hint: &str,
        route: &Route,
    ) -> Result<(), CloudError> {
        cx.guard(self.create(route)).await
    }

    async fn delete_route(
        &self,
        cx: &CallContext,
        _cluster_name: &str,
        route: &Route,
    ) -> Result<(), CloudError> {
        cx.guard(self.delete(&route.destination_cidr)).await
    }
}

#[cfg(test)]
mod tests {
    use aws_sdk_ec2::types::{Instance, Placement};

    use super::route_target;

    fn instance(id: &str, dns: Option<&str>) -> Instance {
        Instance::builder()
            .instance_id(id)
            .set_private_dns_name(dns.map(str::to_owned))
            .placement(Placement::builder().availability_zone("us-east-1a").build())
            .build()
    }

    #[test]
    fn a_route_names_its_node_by_ip_based_dns_name_else_by_provider_id() {
        let ip_name = instance("i-0abc", Some("ip-10-0-0-1.ec2.internal"));
        assert_eq!(route_target(&ip_name), "ip-10-0-0-1.ec2.internal");
        let resource_name = instance("i-0abc", Some("i-0abc.us-east-1.compute.internal"));
        assert_eq!(route_target(&resource_name), "aws:///us-east-1a/i-0abc");
        assert_eq!(
            route_target(&instance("i-0abc", None)),
            "aws:///us-east-1a/i-0abc"
        );
        assert_eq!(
            route_target(&instance("i-0abc", Some(""))),
            "aws:///us-east-1a/i-0abc"
        );
    }
}
