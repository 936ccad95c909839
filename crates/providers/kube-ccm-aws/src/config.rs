//! The cloud-config, in upstream's INI (gcfg) format:
//!
//! ```ini
//! [Global]
//! Region = us-east-1
//! KubernetesClusterID = prod
//! NodeIPFamilies = ipv4
//! NodeIPFamilies = ipv6
//!
//! [ServiceOverride "1"]
//! Service = ec2
//! Region = us-east-1
//! URL = https://ec2.example.internal
//! SigningRegion = us-east-1
//! ```
//!
//! Section and key names are case-insensitive; values may be quoted; `;` and `#` start comments.
//! Upstream reads the file with `gcfg.FatalOnly` and ignores unknown keys silently; here they are
//! returned as warnings (the manager logs them), and a bad value is one error naming its line and key.

/// An IP family for node addresses (`NodeIPFamilies`), in the order addresses are reported.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IpFamily {
    /// Every private IPv4 address of every in-use ENI, the public IPv4, and the DNS names.
    V4,
    /// The first IPv6 address of each in-use ENI, as `InternalIP`.
    V6,
}

/// An endpoint override (`[ServiceOverride "N"]`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ServiceOverride {
    /// `ec2`, `elasticloadbalancing`/`elb`, `elasticloadbalancingv2`/`elbv2`, `kms`, …
    pub service: String,
    /// The region it applies to.
    pub region: String,
    /// The endpoint.
    pub url: String,
    /// The region requests are signed for.
    pub signing_region: String,
    /// Signing method (only SigV4 is used; kept for compatibility).
    pub signing_method: String,
    /// Signing name, when it is not the service's.
    pub signing_name: String,
}

/// `[Global]`, as upstream's `CloudConfig.Global`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CloudConfig {
    /// Legacy: the zone the manager runs in; the region is derived from it.
    pub zone: String,
    /// The AWS region.
    pub region: String,
    /// The VPC.
    pub vpc: String,
    /// The subnet for load balancers.
    pub subnet_id: String,
    /// The route table for routes.
    pub route_table_id: String,
    /// A role to assume.
    pub role_arn: String,
    /// Passed when assuming the role.
    pub source_arn: String,
    /// Legacy cluster ID (`KubernetesCluster` tag).
    pub kubernetes_cluster_tag: String,
    /// The cluster ID (`kubernetes.io/cluster/<id>` tag).
    pub kubernetes_cluster_id: String,
    /// Do not add per-load-balancer ingress rules to node security groups.
    pub disable_security_group_ingress: bool,
    /// One shared security group for every classic ELB.
    pub elb_security_group: String,
    /// Address families, in order (default `ipv4`).
    pub node_ip_families: Vec<IpFamily>,
    /// `ServiceNodePort` (default) or `Shared`.
    pub cluster_service_load_balancer_health_probe_mode: String,
    /// The shared probe's port (default 10256).
    pub cluster_service_shared_load_balancer_health_probe_port: u16,
    /// The shared probe's path (default `/healthz`).
    pub cluster_service_shared_load_balancer_health_probe_path: String,
    /// Instance types whose topology labels are required.
    pub supported_topology_instance_type_pattern: String,
    /// `Managed` or empty.
    pub nlb_security_group_mode: String,
    /// Endpoint overrides.
    pub service_overrides: Vec<ServiceOverride>,
}

pub use kube_ccm_provider::gcfg::ConfigError;
use kube_ccm_provider::gcfg::{self, Item, boolean};

/// A parsed cloud-config and what was ignored in it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Parsed {
    /// The configuration.
    pub config: CloudConfig,
    /// Unknown sections and keys, one line each (`line 7: [Global] Regoin: unknown key, ignored`).
    pub warnings: Vec<String>,
}

/// The section a key of the cloud-config belongs to.
#[derive(Debug, Clone, Copy)]
enum Section {
    Global,
    /// The `[ServiceOverride "…"]` at this index.
    Override(usize),
    /// A section this provider does not know: its keys are ignored.
    Ignored,
}

