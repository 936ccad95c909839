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
//! Difference: a node named after its instance ID (resource-based names) is routed to, but listed under
//! its private DNS name, which the route controller then does not recognise; upstream maps those through
//! its node informer. Route tables with resource-based node names are left to a later change.

use async_trait::async_trait;
use aws_sdk_ec2::types::{Filter, RouteState};
use cloud_provider::{CallContext, CloudError, Route, Routes};

use crate::instances::{InstanceKey, instance_id_of};
use crate::{AwsProvider, aws_error};

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
                let node = instances
                    .get(&InstanceKey::Id(instance))
                    .and_then(|i| i.private_dns_name())
                    .unwrap_or_default()
                    .to_owned();
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
        let key = match instance_id_of(name.split('.').next().unwrap_or(name)) {
            Some(id) => InstanceKey::Id(id.to_owned()),
            None => InstanceKey::PrivateDns(name.to_owned()),
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
            Some(r) if !r.blackhole && r.target_node == route.target_node => return Ok(()),
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
