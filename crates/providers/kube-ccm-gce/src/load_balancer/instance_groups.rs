//! The cluster's unmanaged instance groups, upstream's `k8s-ig--<cluster ID>`: one per zone with nodes,
//! holding (up to 1,000 of) that zone's node instances, shared by every internal load balancer's backend
//! service.

use std::collections::{BTreeMap, BTreeSet};

use google_cloud_compute_v1::model::{
    InstanceGroup, InstanceGroupsAddInstancesRequest, InstanceGroupsListInstancesRequest,
    InstanceGroupsRemoveInstancesRequest, InstanceReference,
};
use google_cloud_lro::Poller;
use kube_ccm_provider::CloudError;

use super::{deleted, found, inserted, link_path};
use crate::client::Attributed as _;
use crate::{GceProvider, WriteError, gce_error, last_component};

/// Members per group at most (upstream's limit; the first by name).
pub const MAX_MEMBERS: usize = 1000;

/// The groups' name: `k8s-ig--<cluster ID>` (`k8s-ig` without one).
pub fn group_name(cluster_id: &str) -> String {
    if cluster_id.is_empty() {
        "k8s-ig".to_owned()
    } else {
        format!("k8s-ig--{cluster_id}")
    }
}

/// Instance links (`projects/P/zones/Z/instances/N`) by zone, each zone's sorted and cut to
/// [`MAX_MEMBERS`].
pub fn by_zone(instances: &[String]) -> BTreeMap<String, Vec<String>> {
    let mut zones: BTreeMap<String, BTreeSet<&str>> = BTreeMap::new();
    for link in instances {
        let path = link_path(link);
        let parts: Vec<&str> = path.split('/').collect();
        if let ["projects", _, "zones", zone, "instances", _] = parts.as_slice() {
            zones.entry((*zone).to_owned()).or_default().insert(path);
        }
    }
    zones
        .into_iter()
        .map(|(zone, links)| {
            let mut links: Vec<&str> = links.into_iter().collect();
            links.sort_by_key(|l| last_component(l));
            (
                zone,
                links.into_iter().take(MAX_MEMBERS).map(str::to_owned).collect(),
            )
        })
        .collect()
}

fn references(links: &[&str]) -> Vec<InstanceReference> {
    links
        .iter()
        .map(|link| {
            let mut reference = InstanceReference::default();
            reference.instance = Some(format!("https://www.googleapis.com/compute/v1/{link}"));
            reference
        })
        .collect()
}

impl GceProvider {
    /// Each zone's group made if missing and holding exactly that zone's `instances`; the groups' links.
    pub(super) async fn ensure_instance_groups(
        &self,
        name: &str,
        instances: &[String],
    ) -> Result<Vec<String>, CloudError> {
        let mut links = Vec::new();
        for (zone, wanted) in by_zone(instances) {
            links.push(self.ensure_instance_group(name, &zone, &wanted).await?);
        }
        Ok(links)
    }

    async fn get_instance_group(&self, name: &str, zone: &str) -> Result<Option<InstanceGroup>, CloudError> {
        found(
            self.clients
                .instance_groups
                .get()
                .set_project(self.project())
                .set_zone(zone)
                .set_instance_group(name)
                .attributed()
                .send()
                .await,
            "instanceGroups.get",
        )
    }