/// A cloud-config being read, item by item, for [`CloudConfig::parse`]: one method per kind of item, and
/// the checks that need the whole file at the end.
struct Reader {
    /// `[Global]` so far, with the defaults.
    config: CloudConfig,
    /// Unknown sections and keys so far.
    warnings: Vec<String>,
    /// Where the keys that follow go; an unknown section's keys go nowhere.
    section: Option<Section>,
    /// The `[ServiceOverride]` sections so far, with their header's line and their name; checked at the end.
    overrides: Vec<(usize, String, ServiceOverride)>,
}

impl Reader {
    /// A section header: `[Global]`, a named `[ServiceOverride]` (each name once), or an unknown section,
    /// whose keys are ignored with a warning; a nameless `[ServiceOverride]` is an error.
    fn open_section(&mut self, line: usize, name: &str, sub: Option<String>) -> Result<(), ConfigError> {
        let lower = name.to_ascii_lowercase();
        let section = match (lower.as_str(), &sub) {
            ("global", None) => Section::Global,
            ("serviceoverride", Some(key)) => {
                if self.overrides.iter().any(|(_, k, _)| k == key) {
                    return Err(ConfigError::new(
                        line,
                        format!("[ServiceOverride {key:?}] appears twice"),
                    ));
                }
                self.overrides
                    .push((line, key.clone(), ServiceOverride::default()));
                Section::Override(self.overrides.len() - 1)
            }
            ("serviceoverride", None) => {
                return Err(ConfigError::new(
                    line,
                    "[ServiceOverride] needs a name, e.g. [ServiceOverride \"1\"]".to_owned(),
                ));
            }
            _ => {
                let header = match &sub {
                    Some(sub) => format!("{name} {sub:?}"),
                    None => name.to_owned(),
                };
                self.warnings.push(format!(
                    "line {line}: section [{header}] is unknown, ignored with its keys"
                ));
                Section::Ignored
            }
        };
        self.section = Some(section);
        Ok(())
    }

    /// A `key = value` line, set in the section it is in; an unknown key is a warning, a bad value or a
    /// key outside any section an error.
    fn set_key(&mut self, line: usize, key: &str, value: String) -> Result<(), ConfigError> {
        let Some(section) = self.section else {
            return Err(ConfigError::new(
                line,
                format!("{key}: a key outside any section"),
            ));
        };
        match section {
            Section::Global => {
                let at = |message: &str| ConfigError::new(line, format!("[Global] {key}: {message}"));
                if !self.config.set(key, &value).map_err(|m| at(&m))? {
                    self.warnings
                        .push(format!("line {line}: [Global] {key}: unknown key, ignored"));
                }
            }
            Section::Override(index) => {
                let Some((_, _, entry)) = self.overrides.get_mut(index) else {
                    return Err(ConfigError::new(line, format!("{key}: no such section")));
                };
                let slot = match key.to_ascii_lowercase().as_str() {
                    "service" => &mut entry.service,
                    "region" => &mut entry.region,
                    "url" => &mut entry.url,
                    "signingregion" => &mut entry.signing_region,
                    "signingmethod" => &mut entry.signing_method,
                    "signingname" => &mut entry.signing_name,
                    _ => {
                        self.warnings.push(format!(
                            "line {line}: [ServiceOverride] {key}: unknown key, ignored"
                        ));
                        return Ok(());
                    }
                };
                *slot = value;
            }
            Section::Ignored => {}
        }
        Ok(())
    }

    /// The checks that need the whole file: each `[ServiceOverride]`, in file order, then the default
    /// address family and the two cluster IDs.
    fn finish(self) -> Result<Parsed, ConfigError> {
        let Reader {
            mut config,
            warnings,
            overrides,
            ..
        } = self;
        for (line, key, entry) in overrides {
            config.add_service_override(line, &key, entry)?;
        }
        if config.node_ip_families.is_empty() {
            config.node_ip_families.push(IpFamily::V4);
        }
        if !config.kubernetes_cluster_tag.is_empty()
            && !config.kubernetes_cluster_id.is_empty()
            && config.kubernetes_cluster_tag != config.kubernetes_cluster_id
        {
            return Err(ConfigError {
                line: 0,
                message: format!(
                    "[Global] KubernetesClusterTag {:?} and KubernetesClusterID {:?} differ; set one, or both equal",
                    config.kubernetes_cluster_tag, config.kubernetes_cluster_id
                ),
            });
        }
        Ok(Parsed { config, warnings })
    }
}

