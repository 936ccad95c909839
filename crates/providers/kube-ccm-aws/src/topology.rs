//! Network topology labels, as upstream's `topology.k8s.aws/network-node-layer-N`: for instances of the
//! types `SupportedTopologyInstanceTypePattern` matches (cloud-config `[Global]`; upstream's default: HPC,
//! Trainium and P instances), the network nodes `DescribeInstanceTopology` lists, layer 1 first.
//!
//! As upstream: asked when a node's metadata is read and it has no `…-layer-1` label yet (so at
//! initialisation, once); an empty answer for an instance is remembered for 24 hours, and
//! `UnsupportedOperation` or `UnauthorizedOperation` for the region too (no labels, no error); any other
//! failure fails the metadata of the nodes that needed the labels, which are asked again.
//!
//! Deliberate differences: one request for up to 100 instances (upstream asks per node), and only for the
//! instance types the pattern matches (upstream asks once for every other type too, then remembers the
//! type).

use parking_lot::Mutex;
use std::collections::HashMap;
use std::time::Duration;

use aws_sdk_ec2::error::ProvideErrorMetadata;
use kube_ccm_provider::CloudError;
use regex::Regex;
use tokio::time::Instant;

use crate::{AwsProvider, aws_error};

/// The labels' prefix: `…-layer-1` is the node's first network node.
pub const LABEL_NETWORK_NODE_PREFIX: &str = "topology.k8s.aws/network-node-layer-";
/// Upstream's default `SupportedTopologyInstanceTypePattern`.
pub const DEFAULT_PATTERN: &str = r"^(hpc|trn|p)[0-9]+[a-z]*(-[a-z0-9]+)?(\.[0-9a-z]*)$";
/// Instances per request (EC2's limit for `InstanceId`).
pub const MAX_PER_REQUEST: usize = 100;
/// How long an empty answer, or a region without the API, is remembered (upstream's).
pub const REMEMBER: Duration = Duration::from_secs(24 * 3600);

/// The label of layer `layer` (from 1).
pub fn label(layer: usize) -> String {
    format!("{LABEL_NETWORK_NODE_PREFIX}{layer}")
}

/// The instance types that get topology labels, and what was found to have none.
#[derive(Debug)]
pub struct Topology {
    pattern: Regex,
    /// Instance IDs and regions with no topology, until then.
    none_until: Mutex<HashMap<String, Instant>>,
}

impl Topology {
    /// For `pattern` (the cloud-config's, checked when it was read; empty: upstream's default).
    pub fn new(pattern: &str) -> Result<Topology, regex::Error> {
        let pattern = if pattern.is_empty() {
            DEFAULT_PATTERN
        } else {
            pattern
        };
        Ok(Topology {
            pattern: Regex::new(pattern)?,
            none_until: Mutex::new(HashMap::new()),
        })
    }

    /// Whether instances of `instance_type` get topology labels.
    pub fn supports(&self, instance_type: &str) -> bool {
        !instance_type.is_empty() && self.pattern.is_match(instance_type)
    }

    fn known_none(&self, key: &str) -> bool {
        let mut none = self.none_until.lock();
        match none.get(key) {
            Some(until) if *until > Instant::now() => true,
            Some(_) => {
                none.remove(key);
                false
            }
            None => false,
        }
    }

    fn remember_none(&self, key: &str) {
        self.none_until
            .lock()
            .insert(key.to_owned(), Instant::now() + REMEMBER);
    }

    /// The instances of `wanted` (`(instance ID, instance type)`) to ask about: of a supported type, not
    /// known to have none, in a region not known to lack the API.
    pub fn to_ask<'a>(&self, region: &str, wanted: &'a [(String, String)]) -> Vec<&'a str> {
        if self.known_none(region) {
            return Vec::new();
        }
        wanted
            .iter()
            .filter(|(id, kind)| self.supports(kind) && !self.known_none(id))
            .map(|(id, _)| id.as_str())
            .collect()
    }
}

