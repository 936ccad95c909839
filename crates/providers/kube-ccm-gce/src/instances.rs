//! Instances: node → Compute instance, answered for many nodes with one `instances.aggregatedList` per
//! 100 names.
//!
//! - Provider IDs as upstream: `gce://<project>/<zone>/<instance>`. A node without one is found by its
//!   name (up to the first `.`, as upstream's `canonicalizeInstanceName`) in the managed zones: `local-zone`
//!   only, or every zone of its region with `multizone` or `regional`.
//! - Gone = Compute has no such instance (404, or absent from the list); any status exists, as upstream.
//! - Shut down = `TERMINATED`, `STOPPED` or `SUSPENDED`. **Difference**: upstream's GCE provider answers
//!   `NotImplemented` here, so GCE nodes never get the shutdown taint; a stopped VM is shut down by any
//!   reading, and the taint keeps pods off it.
//! - Addresses as upstream's `nodeAddressesFromInstance`: per network interface, `networkIP` as
//!   `InternalIP`, each access config's `natIP` as `ExternalIP`, the IPv6 address ([`ipv6_address`]: the
//!   internal one, else the external one for `ipv6AccessType: EXTERNAL`) as `InternalIP`; IPv6 first for
//!   `stack-type = IPV6`.
//! - Labels: zone, region (the zone up to its last `-`) and instance type (the machine type's last path
//!   component), set by the framework; nothing more, as upstream.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use async_trait::async_trait;
use google_cloud_compute_v1::model::network_interface::Ipv6AccessType;
use google_cloud_compute_v1::model::{Instance, InstanceAggregatedList, NetworkInterface, instance};
use k8s_openapi::api::core::v1::{Node, NodeAddress};
use kube_ccm_provider::{CallContext, CloudError, InstanceMetadata, InstancesV2};

use crate::client::{Attributed as _, turn};
use crate::config::{StackType, region_of_zone};
use crate::{GceProvider, gce_error, last_component};

/// Names per `aggregatedList` filter (the filter is a regular expression of alternatives).
const NAMES_PER_REQUEST: usize = 100;
/// Items per page.
const PAGE_SIZE: u32 = 500;

/// Where a node's instance is.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct InstanceRef {
    /// The project.
    pub project: String,
    /// The zone, when the provider ID gives it.
    pub zone: Option<String>,
    /// The instance's name.
    pub name: String,
}

/// `(project, zone, name)` of a `gce://<project>/<zone>/<name>` provider ID; `None` for anything else (a
/// zone or instance name Compute could not have).
pub fn parse_provider_id(provider_id: &str) -> Option<(&str, &str, &str)> {
    let rest = provider_id.strip_prefix("gce://")?;
    let mut parts = rest.split('/');
    let (project, zone, name) = (parts.next()?, parts.next()?, parts.next()?);
    (parts.next().is_none() && !project.is_empty() && is_compute_name(zone) && is_compute_name(name))
        .then_some((project, zone, name))
}

/// A Compute name, `[a-z]([-a-z0-9]{0,61}[a-z0-9])?`: a lowercase letter, then lowercase letters, digits
/// and dashes, not ending with a dash, at most 63.
fn is_compute_name(name: &str) -> bool {
    name.len() <= 63
        && name.starts_with(|c: char| c.is_ascii_lowercase())
        && !name.ends_with('-')
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
}

/// What Compute says of one instance looked up.
#[derive(Debug, Clone)]
pub(crate) enum Lookup {
    Found(Box<Instance>),
    /// Compute has none: every zone it could be in answered.
    Absent,
    /// Not a name Compute could have: never looked up, so neither found nor absent.
    Invalid(String),
    /// A zone it could be in did not answer: neither found nor absent.
    Unknown(String),
}

impl Lookup {
    /// Found, absent, or an error: a node's instance is gone only when Compute positively says so.
    pub(crate) fn certain(self) -> Result<Option<Instance>, CloudError> {
        match self {
            Lookup::Found(instance) => Ok(Some(*instance)),
            Lookup::Absent => Ok(None),
            Lookup::Invalid(why) | Lookup::Unknown(why) => Err(CloudError::provider(why)),
        }
    }
}

/// What the `aggregatedList` pages showed, gathered for [`lookup`] to judge each instance by once every
/// page is in.
#[derive(Default)]
struct Listed {
    /// The instances found, by project and name (one name can be in several zones).
    found: HashMap<(String, String), Vec<Instance>>,
    /// Per project, the zones that did not answer.
    unreachable: HashMap<String, BTreeSet<String>>,
    /// The projects whose list as a whole may be partial.
    partial: BTreeSet<String>,
}