impl CloudConfig {
    /// Parses and validates `text`.
    pub fn parse(text: &str) -> Result<Parsed, ConfigError> {
        let mut reader = Reader {
            config: CloudConfig {
                cluster_service_shared_load_balancer_health_probe_port: 10256,
                cluster_service_shared_load_balancer_health_probe_path: "/healthz".into(),
                ..CloudConfig::default()
            },
            warnings: Vec::new(),
            section: None,
            overrides: Vec::new(),
        };
        for item in gcfg::read(text)? {
            match item {
                Item::Section { line, name, sub } => reader.open_section(line, &name, sub)?,
                Item::Key { line, key, value } => reader.set_key(line, &key, value)?,
            }
        }
        reader.finish()
    }

    /// Checks the `[ServiceOverride]` named `key` (its header at `line`) and adds it: it needs every field
    /// but the signing method and name, an http(s) URL, and no earlier override for its service and region.
    fn add_service_override(
        &mut self,
        line: usize,
        key: &str,
        entry: ServiceOverride,
    ) -> Result<(), ConfigError> {
        let error = |message: &str| ConfigError {
            line,
            message: format!("[ServiceOverride {key:?}] {message}"),
        };
        for (field, value) in [
            ("Service", &entry.service),
            ("Region", &entry.region),
            ("URL", &entry.url),
            ("SigningRegion", &entry.signing_region),
        ] {
            if value.trim().is_empty() {
                return Err(error(&format!("{field} is required")));
            }
        }
        if !entry.url.starts_with("http://") && !entry.url.starts_with("https://") {
            return Err(error(&format!("URL {:?} is not an http(s) URL", entry.url)));
        }
        let service = normalise_service(&entry.service);
        if self
            .service_overrides
            .iter()
            .any(|o| normalise_service(&o.service) == service && o.region == entry.region)
        {
            return Err(error(&format!(
                "a second override for {} in {}",
                entry.service, entry.region
            )));
        }
        self.service_overrides.push(entry);
        Ok(())
    }

    /// Sets a `[Global]` key; `Ok(false)` for an unknown key, `Err` for a bad value.
    fn set(&mut self, key: &str, value: &str) -> Result<bool, String> {
        let text = |slot: &mut String| {
            *slot = value.to_owned();
            Ok(true)
        };
        match key.to_ascii_lowercase().as_str() {
            "zone" => text(&mut self.zone),
            "region" => text(&mut self.region),
            "vpc" => text(&mut self.vpc),
            "subnetid" => text(&mut self.subnet_id),
            "routetableid" => text(&mut self.route_table_id),
            "rolearn" => text(&mut self.role_arn),
            "sourcearn" => text(&mut self.source_arn),
            "kubernetesclustertag" => text(&mut self.kubernetes_cluster_tag),
            "kubernetesclusterid" => text(&mut self.kubernetes_cluster_id),
            "elbsecuritygroup" => text(&mut self.elb_security_group),
            "supportedtopologyinstancetypepattern" => {
                regex::Regex::new(value).map_err(|e| {
                    let text = e.to_string();
                    let why = text
                        .lines()
                        .last()
                        .unwrap_or_default()
                        .trim_start_matches("error: ");
                    format!("not a regular expression: {why}")
                })?;
                text(&mut self.supported_topology_instance_type_pattern)
            }
            "clusterserviceloadbalancerhealthprobemode" => match value {
                "" | "ServiceNodePort" | "Shared" => {
                    text(&mut self.cluster_service_load_balancer_health_probe_mode)
                }
                other => Err(format!("{other:?} is not ServiceNodePort or Shared")),
            },
            "clusterservicesharedloadbalancerhealthprobepath" => {
                if !value.starts_with('/') {
                    return Err(format!("{value:?} is not a path starting with /"));
                }
                text(&mut self.cluster_service_shared_load_balancer_health_probe_path)
            }
            "clusterservicesharedloadbalancerhealthprobeport" => {
                self.cluster_service_shared_load_balancer_health_probe_port = value
                    .parse()
                    .ok()
                    .filter(|p| *p > 0)
                    .ok_or_else(|| format!("{value:?} is not a port (1-65535)"))?;
                Ok(true)
            }
            "nlbsecuritygroupmode" => match value {
                "" | "Managed" => text(&mut self.nlb_security_group_mode),
                other => Err(format!("{other:?} is not Managed or empty")),
            },
            "disablesecuritygroupingress" => {
                self.disable_security_group_ingress = boolean(value).map_err(|e| e.to_string())?;
                Ok(true)
            }
            "nodeipfamilies" => {
                let family = match value.to_ascii_lowercase().as_str() {
                    "ipv4" => IpFamily::V4,
                    "ipv6" => IpFamily::V6,
                    _ => return Err(format!("{value:?} is not ipv4 or ipv6")),
                };
                if self.node_ip_families.contains(&family) {
                    return Err(format!("{value} is listed twice"));
                }
                self.node_ip_families.push(family);
                Ok(true)
            }
            // Upstream keys this provider accepts and does not use.
            "disablestrictzonecheck" => Ok(true),
            _ => Ok(false),
        }
    }

