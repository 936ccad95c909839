//! What a `type: LoadBalancer` service asks of its load balancer, read as upstream's
//! `k8s.io/cloud-provider/service/helpers` reads it, so every provider reads a service alike: who may
//! connect, whether traffic stays on the node it arrives at, the health check that follows from that,
//! which implementation the service wants, and which IP families it asks for.

use k8s_openapi::api::core::v1::{LoadBalancerStatus, Service};

use crate::names::FINALIZER_LOAD_BALANCER_CLEANUP;
use crate::{Cidr, CloudError};

/// The annotation that gives the client source ranges when `spec.loadBalancerSourceRanges` does not
/// (comma-separated CIDRs).
pub const ANNOTATION_LOAD_BALANCER_SOURCE_RANGES: &str =
    "service.beta.kubernetes.io/load-balancer-source-ranges";
/// The path kube-proxy answers a service's health check on.
pub const HEALTH_CHECK_PATH: &str = "/healthz";
/// Everyone: the source range of a service that names none.
pub const ALLOW_ALL: &str = "0.0.0.0/0";

/// The service's annotation `key`.
pub fn annotation<'a>(service: &'a Service, key: &str) -> Option<&'a str> {
    service
        .metadata
        .annotations
        .as_ref()?
        .get(key)
        .map(String::as_str)
}

/// `namespace/name` (a missing namespace is `default`).
pub fn service_key(service: &Service) -> String {
    format!(
        "{}/{}",
        service.metadata.namespace.as_deref().unwrap_or("default"),
        service.metadata.name.as_deref().unwrap_or_default()
    )
}

/// The service's `spec.type`.
pub(crate) fn service_type(service: &Service) -> Option<&str> {
    service.spec.as_ref()?.type_.as_deref()
}

/// The ranges clients may connect from, as the service names them: `spec.loadBalancerSourceRanges`, else
/// the [`ANNOTATION_LOAD_BALANCER_SOURCE_RANGES`] annotation; `None` when it names none. Each range is
/// its network (`10.0.0.1/8` is `10.0.0.0/8`); sorted, without repeats. A range that is not a CIDR is
/// one error naming the field, upstream's words.
pub fn requested_source_ranges(service: &Service) -> Result<Option<Vec<Cidr>>, CloudError> {
    let field = service
        .spec
        .as_ref()
        .and_then(|s| s.load_balancer_source_ranges.as_ref())
        .filter(|r| !r.is_empty());
    if let Some(ranges) = field {
        return parse_ranges(ranges.iter().map(String::as_str))
            .map(Some)
            .map_err(|_| {
                CloudError::provider(format!(
                    "service.Spec.LoadBalancerSourceRanges: {ranges:?} is not valid. Expecting a list of IP ranges. For example, 10.0.0.0/24"
                ))
            });
    }
    let Some(value) = annotation(service, ANNOTATION_LOAD_BALANCER_SOURCE_RANGES).map(str::trim) else {
        return Ok(None);
    };
    if value.is_empty() {
        return Ok(None);
    }
    parse_ranges(value.split(',')).map(Some).map_err(|_| {
        CloudError::provider(format!(
            "{ANNOTATION_LOAD_BALANCER_SOURCE_RANGES}: {value} is not valid. Expecting a comma-separated list of source IP ranges. For example, 10.0.0.0/24,192.168.2.0/24"
        ))
    })
}

/// Upstream's `GetLoadBalancerSourceRanges`: [`requested_source_ranges`], else everyone
/// ([`ALLOW_ALL`]).
pub fn load_balancer_source_ranges(service: &Service) -> Result<Vec<Cidr>, CloudError> {
    Ok(requested_source_ranges(service)?.unwrap_or_else(|| vec![ALLOW_ALL.parse().expect("a CIDR")]))
}

fn parse_ranges<'a>(items: impl Iterator<Item = &'a str>) -> Result<Vec<Cidr>, ()> {
    let mut ranges: Vec<Cidr> = items
        .map(|item| item.trim().parse::<Cidr>().map(|c| c.network()))
        .collect::<Result<_, _>>()
        .map_err(drop)?;
    ranges.sort_by_key(ToString::to_string);
    ranges.dedup();
    Ok(ranges)
}

