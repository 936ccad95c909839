//! `gce.conf`, in upstream's INI (gcfg) format:
//!
//! ```ini
//! [global]
//! project-id = my-project
//! local-zone = us-central1-a
//! network-name = default
//! node-tags = my-cluster-node
//! multizone = true
//! ```
//!
//! Keys as upstream's `ConfigGlobal`; section and key names are case-insensitive; a key given twice is a
//! list (`node-tags`, `alpha-features`). Unknown keys are warnings (upstream ignores them silently); a bad
//! value is one error naming its line and key.
//!
//! Differences from upstream, on purpose:
//! - `project-id` and `local-zone` may be left out, as upstream: they are then read from the metadata
//!   server ([`crate::metadata`]), and without one the manager stops at start naming the key.
//! - `token-url` other than empty or `nil` (a custom token endpoint) is refused: credentials come from
//!   Application Default Credentials. An `api-endpoint` over plain `http://` (a local test double) is
//!   called without credentials: a token is never sent in clear text.

use kube_ccm_provider::gcfg::{self, ConfigError, Item, boolean};

/// The IP stacks nodes have (`stack-type`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum StackType {
    /// IPv4 only (the default).
    #[default]
    Ipv4,
    /// IPv6 only: IPv6 addresses are listed first.
    Ipv6,
    /// Dual stack, IPv4 first.
    Ipv4Ipv6,
}

/// `[global]`, as upstream's `ConfigGlobal`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CloudConfig {
    /// `token-url`: empty or `nil` (Application Default Credentials).
    pub token_url: String,
    /// `project-id`: the project the cluster's instances are in.
    pub project_id: String,
    /// `network-project-id`: the shared-VPC host project, when the network is in another project.
    pub network_project_id: String,
    /// `network-name`: a name, or a URL if it contains `/`.
    pub network_name: String,
    /// `subnetwork-name`: a name, or a URL if it contains `/`.
    pub subnetwork_name: String,
    /// `secondary-range-name` (deprecated upstream; kept).
    pub secondary_range_name: String,
    /// `stack-type`.
    pub stack_type: StackType,
    /// `node-tags`: the firewall target tags of the nodes.
    pub node_tags: Vec<String>,
    /// `node-instance-prefix`.
    pub node_instance_prefix: String,
    /// `regional`: the cluster spans the region's zones.
    pub regional: bool,
    /// `multizone`: nodes may be in any zone of the region.
    pub multizone: bool,
    /// `api-endpoint`: the Compute API's base (`https://www.googleapis.com/compute/v1/`).
    pub api_endpoint: String,
    /// `container-api-endpoint` (read for compatibility; not used).
    pub container_api_endpoint: String,
    /// `local-zone`: the zone the control plane is in.
    pub local_zone: String,
    /// `alpha-features`.
    pub alpha_features: Vec<String>,
}

/// A parsed `gce.conf` and what was ignored in it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Parsed {
    /// The configuration.
    pub config: CloudConfig,
    /// Unknown sections and keys, one line each.
    pub warnings: Vec<String>,
}

impl CloudConfig {
    /// Parses and validates `text`.
    pub fn parse(text: &str) -> Result<Parsed, ConfigError> {
        let mut config = CloudConfig::default();
        let mut warnings = Vec::new();
        let mut in_global = false;
        for item in gcfg::read(text)? {
            match item {
                Item::Section { line, name, sub } => {
                    in_global = name.eq_ignore_ascii_case("global") && sub.is_none();
                    if !in_global {
                        let header = match &sub {
                            Some(sub) => format!("{name} {sub:?}"),
                            None => name,
                        };
                        warnings.push(format!(
                            "line {line}: section [{header}] is unknown, ignored with its keys"
                        ));
                    }
                }
                Item::Key { line, key, value } if in_global => {
                    if !config
                        .set(&key, &value)
                        .map_err(|m| ConfigError::new(line, format!("[global] {key}: {m}")))?
                    {
                        warnings.push(format!("line {line}: [global] {key}: unknown key, ignored"));
                    }
                }
                Item::Key { .. } => {}
            }
        }
        if !config.local_zone.is_empty() {
            config.check_zone()?;
        }
        Ok(Parsed { config, warnings })
    }

    /// `local-zone` names a zone (like `us-central1-a`).
    fn check_zone(&self) -> Result<(), ConfigError> {
        if self.region().is_none() {
            return Err(ConfigError::new(
                0,
                format!(
                    "[global] local-zone {:?} is not a zone (like us-central1-a)",
                    self.local_zone
                ),
            ));
        }
        Ok(())
    }