    /// The region: `Region`, else the one `Zone` is in; empty when neither is set (the SDK's chain
    /// then decides: `AWS_REGION`, the profile, the instance metadata).
    pub fn region(&self) -> String {
        if !self.region.is_empty() {
            return self.region.clone();
        }
        region_of_zone(&self.zone).unwrap_or_default()
    }

    /// The cluster ID (`KubernetesClusterID`, else the legacy `KubernetesClusterTag`).
    pub fn cluster_id(&self) -> &str {
        if self.kubernetes_cluster_id.is_empty() {
            &self.kubernetes_cluster_tag
        } else {
            &self.kubernetes_cluster_id
        }
    }

    /// The override for `service` (`ec2`, `elb`, `elbv2`, or their long names) in `region`.
    pub fn service_override(&self, service: &str, region: &str) -> Option<&ServiceOverride> {
        let service = normalise_service(service);
        self.service_overrides
            .iter()
            .find(|o| normalise_service(&o.service) == service && o.region == region)
    }
}

/// The region an availability zone is in: `us-east-1a` → `us-east-1`, `us-west-2-lax-1a` → `us-west-2`,
/// `us-gov-west-1a` → `us-gov-west-1`.
pub fn region_of_zone(zone: &str) -> Option<String> {
    let parts: Vec<&str> = zone.split('-').collect();
    let numbered = parts
        .iter()
        .position(|p| p.starts_with(|c: char| c.is_ascii_digit()))?;
    let digits: String = parts[numbered].chars().take_while(char::is_ascii_digit).collect();
    (numbered >= 1).then(|| format!("{}-{digits}", parts[..numbered].join("-")))
}

/// A `[ServiceOverride]`'s `Service`, as upstream's releases name it: the AWS SDK for Go v1's endpoint
/// IDs (`ec2`, `elasticloadbalancing`) or v2's service IDs, which cloud-provider-aws compares since it
/// moved to v2 (`EC2`, `Elastic Load Balancing`, `Elastic Load Balancing v2`, `Auto Scaling`).
fn normalise_service(service: &str) -> &'static str {
    let service: String = service
        .chars()
        .filter(|c| !c.is_whitespace())
        .map(|c| c.to_ascii_lowercase())
        .collect();
    match service.as_str() {
        "ec2" => "ec2",
        "elb" | "elasticloadbalancing" => "elb",
        "elbv2" | "elasticloadbalancingv2" => "elbv2",
        "kms" => "kms",
        "sts" => "sts",
        "autoscaling" => "autoscaling",
        _ => "other",
    }
}

#[cfg(test)]
mod tests;
