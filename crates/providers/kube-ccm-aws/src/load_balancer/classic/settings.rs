//! A classic ELB's settings beyond its listeners, subnets and groups: tags, the proxy protocol, the
//! attributes, the SSL negotiation policy and the health check, each compared with what the ELB has and
//! changed only where it differs.

use std::collections::{BTreeMap, BTreeSet};

use aws_sdk_elasticloadbalancing::types::{
    AccessLog, ConnectionDraining, ConnectionSettings, CrossZoneLoadBalancing, HealthCheck,
    LoadBalancerAttributes, LoadBalancerDescription, PolicyAttribute, Tag,
};
use kube_ccm_provider::CloudError;

use super::{Wanted, WantedAttributes, same_listener};
use crate::{AwsProvider, aws_error};

/// Upstream's proxy-protocol policy (`ProxyProtocolPolicyType`, `ProxyProtocol=true`).
const PROXY_PROTOCOL_POLICY: &str = "k8s-proxyprotocol-enabled";

/// Upstream's name for the SSL negotiation policy referring to the predefined policy `name`.
fn ssl_negotiation_policy_name(name: &str) -> String {
    format!("k8s-SSLNegotiationPolicy-{name}")
}

/// Whether the ELB's attributes are `wanted` (what the service leaves unset is not compared).
fn same_attributes(have: &LoadBalancerAttributes, wanted: &WantedAttributes) -> bool {
    let log = have.access_log();
    let draining = have.connection_draining();
    let optional = |want: Option<i32>, have: Option<i32>| want.is_none() || want == have;
    let text = |want: &Option<String>, have: Option<&str>| want.is_none() || want.as_deref() == have;
    log.is_some_and(|l| {
        l.enabled() == wanted.access_log_enabled
            && optional(wanted.access_log_emit_interval, l.emit_interval())
            && text(&wanted.access_log_bucket, l.s3_bucket_name())
            && text(&wanted.access_log_prefix, l.s3_bucket_prefix())
    }) && draining.is_some_and(|d| {
        d.enabled() == wanted.draining_enabled && optional(wanted.draining_timeout, d.timeout())
    }) && have.connection_settings().map(ConnectionSettings::idle_timeout) == Some(wanted.idle_timeout)
        && have
            .cross_zone_load_balancing()
            .map(CrossZoneLoadBalancing::enabled)
            == Some(wanted.cross_zone)
}

fn attributes(wanted: &WantedAttributes) -> LoadBalancerAttributes {
    LoadBalancerAttributes::builder()
        .access_log(
            AccessLog::builder()
                .enabled(wanted.access_log_enabled)
                .set_emit_interval(wanted.access_log_emit_interval)
                .set_s3_bucket_name(wanted.access_log_bucket.clone())
                .set_s3_bucket_prefix(wanted.access_log_prefix.clone())
                .build(),
        )
        .connection_draining(
            ConnectionDraining::builder()
                .enabled(wanted.draining_enabled)
                .set_timeout(wanted.draining_timeout)
                .build(),
        )
        .connection_settings(
            ConnectionSettings::builder()
                .idle_timeout(wanted.idle_timeout)
                .build()
                .expect("the idle timeout is set"),
        )
        .cross_zone_load_balancing(
            CrossZoneLoadBalancing::builder()
                .enabled(wanted.cross_zone)
                .build(),
        )
        .build()
}

impl AwsProvider {
    /// `additional-resource-tags` on an existing ELB: those missing or different are added.
    pub(super) async fn ensure_tags(&self, wanted: &Wanted) -> Result<(), CloudError> {
        if wanted.tags.is_empty() {
            return Ok(());
        }
        let output = self
            .elb
            .describe_tags()
            .load_balancer_names(&wanted.name)
            .send()
            .await
            .map_err(aws_error)?;
        let have: BTreeMap<&str, &str> = output
            .tag_descriptions()
            .iter()
            .flat_map(|d| d.tags())
            .map(|t| (t.key(), t.value().unwrap_or_default()))
            .collect();
        let missing: Vec<Tag> = wanted
            .tags
            .iter()
            .filter(|(k, v)| have.get(k.as_str()) != Some(&v.as_str()))
            .map(|(k, v)| Tag::builder().key(k).value(v).build().expect("a tag has a key"))
            .collect();
        if !missing.is_empty() {
            self.elb
                .add_tags()
                .load_balancer_names(&wanted.name)
                .set_tags(Some(missing))
                .send()
                .await
                .map_err(aws_error)?;
        }
        Ok(())
    }