impl Listed {
    /// Adds one page of `project`'s list: a warning on the whole list, the zones that did not answer and
    /// the instances. The next page's token, if there is one.
    fn add_page(&mut self, project: &str, page: InstanceAggregatedList) -> Option<String> {
        use google_cloud_compute_v1::model::instance_aggregated_list::warning::Code as ListCode;
        use google_cloud_compute_v1::model::instances_scoped_list::warning::Code as ScopeCode;
        if page
            .warning
            .as_ref()
            .and_then(|w| w.code.as_ref())
            .is_some_and(|code| matches!(code, ListCode::Unreachable | ListCode::PartialSuccess))
        {
            self.partial.insert(project.to_owned());
        }
        let zones = self.unreachable.entry(project.to_owned()).or_default();
        zones.extend(
            page.unreachables
                .iter()
                .map(|scope| last_component(scope).to_owned()),
        );
        for (scope, scoped) in page.items {
            if scoped
                .warning
                .as_ref()
                .and_then(|w| w.code.as_ref())
                .is_some_and(|code| matches!(code, ScopeCode::Unreachable))
            {
                zones.insert(last_component(&scope).to_owned());
            }
            for instance in scoped.instances {
                let name = instance.name.clone().unwrap_or_default();
                self.found
                    .entry((project.to_owned(), name))
                    .or_default()
                    .push(instance);
            }
        }
        page.next_page_token.filter(|t| !t.is_empty())
    }
}

/// What Compute says of `r`, judged from what its project's list showed: found when exactly one instance
/// is in a zone it could be in; unknown when two are, or when the list was partial or a zone it could be
/// in did not answer; else absent. `managed_zone` tells the zones a reference without one could be in.
fn lookup(r: &InstanceRef, listed: &Listed, managed_zone: impl Fn(&str) -> bool) -> Lookup {
    if !is_compute_name(&r.name) {
        return Lookup::Invalid(format!(
            "{:?} is not a Compute instance name, so no instance can be looked up for it",
            r.name
        ));
    }
    let candidates = listed
        .found
        .get(&(r.project.clone(), r.name.clone()))
        .map(Vec::as_slice)
        .unwrap_or_default();
    let zone_of = |i: &Instance| last_component(i.zone.as_deref().unwrap_or_default()).to_owned();
    let in_scope = |zone: &str| match &r.zone {
        Some(wanted) => zone == wanted,
        None => managed_zone(zone),
    };
    let mut matching = candidates.iter().filter(|i| in_scope(&zone_of(i)));
    match (matching.next(), matching.next()) {
        (Some(one), None) => Lookup::Found(Box::new(one.clone())),
        (Some(a), Some(b)) => Lookup::Unknown(format!(
            "instance {} is in zones {} and {}: give the node a provider ID",
            r.name,
            zone_of(a),
            zone_of(b)
        )),
        (None, _) => {
            let no_zones = BTreeSet::new();
            let silent = listed.unreachable.get(&r.project).unwrap_or(&no_zones);
            if listed.partial.contains(&r.project) {
                Lookup::Unknown(format!(
                    "Compute listed the instances of project {} only in part",
                    r.project
                ))
            } else if let Some(zone) = silent.iter().find(|zone| in_scope(zone)) {
                Lookup::Unknown(format!(
                    "zone {zone} did not answer, and instance {} could be there",
                    r.name
                ))
            } else {
                Lookup::Absent
            }
        }
    }
}

impl GceProvider {
    /// Where `node`'s instance is: from its provider ID, else its name in this provider's project.
    pub fn instance_ref(&self, node: &Node) -> Result<InstanceRef, CloudError> {
        let provider_id = node
            .spec
            .as_ref()
            .and_then(|s| s.provider_id.as_deref())
            .filter(|p| !p.is_empty());
        if let Some(provider_id) = provider_id {
            let (project, zone, name) = parse_provider_id(provider_id).ok_or_else(|| {
                CloudError::provider(format!(
                    "provider ID {provider_id:?} is not gce://<project>/<zone>/<instance>"
                ))
            })?;
            return Ok(InstanceRef {
                project: project.to_owned(),
                zone: Some(zone.to_owned()),
                name: name.to_owned(),
            });
        }
        let name = node.metadata.name.as_deref().unwrap_or_default();
        Ok(InstanceRef {
            project: self.config.project_id.clone(),
            zone: None,
            name: name.split('.').next().unwrap_or(name).to_owned(),
        })
    }