    async fn ensure_instance_group(
        &self,
        name: &str,
        zone: &str,
        wanted: &[String],
    ) -> Result<String, CloudError> {
        let group = match self.get_instance_group(name, zone).await? {
            Some(group) => group,
            None => {
                let mut group = InstanceGroup::default();
                group.name = Some(name.to_owned());
                group.network = Some(self.network_url()?);
                let done = self
                    .clients
                    .instance_groups
                    .insert()
                    .set_project(self.project())
                    .set_zone(zone)
                    .set_body(group)
                    .attributed()
                    .poller()
                    .until_done()
                    .await;
                inserted(WriteError::check(done), "instanceGroups.insert")?;
                self.get_instance_group(name, zone).await?.ok_or_else(|| {
                    CloudError::provider(format!("instance group {zone}/{name} vanished after it was made"))
                })?
            }
        };
        let mut request = InstanceGroupsListInstancesRequest::default();
        request.instance_state = Some("ALL".into());
        let listed = self
            .clients
            .instance_groups
            .list_instances()
            .set_project(self.project())
            .set_zone(zone)
            .set_instance_group(name)
            .set_body(request)
            .attributed()
            .send()
            .await
            .map_err(|e| gce_error("instanceGroups.listInstances", e))?;
        let have: BTreeSet<String> = listed
            .items
            .iter()
            .filter_map(|i| i.instance.as_deref())
            .map(|l| link_path(l).to_owned())
            .collect();
        let want: BTreeSet<String> = wanted.iter().map(|l| link_path(l).to_owned()).collect();
        let remove: Vec<&str> = have.difference(&want).map(String::as_str).collect();
        if !remove.is_empty() {
            let mut body = InstanceGroupsRemoveInstancesRequest::default();
            body.instances = references(&remove);
            let done = self
                .clients
                .instance_groups
                .remove_instances()
                .set_project(self.project())
                .set_zone(zone)
                .set_instance_group(name)
                .set_body(body)
                .attributed()
                .poller()
                .until_done()
                .await;
            deleted(WriteError::check(done), "instanceGroups.removeInstances")?;
        }
        let add: Vec<&str> = want.difference(&have).map(String::as_str).collect();
        if !add.is_empty() {
            let mut body = InstanceGroupsAddInstancesRequest::default();
            body.instances = references(&add);
            let done = self
                .clients
                .instance_groups
                .add_instances()
                .set_project(self.project())
                .set_zone(zone)
                .set_instance_group(name)
                .set_body(body)
                .attributed()
                .poller()
                .until_done()
                .await;
            WriteError::check(done).map_err(|e| e.into_cloud("instanceGroups.addInstances"))?;
        }
        Ok(group.self_link.unwrap_or_default())
    }

    /// Deletes the groups called `name` in every zone; one still used by a backend service is kept.
    pub(super) async fn delete_instance_groups(&self, name: &str) -> Result<(), CloudError> {
        let listed = self
            .clients
            .instance_groups
            .aggregated_list()
            .set_project(self.project())
            .set_filter(format!("name eq \"{name}\""))
            .attributed()
            .send()
            .await
            .map_err(|e| gce_error("instanceGroups.aggregatedList", e))?;
        for group in listed
            .items
            .into_values()
            .flat_map(|scoped| scoped.instance_groups)
        {
            let zone = last_component(group.zone.as_deref().unwrap_or_default()).to_owned();
            if self
                .config
                .region()
                .is_some_and(|r| !zone.starts_with(&format!("{r}-")))
            {
                continue;
            }
            let done = self
                .clients
                .instance_groups
                .delete()
                .set_project(self.project())
                .set_zone(&zone)
                .set_instance_group(name)
                .attributed()
                .poller()
                .until_done()
                .await;
            match WriteError::check(done) {
                Err(error) if error.is_in_use() => {}
                other => deleted(other, "instanceGroups.delete")?,
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_are_upstreams_by_zone_sorted_and_cut() {
        assert_eq!(group_name("c1d2"), "k8s-ig--c1d2");
        assert_eq!(group_name(""), "k8s-ig");
        let links: Vec<String> = ["b", "a", "c"]
            .iter()
            .map(|n| format!("https://x/compute/v1/projects/p/zones/z-a/instances/{n}"))
            .chain(std::iter::once("projects/p/zones/z-b/instances/d".to_owned()))
            .chain((0..1005).map(|n| format!("projects/p/zones/z-c/instances/n{n:04}")))
            .collect();
        let zones = by_zone(&links);
        assert_eq!(
            zones["z-a"],
            [
                "projects/p/zones/z-a/instances/a",
                "projects/p/zones/z-a/instances/b",
                "projects/p/zones/z-a/instances/c"
            ]
        );
        assert_eq!(zones["z-b"], ["projects/p/zones/z-b/instances/d"]);
        assert_eq!(zones["z-c"].len(), MAX_MEMBERS);
        assert_eq!(zones["z-c"][999], "projects/p/zones/z-c/instances/n0999");
    }
}