/// Whether the ranges let everyone in (hold `0.0.0.0/0`), as upstream's `IsAllowAll`.
pub fn is_allow_all(ranges: &[Cidr]) -> bool {
    ranges.iter().any(|r| r.to_string() == ALLOW_ALL)
}

/// Whether the service keeps external traffic on the node it arrives at (`externalTrafficPolicy:
/// Local`, for `LoadBalancer` and `NodePort` services).
pub fn requests_only_local_traffic(service: &Service) -> bool {
    matches!(service_type(service), Some("LoadBalancer" | "NodePort"))
        && service
            .spec
            .as_ref()
            .and_then(|s| s.external_traffic_policy.as_deref())
            == Some("Local")
}

/// Whether the load balancer must check each node's own endpoints (a `LoadBalancer` service with local
/// traffic).
pub fn needs_health_check(service: &Service) -> bool {
    service_type(service) == Some("LoadBalancer") && requests_only_local_traffic(service)
}

/// The health check kube-proxy serves for the service: [`HEALTH_CHECK_PATH`] on its
/// `healthCheckNodePort`; `None` when it needs none (or has no port yet).
pub fn health_check_path_port(service: &Service) -> Option<(&'static str, i32)> {
    if !needs_health_check(service) {
        return None;
    }
    let port = service
        .spec
        .as_ref()?
        .health_check_node_port
        .filter(|p| *p != 0)?;
    Some((HEALTH_CHECK_PATH, port))
}

/// The service's `spec.loadBalancerClass`: `None` for the cloud provider's default load balancer.
pub fn load_balancer_class(service: &Service) -> Option<&str> {
    service.spec.as_ref()?.load_balancer_class.as_deref()
}

/// Whether the service is a `LoadBalancer` for the cloud provider's default implementation (no
/// `loadBalancerClass`): what the service controller hands to a provider that declares no classes
/// ([`LoadBalancerClasses`](crate::LoadBalancerClasses)).
pub fn wants_default_load_balancer(service: &Service) -> bool {
    crate::LoadBalancerClasses::default().serves(service)
}

/// An IP family of a service (`spec.ipFamilies`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum IpFamily {
    /// `IPv4`.
    Ipv4,
    /// `IPv6`.
    Ipv6,
}

impl std::fmt::Display for IpFamily {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            IpFamily::Ipv4 => "IPv4",
            IpFamily::Ipv6 => "IPv6",
        })
    }
}

/// `spec.ipFamilyPolicy`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IpFamilyPolicy {
    /// `SingleStack` (also when unset or unknown).
    SingleStack,
    /// `PreferDualStack`: both families where the cluster has them, one otherwise.
    PreferDualStack,
    /// `RequireDualStack`: both families.
    RequireDualStack,
}

/// The IP families the service's load balancer should serve: `spec.ipFamilies`, in its order (the API
/// server fills it from `spec.ipFamilyPolicy` and the cluster's families; the first, the primary, never
/// changes). IPv4 when it names none; names other than `IPv4` and `IPv6` are left out.
pub fn ip_families(service: &Service) -> Vec<IpFamily> {
    let mut families: Vec<IpFamily> = Vec::with_capacity(2);
    let named = service.spec.as_ref().and_then(|s| s.ip_families.as_ref());
    for name in named.into_iter().flatten() {
        let family = match name.as_str() {
            "IPv4" => IpFamily::Ipv4,
            "IPv6" => IpFamily::Ipv6,
            _ => continue,
        };
        if !families.contains(&family) {
            families.push(family);
        }
    }
    if families.is_empty() {
        families.push(IpFamily::Ipv4);
    }
    families
}

/// The service's `spec.ipFamilyPolicy`.
pub fn ip_family_policy(service: &Service) -> IpFamilyPolicy {
    match service.spec.as_ref().and_then(|s| s.ip_family_policy.as_deref()) {
        Some("PreferDualStack") => IpFamilyPolicy::PreferDualStack,
        Some("RequireDualStack") => IpFamilyPolicy::RequireDualStack,
        _ => IpFamilyPolicy::SingleStack,
    }
}