    /// Whether a zone is one this provider looks for instances in by name.
    fn managed_zone(&self, zone: &str) -> bool {
        if self.config.all_zones() {
            region_of_zone(zone) == self.config.region()
        } else {
            zone == self.config.local_zone
        }
    }

    /// What Compute says of each of `refs`, one `aggregatedList` per project and 100 names. A zone that
    /// did not answer (a scope's `UNREACHABLE` warning, the list's `unreachables`) makes the instances
    /// that could be in it unknown, never absent; a warning on the whole list makes every one unknown.
    pub(crate) async fn find(&self, refs: &[InstanceRef]) -> Result<Vec<Lookup>, CloudError> {
        let mut names: HashMap<&str, BTreeSet<&str>> = HashMap::new();
        for r in refs.iter().filter(|r| is_compute_name(&r.name)) {
            names.entry(&r.project).or_default().insert(&r.name);
        }
        let mut listed = Listed::default();
        for (project, names) in names {
            let names: Vec<&str> = names.into_iter().collect();
            for chunk in names.chunks(NAMES_PER_REQUEST) {
                self.list_instances(project, chunk, &mut listed).await?;
            }
        }
        Ok(refs
            .iter()
            .map(|r| lookup(r, &listed, |zone: &str| self.managed_zone(zone)))
            .collect())
    }

    /// Lists `project`'s instances named in `names` (at most [`NAMES_PER_REQUEST`]) into `listed`, page by
    /// page; the first error ends the look-up.
    async fn list_instances(
        &self,
        project: &str,
        names: &[&str],
        listed: &mut Listed,
    ) -> Result<(), CloudError> {
        let filter = format!("name eq \"({})\"", names.join("|"));
        let mut token = String::new();
        loop {
            turn().await?;
            let page = self
                .clients
                .instances
                .aggregated_list()
                .set_project(project)
                .set_filter(filter.clone())
                .set_max_results(PAGE_SIZE)
                .set_page_token(token.clone())
                .attributed()
                .send()
                .await
                .map_err(|e| gce_error("instances.aggregatedList", e))?;
            match listed.add_page(project, page) {
                Some(next) => token = next,
                None => return Ok(()),
            }
        }
    }

    /// The instance a `gce://<project>/<zone>/<name>` provider ID names; `None` when Compute has none.
    pub async fn instance_by_provider_id(
        &self,
        cx: &CallContext,
        provider_id: &str,
    ) -> Result<Option<Instance>, CloudError> {
        let (project, zone, name) = parse_provider_id(provider_id).ok_or_else(|| {
            CloudError::provider(format!(
                "provider ID {provider_id:?} is not gce://<project>/<zone>/<instance>"
            ))
        })?;
        let wanted = InstanceRef {
            project: project.to_owned(),
            zone: Some(zone.to_owned()),
            name: name.to_owned(),
        };
        let found = cx
            .call(
                "instances.aggregatedList",
                self.find(std::slice::from_ref(&wanted)),
            )
            .await?;
        found.into_iter().next().map_or(Ok(None), Lookup::certain)
    }

    /// The instances of `nodes`, in order; a node whose reference is bad gets its error.
    async fn find_nodes(
        &self,
        cx: &CallContext,
        nodes: &[Arc<Node>],
    ) -> Vec<Result<Option<(InstanceRef, Instance)>, CloudError>> {
        let refs: Vec<Result<InstanceRef, CloudError>> = nodes.iter().map(|n| self.instance_ref(n)).collect();
        let wanted: Vec<InstanceRef> = refs.iter().filter_map(|r| r.as_ref().ok().cloned()).collect();
        let found = match cx.call("instances.aggregatedList", self.find(&wanted)).await {
            Ok(found) => found,
            Err(error) => return nodes.iter().map(|_| Err(error.clone())).collect(),
        };
        let mut found = found.into_iter();
        refs.into_iter()
            .map(|r| {
                let r = r?;
                let lookup = found
                    .next()
                    .ok_or_else(|| CloudError::provider("no answer for the instance"))?;
                Ok(lookup.certain()?.map(|i| (r, i)))
            })
            .collect()
    }

    fn metadata(&self, project: &str, instance: &Instance) -> InstanceMetadata {
        let zone = last_component(instance.zone.as_deref().unwrap_or_default()).to_owned();
        let name = instance.name.as_deref().unwrap_or_default();
        InstanceMetadata {
            provider_id: format!("gce://{project}/{zone}/{name}"),
            instance_type: last_component(instance.machine_type.as_deref().unwrap_or_default()).to_owned(),
            node_addresses: addresses(instance, self.config.stack_type),
            region: region_of_zone(&zone).unwrap_or_default(),
            zone,
            additional_labels: Default::default(),
        }
    }
}

