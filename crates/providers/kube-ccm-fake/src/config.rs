//! The fake provider's `--cloud-config`.
//!
//! ```yaml
//! # Share one cloud between processes (a FakeCloudServer):
//! endpoint: http://127.0.0.1:40123
//! # …or hold a cloud in this process:
//! instances:
//!   - name: node-1
//!     instanceType: fake.large
//!     zone: fake-zone-b
//!     addresses: [{type: InternalIP, address: 10.0.0.1}]
//! latencyMs: 0
//! errorRate: 0.0
//! # Capabilities (both on by default), and the cluster ID (`has_cluster_id`).
//! loadBalancers: true
//! routes: true
//! clusterID: fake-cluster
//! # The services load balancers are made for (`LoadBalancer::classes`): these classes, and services
//! # without one unless unclassedLoadBalancers is false.
//! loadBalancerClasses: [example.com/fake]
//! unclassedLoadBalancers: true
//! # The load balancers' `ingress[].ipMode` (VIP or Proxy); none by default.
//! loadBalancerIPMode: Proxy
//! # Whether load balancers serve IPv6 too (spec.ipFamilies); true by default.
//! loadBalancerIPv6: false
//! # An instance's pod ranges, for node IPAM's cloud allocator, are its podCidrs: [10.4.1.0/24].
//! ```

use kube_ccm_provider::{InvalidClass, LoadBalancerClasses};
use serde::Deserialize;

use crate::model::FakeInstance;

/// The cloud-config.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FakeCloudConfig {
    /// URL of a shared fake cloud.
    #[serde(default)]
    pub endpoint: Option<String>,
    /// Instances of an in-process cloud.
    #[serde(default)]
    pub instances: Vec<FakeInstance>,
    /// Latency of an in-process cloud.
    #[serde(default)]
    pub latency_ms: u64,
    /// Error rate of an in-process cloud.
    #[serde(default)]
    pub error_rate: f64,
    /// Offer load balancers.
    #[serde(default = "yes")]
    pub load_balancers: bool,
    /// Offer routes.
    #[serde(default = "yes")]
    pub routes: bool,
    /// The cluster ID; `has_cluster_id` is false without one.
    #[serde(default = "cluster", rename = "clusterID")]
    pub cluster_id: Option<String>,
    /// The `spec.loadBalancerClass` values served.
    #[serde(default)]
    pub load_balancer_classes: Vec<String>,
    /// Serve services without a class.
    #[serde(default = "yes")]
    pub unclassed_load_balancers: bool,
    /// The load balancers' `ingress[].ipMode` (`VIP` or `Proxy`).
    #[serde(default, rename = "loadBalancerIPMode")]
    pub load_balancer_ip_mode: Option<String>,
    /// Whether load balancers serve IPv6 (alone or beside IPv4); true unless set false, which makes a
    /// cloud of IPv4 load balancers only.
    #[serde(default = "yes", rename = "loadBalancerIPv6")]
    pub load_balancer_ipv6: bool,
}

fn yes() -> bool {
    true
}

#[allow(clippy::unnecessary_wraps)]
fn cluster() -> Option<String> {
    Some("fake-cluster".to_owned())
}

impl Default for FakeCloudConfig {
    fn default() -> Self {
        FakeCloudConfig {
            endpoint: None,
            instances: Vec::new(),
            latency_ms: 0,
            error_rate: 0.0,
            load_balancers: true,
            routes: true,
            cluster_id: cluster(),
            load_balancer_classes: Vec::new(),
            unclassed_load_balancers: true,
            load_balancer_ip_mode: None,
            load_balancer_ipv6: true,
        }
    }
}

/// A cloud-config that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("--cloud-config: {message}")]
pub struct ConfigError {
    /// `line N: field: what` where known.
    pub message: String,
}

impl FakeCloudConfig {
    /// Parses the file's bytes (YAML or JSON), strictly.
    pub fn parse(bytes: &[u8]) -> Result<FakeCloudConfig, ConfigError> {
        let text = std::str::from_utf8(bytes).map_err(|_| ConfigError {
            message: "the file is not UTF-8 text".into(),
        })?;
        if text.trim().is_empty() {
            return Ok(FakeCloudConfig::default());
        }
        let mut path = String::new();
        let config: FakeCloudConfig = serde_saphyr::with_deserializer_from_str(text, |deserializer| {
            serde_path_to_error::deserialize(deserializer).map_err(|error| {
                path = error.path().to_string();
                error.into_inner()
            })
        })
        .map_err(|error| {
            let location = error
                .location()
                .map(|l| format!("line {}: ", l.line()))
                .unwrap_or_default();
            let mut message = error.without_snippet().to_string();
            if let Some(at) = message.rfind(" at line ") {
                message.truncate(at);
            }
            let field = if path.is_empty() || path == "." {
                String::new()
            } else {
                format!("{path}: ")
            };
            ConfigError {
                message: format!("{location}{field}{message}"),
            }
        })?;
        if config.endpoint.is_some() && !config.instances.is_empty() {
            return Err(ConfigError {
                message: "endpoint and instances are exclusive: a shared cloud has its own instances".into(),
            });
        }
        if let Some(endpoint) = &config.endpoint
            && let Err(why) = crate::server::FakeCloudClient::check_url(endpoint)
        {
            return Err(ConfigError {
                message: format!("endpoint: {why}"),
            });
        }
        if let Err(error) = config.classes() {
            return Err(ConfigError {
                message: format!("loadBalancerClasses: {error}"),
            });
        }
        if let Some(mode) = config
            .load_balancer_ip_mode
            .as_deref()
            .filter(|m| !matches!(*m, "VIP" | "Proxy"))
        {
            return Err(ConfigError {
                message: format!("loadBalancerIPMode: {mode:?} is neither VIP nor Proxy"),
            });
        }
        if !(0.0..=1.0).contains(&config.error_rate) {
            return Err(ConfigError {
                message: format!("errorRate: {} is not between 0 and 1", config.error_rate),
            });
        }
        Ok(config)
    }
}

