//! Firewalls: made or patched only when what Compute has differs from what is wanted, compared as
//! Compute returns them; and the instances' target tags they apply to.

use std::collections::BTreeSet;

use google_cloud_compute_v1::model::{self, Firewall};
use google_cloud_lro::Poller;
use kube_ccm_provider::CloudError;

use super::{deleted, found, inserted};
use crate::client::Attributed as _;
use crate::{GceProvider, WriteError};

/// Whether the firewall Compute has is the one wanted: ranges, tags and ports as sets (Compute may list
/// them in another order), protocols in any case, an unset priority as Compute's default (1000).
pub fn firewall_matches(existing: &Firewall, wanted: &Firewall) -> bool {
    fn set(items: &[String]) -> BTreeSet<&str> {
        items.iter().map(String::as_str).collect()
    }
    fn allowed(f: &Firewall) -> BTreeSet<(String, BTreeSet<&str>)> {
        f.allowed
            .iter()
            .map(|a| {
                (
                    a.ip_protocol.as_deref().unwrap_or_default().to_ascii_lowercase(),
                    set(&a.ports),
                )
            })
            .collect()
    }
    existing.description == wanted.description
        && set(&existing.source_ranges) == set(&wanted.source_ranges)
        && set(&existing.destination_ranges) == set(&wanted.destination_ranges)
        && set(&existing.target_tags) == set(&wanted.target_tags)
        && existing.allowed.len() == wanted.allowed.len()
        && allowed(existing) == allowed(wanted)
        && existing.priority.unwrap_or(1000) == wanted.priority.unwrap_or(1000)
}

impl GceProvider {
    /// The firewall target tags: `node-tags`, else per instance the longest of its tags that prefixes its
    /// name (upstream's `computeHostTags`).
    pub(super) fn target_tags(&self, instances: &[model::Instance]) -> Result<Vec<String>, CloudError> {
        if !self.config.node_tags.is_empty() {
            return Ok(self.config.node_tags.clone());
        }
        let mut tags = BTreeSet::new();
        for instance in instances {
            let name = instance.name.as_deref().unwrap_or_default();
            let tag = instance
                .tags
                .as_ref()
                .into_iter()
                .flat_map(|t| t.items.iter())
                .filter(|t| name.starts_with(t.as_str()))
                .max_by_key(|t| t.len())
                .ok_or_else(|| {
                    CloudError::provider(format!(
                        "no node tags supplied (node-tags) and no tag of instance {name} prefixes its name"
                    ))
                })?;
            tags.insert(tag.clone());
        }
        Ok(tags.into_iter().collect())
    }

    pub(super) async fn get_firewall(&self, name: &str) -> Result<Option<Firewall>, CloudError> {
        found(
            self.clients
                .firewalls
                .get()
                .set_project(self.project())
                .set_firewall(name)
                .attributed()
                .send()
                .await,
            "firewalls.get",
        )
    }

    pub(super) async fn ensure_firewall(&self, wanted: Firewall) -> Result<(), CloudError> {
        let name = wanted.name.clone().unwrap_or_default();
        let existing = self.get_firewall(&name).await?;
        let result = match existing {
            None => {
                let done = self
                    .clients
                    .firewalls
                    .insert()
                    .set_project(self.project())
                    .set_body(wanted)
                    .attributed()
                    .poller()
                    .until_done()
                    .await;
                return inserted(WriteError::check(done), "firewalls.insert").map(|_| ());
            }
            Some(existing) => {
                if firewall_matches(&existing, &wanted) {
                    return Ok(());
                }
                self.clients
                    .firewalls
                    .patch()
                    .set_project(self.project())
                    .set_firewall(&name)
                    .set_body(wanted)
                    .attributed()
                    .poller()
                    .until_done()
                    .await
            }
        };
        WriteError::check(result).map_err(|e| e.into_cloud("firewalls.patch"))
    }

    pub(super) async fn delete_firewall(&self, name: &str) -> Result<(), CloudError> {
        let done = self
            .clients
            .firewalls
            .delete()
            .set_project(self.project())
            .set_firewall(name)
            .attributed()
            .poller()
            .until_done()
            .await;
        deleted(WriteError::check(done), "firewalls.delete")
    }

    /// A firewall letting `sources` reach `destination` (else any address) on `(protocol, ports)` of the
    /// instances tagged `tags`.
    pub(super) fn firewall(
        &self,
        name: String,
        description: String,
        sources: Vec<String>,
        destination: Option<&str>,
        (protocol, ports): (&str, Vec<String>),
        tags: Vec<String>,
    ) -> Result<Firewall, CloudError> {
        let mut allowed = model::firewall::Allowed::default();
        allowed.ip_protocol = Some(protocol.to_ascii_lowercase());
        allowed.ports = ports;
        let mut firewall = Firewall::default();
        firewall.name = Some(name);
        firewall.description = Some(description);
        firewall.network = Some(self.network_url()?);
        firewall.source_ranges = sources;
        firewall.destination_ranges = destination.into_iter().map(str::to_owned).collect();
        firewall.target_tags = tags;
        firewall.allowed = vec![allowed];
        firewall.priority = Some(1000);
        Ok(firewall)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn firewalls_compare_as_compute_returns_them() {
        let wanted: Firewall = serde_json::from_value(serde_json::json!({
            "description": "d", "sourceRanges": ["10.0.0.0/8", "192.168.0.0/16"],
            "destinationRanges": ["34.1.1.1"], "targetTags": ["a", "b"],
            "allowed": [{"IPProtocol": "tcp", "ports": ["80", "443-445"]}], "priority": 1000,
        }))
        .unwrap();
        let reordered: Firewall = serde_json::from_value(serde_json::json!({
            "description": "d", "sourceRanges": ["192.168.0.0/16", "10.0.0.0/8"],
            "destinationRanges": ["34.1.1.1"], "targetTags": ["b", "a"],
            "allowed": [{"IPProtocol": "TCP", "ports": ["443-445", "80"]}],
        }))
        .unwrap();
        assert!(firewall_matches(&reordered, &wanted));
        let mut other_port = reordered.clone();
        other_port.allowed[0].ports = vec!["80".into()];
        assert!(!firewall_matches(&other_port, &wanted));
        let mut other_source = reordered.clone();
        other_source.source_ranges.pop();
        assert!(!firewall_matches(&other_source, &wanted));
        let mut other_priority = reordered;
        other_priority.priority = Some(999);
        assert!(!firewall_matches(&other_priority, &wanted));
    }
}