    /// The configuration is complete: `project-id` and `local-zone` are set (from the file, or the
    /// [metadata server](crate::metadata)), and the zone is one.
    pub fn check(&self) -> Result<(), ConfigError> {
        for (key, value) in [("project-id", &self.project_id), ("local-zone", &self.local_zone)] {
            if value.is_empty() {
                return Err(ConfigError::new(0, format!("[global] {key} is required")));
            }
        }
        self.check_zone()
    }

    /// Sets a `[global]` key; `Ok(false)` for an unknown key, `Err` for a bad value.
    fn set(&mut self, key: &str, value: &str) -> Result<bool, String> {
        let one = |slot: &mut String| {
            *slot = value.to_owned();
            Ok(true)
        };
        match key.to_ascii_lowercase().as_str() {
            "token-url" => {
                if !value.is_empty() && value != "nil" {
                    return Err(format!(
                        "{value:?}: only Application Default Credentials are supported (leave it empty or nil)"
                    ));
                }
                one(&mut self.token_url)
            }
            // Upstream sends it with `token-url`; there is nothing to send it to here.
            "token-body" => Ok(true),
            "project-id" => one(&mut self.project_id),
            "network-project-id" => one(&mut self.network_project_id),
            "network-name" => one(&mut self.network_name),
            "subnetwork-name" => one(&mut self.subnetwork_name),
            "secondary-range-name" => one(&mut self.secondary_range_name),
            "stack-type" => {
                self.stack_type = match value.to_ascii_uppercase().as_str() {
                    "" | "IPV4" => StackType::Ipv4,
                    "IPV6" => StackType::Ipv6,
                    "IPV4_IPV6" => StackType::Ipv4Ipv6,
                    _ => return Err(format!("{value:?} is not IPV4, IPV6 or IPV4_IPV6")),
                };
                Ok(true)
            }
            "node-tags" => {
                self.node_tags.push(value.to_owned());
                Ok(true)
            }
            "node-instance-prefix" => one(&mut self.node_instance_prefix),
            "regional" => {
                self.regional = boolean(value).map_err(|e| e.to_string())?;
                Ok(true)
            }
            "multizone" => {
                self.multizone = boolean(value).map_err(|e| e.to_string())?;
                Ok(true)
            }
            "api-endpoint" => {
                if !value.is_empty() && !value.starts_with("http://") && !value.starts_with("https://") {
                    return Err(format!("{value:?} is not an http(s) URL"));
                }
                one(&mut self.api_endpoint)
            }
            "container-api-endpoint" => one(&mut self.container_api_endpoint),
            "local-zone" => one(&mut self.local_zone),
            "alpha-features" => {
                self.alpha_features.push(value.to_owned());
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    /// The region of `local-zone` (`us-central1-a` → `us-central1`).
    pub fn region(&self) -> Option<String> {
        region_of_zone(&self.local_zone)
    }

    /// Whether instances may be in other zones of the region than `local-zone`.
    pub fn all_zones(&self) -> bool {
        self.multizone || self.regional
    }

    /// The project the network is in.
    pub fn network_project(&self) -> &str {
        if self.network_project_id.is_empty() {
            &self.project_id
        } else {
            &self.network_project_id
        }
    }

    /// The network's path, `projects/P/global/networks/N` (from a name or a URL); `None` when unset.
    pub fn network_path(&self) -> Option<String> {
        let name = self.network_name.trim();
        if name.is_empty() {
            return None;
        }
        Some(match name.find("projects/") {
            Some(at) if name.contains('/') => name[at..].to_owned(),
            _ => format!("projects/{}/global/networks/{name}", self.network_project()),
        })
    }

    /// The client's endpoint: `api-endpoint` without its `compute/v1/` path (the client adds it).
    pub fn endpoint(&self) -> Option<String> {
        let endpoint = self.api_endpoint.trim();
        if endpoint.is_empty() {
            return None;
        }
        let endpoint = endpoint.trim_end_matches('/');
        let endpoint = endpoint.strip_suffix("/compute/v1").unwrap_or(endpoint);
        Some(endpoint.to_owned())
    }

    /// Whether calls go without credentials (a plain-HTTP endpoint: a local double).
    pub fn anonymous(&self) -> bool {
        self.api_endpoint.starts_with("http://")
    }
}

/// The region of a zone: the zone up to its last `-` (`europe-west1-b` → `europe-west1`).
pub fn region_of_zone(zone: &str) -> Option<String> {
    let (region, suffix) = zone.rsplit_once('-')?;
    (!region.is_empty() && !suffix.is_empty() && region.contains('-')).then(|| region.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    const UPSTREAM: &str = "\
[global]
project-id = my-project
network-project-id = host-project
network-name = my-net
subnetwork-name = my-subnet
node-tags = a-node
node-tags = b-node
node-instance-prefix = gke-cluster
multizone = true
local-zone = us-central1-b
token-url = nil
stack-type = IPV4_IPV6
api-endpoint = https://www.googleapis.com/compute/v1/
alpha-features = ILBSubsets
";

    #[test]
    fn upstreams_keys_are_read() {
        let parsed = CloudConfig::parse(UPSTREAM).unwrap();
        assert!(parsed.warnings.is_empty(), "{:?}", parsed.warnings);
        let c = parsed.config;
        assert_eq!(c.project_id, "my-project");
        assert_eq!(c.node_tags, ["a-node", "b-node"]);
        assert!(c.multizone && !c.regional && c.all_zones());
        assert_eq!(c.region().as_deref(), Some("us-central1"));
        assert_eq!(c.stack_type, StackType::Ipv4Ipv6);
        assert_eq!(c.alpha_features, ["ILBSubsets"]);
        assert_eq!(
            c.network_path().as_deref(),
            Some("projects/host-project/global/networks/my-net")
        );
        assert_eq!(c.endpoint().as_deref(), Some("https://www.googleapis.com"));
        assert!(!c.anonymous());
    }

    #[test]
    fn networks_given_as_urls_and_local_endpoints() {
        let c = CloudConfig::parse(
            "[Global]\nproject-id = p\nlocal-zone = europe-west1-d\n\
             network-name = https://www.googleapis.com/compute/v1/projects/h/global/networks/n\n\
             api-endpoint = http://127.0.0.1:9/compute/v1/\n",
        )
        .unwrap()
        .config;
        assert_eq!(c.network_path().as_deref(), Some("projects/h/global/networks/n"));
        assert_eq!(c.endpoint().as_deref(), Some("http://127.0.0.1:9"));
        assert!(c.anonymous());
        assert!(!c.all_zones());
    }

    #[test]
    fn unknown_keys_warn_and_bad_values_are_one_error_naming_line_and_key() {
        let parsed = CloudConfig::parse(
            "[global]\nproject-id = p\nlocal-zone = us-east1-b\nprojct-id = q\n[other]\nx = 1\n",
        )
        .unwrap();
        assert_eq!(
            parsed.warnings,
            [
                "line 4: [global] projct-id: unknown key, ignored",
                "line 5: section [other] is unknown, ignored with its keys"
            ]
        );
        // `[global "x"]` is not `[global]`: named so, and its keys change nothing.
        let parsed = CloudConfig::parse("[global \"x\"]\nproject-id = q\n").unwrap();
        assert_eq!(
            parsed.warnings,
            ["line 1: section [global \"x\"] is unknown, ignored with its keys"]
        );
        assert_eq!(parsed.config.project_id, "");
        let cases = [
            (
                "[global]\nmultizone = maybe\n",
                "cloud-config line 2: [global] multizone: \"maybe\" is not a boolean",
            ),
            (
                "[global]\nstack-type = IPV5\n",
                "cloud-config line 2: [global] stack-type: \"IPV5\" is not IPV4",
            ),
            (
                "[global]\ntoken-url = https://x/token\n",
                "cloud-config line 2: [global] token-url: \"https://x/token\": only Application Default",
            ),
            (
                "[global]\napi-endpoint = ftp://x\n",
                "cloud-config line 2: [global] api-endpoint: \"ftp://x\" is not an http(s) URL",
            ),
            (
                "[global]\nproject-id = p\nlocal-zone = zone\n",
                "cloud-config: [global] local-zone \"zone\" is not a zone",
            ),
        ];
        for (text, expected) in cases {
            let error = CloudConfig::parse(text).unwrap_err().to_string();
            assert!(error.starts_with(expected), "{text:?}: {error}");
        }
        // Left out, they come from the metadata server; still missing after it, the check says so.
        let partial = CloudConfig::parse("[global]\nnetwork-name = default\n")
            .unwrap()
            .config;
        assert_eq!(
            partial.check().unwrap_err().to_string(),
            "cloud-config: [global] project-id is required"
        );
    }

    #[test]
    fn zones_map_to_regions() {
        assert_eq!(region_of_zone("us-central1-a").as_deref(), Some("us-central1"));
        assert_eq!(
            region_of_zone("europe-west12-c").as_deref(),
            Some("europe-west12")
        );
        assert_eq!(region_of_zone("zone"), None);
        assert_eq!(region_of_zone("us-"), None);
    }
}