impl FakeCloudConfig {
    /// The classes served (`loadBalancerClasses`, `unclassedLoadBalancers`).
    pub fn classes(&self) -> Result<LoadBalancerClasses, InvalidClass> {
        LoadBalancerClasses::new(self.unclassed_load_balancers, &self.load_balancer_classes)
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    proptest! {
        /// Any file is parsed or refused with one error naming the flag; never a panic.
        #[test]
        fn any_file_is_parsed_or_refused(text in prop_oneof![
            proptest::collection::vec(any::<u8>(), 0..200).prop_map(|b| String::from_utf8_lossy(&b).into_owned()),
            "((endpoint|instances|latencyMs|errorRate|loadBalancers|routes|clusterID|name|zone|x): ?[\\[\\]{}a-z0-9:/.\" ,-]{0,30}\n {0,4}(- )?){0,6}",
        ]) {
            if let Err(error) = FakeCloudConfig::parse(text.as_bytes()) {
                prop_assert!(error.to_string().starts_with("--cloud-config: "), "{}", error);
            }
        }
    }

    #[test]
    fn parses_both_forms_and_names_bad_fields() {
        let shared = FakeCloudConfig::parse(b"endpoint: http://127.0.0.1:1\n").unwrap();
        assert_eq!(shared.endpoint.as_deref(), Some("http://127.0.0.1:1"));
        assert!(shared.load_balancers && shared.routes);
        let local =
            FakeCloudConfig::parse(b"instances:\n  - name: n1\n    zone: z\nloadBalancers: false\n").unwrap();
        assert_eq!(
            (local.instances[0].zone.as_str(), local.load_balancers),
            ("z", false)
        );
        assert_eq!(FakeCloudConfig::parse(b"").unwrap(), FakeCloudConfig::default());
        let error = FakeCloudConfig::parse(b"instances:\n  - name: n1\n    zoen: z\n").unwrap_err();
        assert!(
            error
                .to_string()
                .starts_with("--cloud-config: line 3: instances[0].zoen: unknown field `zoen`"),
            "{error}"
        );
        assert!(
            FakeCloudConfig::parse(b"errorRate: 2\n")
                .unwrap_err()
                .to_string()
                .contains("errorRate")
        );
        assert!(FakeCloudConfig::parse(b"endpoint: x\ninstances: [{name: a}]\n").is_err());
        // Once a panic in the first cloud call; now one error naming the key.
        for bad in ["x", "ftp://h:1", "http://", "http://h:1/api", "http://h:1?q"] {
            let error = FakeCloudConfig::parse(format!("endpoint: {bad:?}\n").as_bytes()).unwrap_err();
            assert!(
                error.to_string().starts_with("--cloud-config: endpoint: "),
                "{bad}: {error}"
            );
        }
        assert!(FakeCloudConfig::parse(b"endpoint: http://127.0.0.1:1/\n").is_ok());
        let classed =
            FakeCloudConfig::parse(b"loadBalancerClasses: [example.com/a]\nunclassedLoadBalancers: false\n")
                .unwrap();
        let classes = classed.classes().unwrap();
        assert!(classes.serves_class(Some("example.com/a")) && !classes.serves_class(None));
        let proxy = FakeCloudConfig::parse(b"loadBalancerIPMode: Proxy\n").unwrap();
        assert_eq!(proxy.load_balancer_ip_mode.as_deref(), Some("Proxy"));
        assert_eq!(
            FakeCloudConfig::parse(b"loadBalancerIPMode: proxy\n")
                .unwrap_err()
                .to_string(),
            "--cloud-config: loadBalancerIPMode: \"proxy\" is neither VIP nor Proxy"
        );
        let error = FakeCloudConfig::parse(b"loadBalancerClasses: [Example.com/a]\n").unwrap_err();
        assert_eq!(
            error.to_string(),
            "--cloud-config: loadBalancerClasses: load-balancer class \"Example.com/a\": the prefix \"Example.com\" \
             must be a lower-case DNS subdomain (e.g. example.com)"
        );
    }
}
