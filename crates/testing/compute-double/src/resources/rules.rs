//! Compute's rules for an IPv6 forwarding rule (`ipVersion: IPV6`), as its load-balancing documentation
//! gives them (the refusals' wording is the double's own):
//!
//! - it sends to a backend service: target pools serve IPv4 only;
//! - it names a subnetwork of its region, with an IPv6 range of its scheme's access type (`INTERNAL` for
//!   an internal rule, `EXTERNAL` for an external one);
//! - an external one is in the Premium tier;
//! - without `IPAddress` it gets a `/96` of the subnet's range; its address is written in that CIDR form
//!   either way.

use std::net::Ipv6Addr;

use serde_json::Value;

use super::{ApiError, Collection, State};

/// The `(project, scope, name)` a subnetwork link names.
fn subnet_key(link: &str) -> Option<(String, String, String)> {
    let path = link.find("projects/").map(|at| &link[at..])?;
    match path.split('/').collect::<Vec<_>>().as_slice() {
        ["projects", project, "regions", region, "subnetworks", name] => Some((
            (*project).to_owned(),
            format!("regions/{region}"),
            (*name).to_owned(),
        )),
        _ => None,
    }
}

fn is_ipv6(rule: &Value) -> bool {
    rule["ipVersion"].as_str() == Some("IPV6")
}

fn scheme(rule: &Value) -> &str {
    rule["loadBalancingScheme"].as_str().unwrap_or("EXTERNAL")
}

impl State {
    /// The subnet an IPv6 rule names, and its IPv6 range for the rule's scheme.
    fn ipv6_range(&self, project: &str, scope: &str, rule: &Value) -> Result<Ipv6Addr, ApiError> {
        let invalid = |message: String| ApiError::new(400, "invalid", message);
        let link = rule["subnetwork"].as_str().ok_or_else(|| {
            invalid("Invalid value for field 'resource.subnetwork': ''. An IPv6 forwarding rule requires a subnetwork.".into())
        })?;
        let (subnet_project, subnet_scope, name) = subnet_key(link)
            .filter(|(p, s, _)| p == project && s == scope)
            .ok_or_else(|| {
                invalid(format!(
                    "Invalid value for field 'resource.subnetwork': '{link}'. It must be a subnetwork of {scope}."
                ))
            })?;
        let subnet = self
            .get(Collection::Subnetworks, &subnet_project, &subnet_scope, &name)
            .ok_or_else(|| {
                ApiError::not_found(&format!(
                    "projects/{subnet_project}/{subnet_scope}/subnetworks/{name}"
                ))
            })?;
        let access = if scheme(rule) == "INTERNAL" {
            "INTERNAL"
        } else {
            "EXTERNAL"
        };
        let prefix = match access {
            "INTERNAL" => &subnet["internalIpv6Prefix"],
            _ => &subnet["externalIpv6Prefix"],
        };
        let range = prefix
            .as_str()
            .filter(|_| subnet["ipv6AccessType"].as_str() == Some(access))
            .and_then(|p| p.split('/').next()?.parse::<Ipv6Addr>().ok());
        range.ok_or_else(|| {
            invalid(format!(
                "Invalid value for field 'resource.subnetwork': '{link}'. The subnetwork has no {access} IPv6 range."
            ))
        })
    }

    /// Compute's refusals of an IPv6 forwarding rule; nothing for an IPv4 one.
    pub(super) fn check_rule(&self, project: &str, scope: &str, rule: &Value) -> Result<(), ApiError> {
        if !is_ipv6(rule) {
            return Ok(());
        }
        let invalid = |message: &str| ApiError::new(400, "invalid", message);
        if rule["target"]
            .as_str()
            .is_some_and(|t| t.contains("/targetPools/"))
        {
            return Err(invalid(
                "Invalid value for field 'resource.target': target pools serve IPv4 only; an IPv6 forwarding rule sends to a backend service.",
            ));
        }
        if scheme(rule) != "INTERNAL" && rule["networkTier"].as_str() == Some("STANDARD") {
            return Err(invalid(
                "Invalid value for field 'resource.networkTier': 'STANDARD'. IPv6 forwarding rules are in the Premium tier.",
            ));
        }
        self.ipv6_range(project, scope, rule).map(drop)
    }

    /// The `IPAddress` Compute writes for an IPv6 rule: a `/96` of its subnet's range when made without
    /// one, the given address as a `/96` otherwise.
    pub(super) fn ipv6_rule_address(
        &self,
        project: &str,
        scope: &str,
        rule: &Value,
        id: u64,
    ) -> Option<String> {
        if !is_ipv6(rule) {
            return None;
        }
        if let Some(given) = rule["IPAddress"].as_str() {
            return (!given.contains('/')).then(|| format!("{given}/96"));
        }
        let range = self.ipv6_range(project, scope, rule).ok()?;
        let mut segments = range.segments();
        segments[4] = 0;
        segments[5] = u16::try_from(id % 0xffff).unwrap_or(1) + 1;
        segments[6] = 0;
        segments[7] = 0;
        Some(format!("{}/96", Ipv6Addr::from(segments)))
    }
}

#[cfg(test)]
mod tests {
    use super::subnet_key;

    #[test]
    fn subnet_links_name_their_region() {
        assert_eq!(
            subnet_key("https://compute.example/compute/v1/projects/p/regions/r/subnetworks/s"),
            Some(("p".into(), "regions/r".into(), "s".into()))
        );
        assert_eq!(subnet_key("projects/p/global/networks/n"), None);
    }
}