/// Whether a status means the VM is not running and will not be without someone starting it.
fn is_shut_down(instance: &Instance) -> bool {
    matches!(
        instance.status,
        Some(instance::Status::Terminated | instance::Status::Stopped | instance::Status::Suspended)
    )
}

/// An interface's IPv6 address, as upstream's `getIPV6AddressFromInterface`: its internal one, else (for
/// `ipv6AccessType: EXTERNAL`) its last access config's external one.
pub fn ipv6_address(nic: &NetworkInterface) -> Option<&str> {
    let address = match nic.ipv_6_address.as_deref().filter(|a| !a.is_empty()) {
        Some(address) => Some(address),
        None if nic.ipv_6_access_type == Some(Ipv6AccessType::External) => nic
            .ipv_6_access_configs
            .last()
            .and_then(|a| a.external_ipv_6.as_deref()),
        None => None,
    };
    address.filter(|a| !a.is_empty())
}

/// Upstream's `nodeAddressesFromInstance`, ordered by `stack_type`.
pub fn addresses(instance: &Instance, stack_type: StackType) -> Vec<NodeAddress> {
    let address = |type_: &str, address: &str| NodeAddress {
        type_: type_.to_owned(),
        address: address.to_owned(),
    };
    let mut v4 = Vec::new();
    let mut v6 = Vec::new();
    for nic in &instance.network_interfaces {
        if let Some(ip) = nic.network_ip.as_deref().filter(|ip| !ip.is_empty()) {
            v4.push(address("InternalIP", ip));
        }
        for access in &nic.access_configs {
            if let Some(ip) = access.nat_ip.as_deref().filter(|ip| !ip.is_empty()) {
                v4.push(address("ExternalIP", ip));
            }
        }
        if let Some(ip) = ipv6_address(nic) {
            v6.push(address("InternalIP", ip));
        }
    }
    match stack_type {
        StackType::Ipv6 => v6.into_iter().chain(v4).collect(),
        StackType::Ipv4 | StackType::Ipv4Ipv6 => v4.into_iter().chain(v6).collect(),
    }
}

#[async_trait]
impl InstancesV2 for GceProvider {
    async fn instance_exists(&self, cx: &CallContext, node: &Node) -> Result<bool, CloudError> {
        one(self.instance_exists_batch(cx, &[Arc::new(node.clone())]).await)
    }

    async fn instance_shutdown(&self, cx: &CallContext, node: &Node) -> Result<bool, CloudError> {
        one(self.instance_shutdown_batch(cx, &[Arc::new(node.clone())]).await)
    }

    async fn instance_metadata(&self, cx: &CallContext, node: &Node) -> Result<InstanceMetadata, CloudError> {
        one(self.instance_metadata_batch(cx, &[Arc::new(node.clone())]).await)
    }

    async fn instance_exists_batch(
        &self,
        cx: &CallContext,
        nodes: &[Arc<Node>],
    ) -> Vec<Result<bool, CloudError>> {
        self.find_nodes(cx, nodes)
            .await
            .into_iter()
            .map(|found| found.map(|f| f.is_some()))
            .collect()
    }

    async fn instance_shutdown_batch(
        &self,
        cx: &CallContext,
        nodes: &[Arc<Node>],
    ) -> Vec<Result<bool, CloudError>> {
        self.find_nodes(cx, nodes)
            .await
            .into_iter()
            .map(|found| match found? {
                Some((_, instance)) => Ok(is_shut_down(&instance)),
                None => Err(CloudError::InstanceNotFound),
            })
            .collect()
    }

    async fn instance_metadata_batch(
        &self,
        cx: &CallContext,
        nodes: &[Arc<Node>],
    ) -> Vec<Result<InstanceMetadata, CloudError>> {
        self.find_nodes(cx, nodes)
            .await
            .into_iter()
            .map(|found| match found? {
                Some((r, instance)) => Ok(self.metadata(&r.project, &instance)),
                None => Err(CloudError::InstanceNotFound),
            })
            .collect()
    }
}

fn one<T>(results: Vec<Result<T, CloudError>>) -> Result<T, CloudError> {
    results.into_iter().next().expect("one answer for one node")
}

#[cfg(test)]
mod tests;