    /// The proxy protocol on every backend port (`proxy-protocol: *`), or on none: the policy made once,
    /// each backend's set only where it differs (upstream's sync, without its create on every call).
    pub(super) async fn ensure_proxy_protocol(
        &self,
        description: &LoadBalancerDescription,
        wanted: &Wanted,
    ) -> Result<(), CloudError> {
        let has_policy = description
            .policies()
            .is_some_and(|p| p.other_policies().iter().any(|n| n == PROXY_PROTOCOL_POLICY));
        if wanted.proxy_protocol && !has_policy {
            self.elb
                .create_load_balancer_policy()
                .load_balancer_name(&wanted.name)
                .policy_name(PROXY_PROTOCOL_POLICY)
                .policy_type_name("ProxyProtocolPolicyType")
                .policy_attributes(
                    PolicyAttribute::builder()
                        .attribute_name("ProxyProtocol")
                        .attribute_value("true")
                        .build(),
                )
                .send()
                .await
                .map_err(aws_error)?;
        }
        let enabled: BTreeMap<i32, bool> = description
            .backend_server_descriptions()
            .iter()
            .filter_map(|b| {
                let on = b.policy_names().iter().any(|n| n == PROXY_PROTOCOL_POLICY);
                Some((b.instance_port()?, on))
            })
            .collect();
        let node_ports: BTreeSet<i32> = wanted.listeners.iter().map(|l| l.node_port).collect();
        let mut changes: Vec<(i32, bool)> = node_ports
            .iter()
            .filter(|port| enabled.get(port).copied().unwrap_or(false) != wanted.proxy_protocol)
            .map(|port| (*port, wanted.proxy_protocol))
            .collect();
        // Backends of ports no longer served keep their policies otherwise.
        changes.extend(
            enabled
                .iter()
                .filter(|(port, on)| **on && !node_ports.contains(port))
                .map(|(port, _)| (*port, false)),
        );
        for (port, on) in changes {
            self.elb
                .set_load_balancer_policies_for_backend_server()
                .load_balancer_name(&wanted.name)
                .instance_port(port)
                .set_policy_names(Some(if on {
                    vec![PROXY_PROTOCOL_POLICY.to_owned()]
                } else {
                    Vec::new()
                }))
                .send()
                .await
                .map_err(aws_error)?;
        }
        Ok(())
    }

    /// The attributes, synced whether or not annotated (as upstream: an ELB whose attributes were changed
    /// by hand gets upstream's defaults back).
    pub(super) async fn ensure_attributes(&self, wanted: &Wanted) -> Result<(), CloudError> {
        let output = self
            .elb
            .describe_load_balancer_attributes()
            .load_balancer_name(&wanted.name)
            .send()
            .await
            .map_err(aws_error)?;
        let same = output
            .load_balancer_attributes()
            .is_some_and(|have| same_attributes(have, &wanted.attributes));
        if !same {
            self.elb
                .modify_load_balancer_attributes()
                .load_balancer_name(&wanted.name)
                .load_balancer_attributes(attributes(&wanted.attributes))
                .send()
                .await
                .map_err(aws_error)?;
        }
        Ok(())
    }

    /// `ssl-negotiation-policy`: upstream's policy referring to the predefined one, on every TLS listener.
    pub(super) async fn ensure_ssl_negotiation_policy(
        &self,
        description: &LoadBalancerDescription,
        wanted: &Wanted,
    ) -> Result<(), CloudError> {
        let Some(predefined) = &wanted.ssl_negotiation_policy else {
            return Ok(());
        };
        let name = ssl_negotiation_policy_name(predefined);
        let exists = description
            .policies()
            .is_some_and(|p| p.other_policies().contains(&name));
        if !exists {
            self.elb
                .create_load_balancer_policy()
                .load_balancer_name(&wanted.name)
                .policy_name(&name)
                .policy_type_name("SSLNegotiationPolicyType")
                .policy_attributes(
                    PolicyAttribute::builder()
                        .attribute_name("Reference-Security-Policy")
                        .attribute_value(predefined)
                        .build(),
                )
                .send()
                .await
                .map_err(aws_error)?;
        }
        let tls = wanted
            .listeners
            .iter()
            .filter(|l| matches!(l.protocol.as_str(), "SSL" | "HTTPS"));
        for listener in tls {
            let current = description
                .listener_descriptions()
                .iter()
                .find(|d| d.listener().is_some_and(|l| same_listener(l, listener)))
                .map(|d| d.policy_names());
            if current == Some(std::slice::from_ref(&name)) {
                continue;
            }
            self.elb
                .set_load_balancer_policies_of_listener()
                .load_balancer_name(&wanted.name)
                .load_balancer_port(listener.port)
                .policy_names(&name)
                .send()
                .await
                .map_err(aws_error)?;
        }
        Ok(())
    }

    /// The health check, configured where any part differs.
    pub(super) async fn ensure_health_check(
        &self,
        description: &LoadBalancerDescription,
        wanted: &Wanted,
    ) -> Result<(), CloudError> {
        let want = &wanted.health;
        let same = description.health_check().is_some_and(|have| {
            have.target() == want.target
                && have.interval() == want.interval
                && have.timeout() == want.timeout
                && have.healthy_threshold() == want.healthy_threshold
                && have.unhealthy_threshold() == want.unhealthy_threshold
        });
        if same {
            return Ok(());
        }
        self.elb
            .configure_health_check()
            .load_balancer_name(&wanted.name)
            .health_check(
                HealthCheck::builder()
                    .target(&want.target)
                    .interval(want.interval)
                    .timeout(want.timeout)
                    .healthy_threshold(want.healthy_threshold)
                    .unhealthy_threshold(want.unhealthy_threshold)
                    .build()
                    .expect("every field is set"),
            )
            .send()
            .await
            .map_err(aws_error)?;
        Ok(())
    }
}