/// Whether the service carries the load-balancer cleanup finalizer.
pub fn has_load_balancer_finalizer(service: &Service) -> bool {
    service
        .metadata
        .finalizers
        .iter()
        .flatten()
        .any(|f| f == FINALIZER_LOAD_BALANCER_CLEANUP)
}

/// Whether two statuses have the same ingress points, as upstream's `LoadBalancerStatusEqual`.
pub fn load_balancer_status_equal(left: &LoadBalancerStatus, right: &LoadBalancerStatus) -> bool {
    let ingress = |s: &LoadBalancerStatus| s.ingress.clone().unwrap_or_default();
    ingress(left) == ingress(right)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn service(value: serde_json::Value) -> Service {
        serde_json::from_value(value).unwrap()
    }

    #[test]
    fn families_are_spec_ip_families_in_order_and_ipv4_without_them() {
        let families = |spec: serde_json::Value| ip_families(&service(serde_json::json!({"spec": spec})));
        assert_eq!(families(serde_json::json!({})), [IpFamily::Ipv4]);
        assert_eq!(
            families(serde_json::json!({"ipFamilies": ["IPv6", "IPv4"]})),
            [IpFamily::Ipv6, IpFamily::Ipv4]
        );
        assert_eq!(
            families(serde_json::json!({"ipFamilies": ["IPv6", "IPX", "IPv6"]})),
            [IpFamily::Ipv6]
        );
        assert_eq!(
            families(serde_json::json!({"ipFamilies": ["IPX"]})),
            [IpFamily::Ipv4]
        );
        let policy =
            |value: &str| ip_family_policy(&service(serde_json::json!({"spec": {"ipFamilyPolicy": value}})));
        assert_eq!(policy("RequireDualStack"), IpFamilyPolicy::RequireDualStack);
        assert_eq!(policy("PreferDualStack"), IpFamilyPolicy::PreferDualStack);
        assert_eq!(policy("SingleStack"), IpFamilyPolicy::SingleStack);
        assert_eq!(policy("Other"), IpFamilyPolicy::SingleStack);
        assert_eq!(IpFamily::Ipv6.to_string(), "IPv6");
    }

    fn with_ranges(field: Option<&str>, annotation: Option<&str>) -> Service {
        let mut value = serde_json::json!({"metadata": {"name": "web"}, "spec": {"type": "LoadBalancer"}});
        if let Some(field) = field {
            value["spec"]["loadBalancerSourceRanges"] = field.split(',').collect::<Vec<_>>().into();
        }
        if let Some(annotation) = annotation {
            value["metadata"]["annotations"] =
                serde_json::json!({ANNOTATION_LOAD_BALANCER_SOURCE_RANGES: annotation});
        }
        service(value)
    }

    fn texts(ranges: &[Cidr]) -> Vec<String> {
        ranges.iter().map(ToString::to_string).collect()
    }

    #[test]
    fn source_ranges_are_upstreams_from_the_field_or_the_annotation() {
        for bad in [
            "10.0.0.1/33",
            "foo.bar",
            "10.0.0.1/32,*",
            "10.0.0.1/32,",
            "10.0.0.1/32, ",
            "10.0.0.1",
        ] {
            let field = load_balancer_source_ranges(&with_ranges(Some(bad), None)).unwrap_err();
            assert!(
                field
                    .to_string()
                    .contains("service.Spec.LoadBalancerSourceRanges"),
                "{bad}: {field}"
            );
            let annotated = load_balancer_source_ranges(&with_ranges(None, Some(bad))).unwrap_err();
            assert!(
                annotated
                    .to_string()
                    .contains(ANNOTATION_LOAD_BALANCER_SOURCE_RANGES),
                "{bad}: {annotated}"
            );
        }
        let cases = [
            ("192.168.0.1/32", vec!["192.168.0.1/32"]),
            ("192.168.0.1/32,192.168.0.1/32", vec!["192.168.0.1/32"]),
            (
                "192.168.0.2/32,192.168.0.1/32",
                vec!["192.168.0.1/32", "192.168.0.2/32"],
            ),
            (
                "  192.168.0.1/32 , 192.168.0.2/32   ",
                vec!["192.168.0.1/32", "192.168.0.2/32"],
            ),
            ("10.1.2.3/8,2001:db8::1/32", vec!["10.0.0.0/8", "2001:db8::/32"]),
        ];
        for (text, wanted) in cases {
            for service in [with_ranges(Some(text), None), with_ranges(None, Some(text))] {
                assert_eq!(
                    texts(&load_balancer_source_ranges(&service).unwrap()),
                    wanted,
                    "{text}"
                );
            }
        }
        // The field wins over the annotation.
        let both = with_ranges(Some("10.0.0.0/8"), Some("192.168.0.0/16"));
        assert_eq!(
            texts(&load_balancer_source_ranges(&both).unwrap()),
            ["10.0.0.0/8"]
        );
        // Neither, or an empty annotation: everyone.
        for none in [with_ranges(None, None), with_ranges(None, Some("  "))] {
            assert_eq!(requested_source_ranges(&none).unwrap(), None);
            let ranges = load_balancer_source_ranges(&none).unwrap();
            assert_eq!(texts(&ranges), [ALLOW_ALL]);
            assert!(is_allow_all(&ranges));
        }
        assert!(!is_allow_all(&load_balancer_source_ranges(&both).unwrap()));
    }

    #[test]
    fn local_traffic_and_the_health_check_follow_the_type_and_policy() {
        let cases = [
            // type, policy, health check node port → local, needs a check, the check
            ("ClusterIP", Some("Local"), 0, false, false, None),
            ("NodePort", None, 0, false, false, None),
            ("NodePort", Some("Cluster"), 0, false, false, None),
            ("NodePort", Some("Local"), 0, true, false, None),
            ("LoadBalancer", Some("Cluster"), 31000, false, false, None),
            ("LoadBalancer", Some("Local"), 0, true, true, None),
            (
                "LoadBalancer",
                Some("Local"),
                31000,
                true,
                true,
                Some(("/healthz", 31000)),
            ),
        ];
        for (kind, policy, port, local, needs, check) in cases {
            let s = service(serde_json::json!({"spec": {
                "type": kind, "externalTrafficPolicy": policy, "healthCheckNodePort": port,
            }}));
            assert_eq!(requests_only_local_traffic(&s), local, "{kind} {policy:?}");
            assert_eq!(needs_health_check(&s), needs, "{kind} {policy:?}");
            assert_eq!(health_check_path_port(&s), check, "{kind} {policy:?} {port}");
        }
    }

    #[test]
    fn class_finalizer_status_and_key() {
        let default = service(
            serde_json::json!({"metadata": {"name": "web", "finalizers": [FINALIZER_LOAD_BALANCER_CLEANUP]}, "spec": {"type": "LoadBalancer"}}),
        );
        assert!(wants_default_load_balancer(&default) && has_load_balancer_finalizer(&default));
        assert_eq!(service_key(&default), "default/web");
        let classed = service(
            serde_json::json!({"metadata": {"name": "web", "namespace": "shop"}, "spec": {"type": "LoadBalancer", "loadBalancerClass": "example.com/lb"}}),
        );
        assert_eq!(load_balancer_class(&classed), Some("example.com/lb"));
        assert!(!wants_default_load_balancer(&classed) && !has_load_balancer_finalizer(&classed));
        assert_eq!(service_key(&classed), "shop/web");
        let node_port = service(serde_json::json!({"spec": {"type": "NodePort"}}));
        assert!(!wants_default_load_balancer(&node_port));

        let status = |ips: &[&str]| -> LoadBalancerStatus {
            serde_json::from_value(serde_json::json!({"ingress": ips.iter().map(|ip| serde_json::json!({"ip": ip})).collect::<Vec<_>>()})).unwrap()
        };
        assert!(load_balancer_status_equal(
            &status(&["1.1.1.1"]),
            &status(&["1.1.1.1"])
        ));
        assert!(!load_balancer_status_equal(
            &status(&["1.1.1.1"]),
            &status(&["1.1.1.2"])
        ));
        assert!(load_balancer_status_equal(
            &LoadBalancerStatus::default(),
            &status(&[])
        ));
    }
}