impl AwsProvider {
    /// The network nodes of `ids` (each asked once, 100 a request); an instance without any is not in the
    /// map (and remembered). The region lacking the API is no error: nothing is returned.
    pub(crate) async fn network_nodes(
        &self,
        ids: &[&str],
    ) -> Result<HashMap<String, Vec<String>>, CloudError> {
        let region = self.region.as_str();
        let mut found = HashMap::new();
        for chunk in ids.chunks(MAX_PER_REQUEST) {
            let mut token: Option<String> = None;
            loop {
                let answer = self
                    .ec2
                    .describe_instance_topology()
                    .set_instance_ids(Some(chunk.iter().map(|id| (*id).to_owned()).collect()))
                    .set_next_token(token.clone())
                    .send()
                    .await;
                let output = match answer {
                    Ok(output) => output,
                    Err(error)
                        if matches!(
                            error.code(),
                            Some("UnsupportedOperation" | "UnauthorizedOperation")
                        ) =>
                    {
                        tracing::info!(%region, code = ?error.code(), "aws: no instance topology in this region; no topology labels");
                        self.topology.remember_none(region);
                        return Ok(HashMap::new());
                    }
                    Err(error) => return Err(aws_error(error)),
                };
                for instance in output.instances() {
                    if let Some(id) = instance.instance_id() {
                        let nodes = instance.network_nodes().to_vec();
                        if !nodes.is_empty() {
                            found.insert(id.to_owned(), nodes);
                        }
                    }
                }
                match output.next_token().filter(|t| !t.is_empty()) {
                    Some(next) if Some(next) != token.as_deref() => token = Some(next.to_owned()),
                    _ => break,
                }
            }
        }
        for id in ids {
            if !found.contains_key(*id) {
                self.topology.remember_none(id);
            }
        }
        Ok(found)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn upstreams_default_pattern_and_an_override() {
        let topology = Topology::new("").unwrap();
        for supported in [
            "hpc6a.48xlarge",
            "hpc7g.16xlarge",
            "p3dn.24xlarge",
            "p4d.24xlarge",
            "p5.48xlarge",
            "p5en.48xlarge",
            "p6e-gb200.36xlarge",
            "p6-b200.48xlarge",
            "trn1.32xlarge",
            "trn2u.48xlarge",
        ] {
            assert!(topology.supports(supported), "{supported}");
        }
        for other in [
            "m6g.large",
            "t3.large",
            "c3.large",
            "m5.large",
            "inf2.48xlarge",
            "",
        ] {
            assert!(!topology.supports(other), "{other}");
        }
        let custom = Topology::new("t3.large").unwrap();
        assert!(custom.supports("t3.large") && !custom.supports("trn2.48xlarge"));
        assert_eq!(label(1), "topology.k8s.aws/network-node-layer-1");
    }

    #[tokio::test(start_paused = true)]
    async fn what_has_none_is_not_asked_again_for_a_day() {
        let topology = Topology::new("").unwrap();
        let wanted = vec![
            ("i-1".to_owned(), "p5.48xlarge".to_owned()),
            ("i-2".to_owned(), "m5.large".to_owned()),
            ("i-3".to_owned(), "trn1.32xlarge".to_owned()),
        ];
        assert_eq!(topology.to_ask("us-east-1", &wanted), ["i-1", "i-3"]);
        topology.remember_none("i-1");
        assert_eq!(topology.to_ask("us-east-1", &wanted), ["i-3"]);
        topology.remember_none("us-east-1");
        assert!(topology.to_ask("us-east-1", &wanted).is_empty());
        assert_eq!(topology.to_ask("eu-west-1", &wanted), ["i-3"]);
        tokio::time::advance(REMEMBER + Duration::from_secs(1)).await;
        assert_eq!(topology.to_ask("us-east-1", &wanted), ["i-1", "i-3"]);
    }
}
