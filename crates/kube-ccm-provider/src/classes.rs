//! Which services' load balancers a provider makes, by `spec.loadBalancerClass`
//! ([`LoadBalancer::classes`](crate::LoadBalancer::classes)).
//!
//! Upstream's service controller serves exactly the services without a class, and a cloud that has more
//! than one kind of load balancer (GCE's legacy classes) has had to fork the controller to serve its own.
//! Here the provider declares them; the framework's controller serves exactly those and touches no other
//! service: not its status, not its finalizer, not its cloud load balancer.

use std::fmt;

use k8s_openapi::api::core::v1::Service;

use crate::service::{load_balancer_class, service_type};

/// The load-balancer classes a provider serves, and whether it serves services without a class. Built
/// only from valid classes: each is a qualified name, as the API server requires of the field.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoadBalancerClasses {
    unclassed: bool,
    classes: Vec<String>,
}

impl Default for LoadBalancerClasses {
    /// Services without a class only: upstream's service controller.
    fn default() -> Self {
        LoadBalancerClasses::unclassed()
    }
}

/// A load-balancer class that is not a qualified name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("load-balancer class {class:?}: {why}")]
pub struct InvalidClass {
    /// The class as given.
    pub class: String,
    /// What is wrong with it.
    pub why: String,
}

impl LoadBalancerClasses {
    /// Services without a class only (the default; upstream's controller).
    pub fn unclassed() -> LoadBalancerClasses {
        LoadBalancerClasses {
            unclassed: true,
            classes: Vec::new(),
        }
    }

    /// `classes`, and services without a class too when `unclassed`. Each class must be a qualified name
    /// (`example.com/name`, at most 63 characters after the prefix), as the API server requires of
    /// `spec.loadBalancerClass`; a class given twice counts once.
    pub fn new<I, S>(unclassed: bool, classes: I) -> Result<LoadBalancerClasses, InvalidClass>
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let mut served: Vec<String> = Vec::new();
        for class in classes {
            let class = class.into();
            if let Some(why) = qualified_name_error(&class) {
                return Err(InvalidClass { class, why });
            }
            if !served.contains(&class) {
                served.push(class);
            }
        }
        Ok(LoadBalancerClasses {
            unclassed,
            classes: served,
        })
    }

    /// Whether services without a class are served.
    pub fn serves_unclassed(&self) -> bool {
        self.unclassed
    }

    /// The classes served, as given.
    pub fn classes(&self) -> &[String] {
        &self.classes
    }

    /// Whether a service of `class` (`None`: without one) is served.
    pub fn serves_class(&self, class: Option<&str>) -> bool {
        match class {
            None => self.unclassed,
            Some(class) => self.classes.iter().any(|c| c == class),
        }
    }

    /// Whether the service is of type `LoadBalancer` and of a class served: upstream's
    /// `wantsLoadBalancer`, for this provider's classes.
    pub fn serves(&self, service: &Service) -> bool {
        service_type(service) == Some("LoadBalancer") && self.serves_class(load_balancer_class(service))
    }
}

impl fmt::Display for LoadBalancerClasses {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut parts: Vec<&str> = Vec::new();
        if self.unclassed {
            parts.push("services without a class");
        }
        parts.extend(self.classes.iter().map(String::as_str));
        if parts.is_empty() {
            return f.write_str("no services");
        }
        f.write_str(&parts.join(", "))
    }
}

/// Why `value` is not a qualified name (`[prefix/]name`: a DNS subdomain prefix of at most 253
/// characters, a name of 1–63 alphanumerics, `-`, `_` and `.` that begins and ends alphanumeric), or
/// `None`.
fn qualified_name_error(value: &str) -> Option<String> {
    let (prefix, name) = match value.split_once('/') {
        Some((prefix, name)) => (Some(prefix), name),
        None => (None, value),
    };
    if let Some(prefix) = prefix {
        let label_ok = |label: &str| {
            !label.is_empty()
                && label.len() <= 63
                && label.starts_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
                && label.ends_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
                && label
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        };
        if prefix.is_empty() || prefix.len() > 253 || !prefix.split('.').all(label_ok) {
            return Some(format!(
                "the prefix {prefix:?} must be a lower-case DNS subdomain (e.g. example.com)"
            ));
        }
    }
    let edge = |c: char| c.is_ascii_alphanumeric();
    let valid = !name.is_empty()
        && name.len() <= 63
        && name.starts_with(edge)
        && name.ends_with(edge)
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    if !valid {
        return Some(format!(
            "the name {name:?} must be 1–63 characters of letters, digits, '-', '_' and '.', beginning and \
             ending with a letter or digit"
        ));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn service(value: serde_json::Value) -> Service {
        serde_json::from_value(value).unwrap()
    }

    #[test]
    fn the_default_serves_unclassed_load_balancers_only() {
        let classes = LoadBalancerClasses::default();
        let plain = service(serde_json::json!({"spec": {"type": "LoadBalancer"}}));
        let classed =
            service(serde_json::json!({"spec": {"type": "LoadBalancer", "loadBalancerClass": "x.io/lb"}}));
        let node_port = service(serde_json::json!({"spec": {"type": "NodePort"}}));
        assert!(classes.serves(&plain));
        assert!(!classes.serves(&classed) && !classes.serves(&node_port));
        assert_eq!(classes.to_string(), "services without a class");
    }

    #[test]
    fn declared_classes_are_served_and_nothing_else() {
        let classes = LoadBalancerClasses::new(false, ["x.io/lb", "y.io/lb", "x.io/lb"]).unwrap();
        assert_eq!(classes.classes(), ["x.io/lb", "y.io/lb"]);
        assert!(classes.serves_class(Some("y.io/lb")));
        assert!(!classes.serves_class(None) && !classes.serves_class(Some("z.io/lb")));
        assert_eq!(classes.to_string(), "x.io/lb, y.io/lb");
        let none = LoadBalancerClasses::new(false, Vec::<String>::new()).unwrap();
        assert_eq!(none.to_string(), "no services");
    }

    #[test]
    fn classes_that_are_not_qualified_names_are_refused() {
        for bad in [
            "",
            "/lb",
            "X.io/lb",
            "x.io/",
            "x.io/-lb",
            "a/b/c",
            "x_y.io/lb",
            &"n".repeat(64),
        ] {
            let error = LoadBalancerClasses::new(true, [bad]).unwrap_err();
            assert_eq!(error.class, bad);
            assert!(error.to_string().starts_with("load-balancer class"), "{error}");
        }
        for good in [
            "lb",
            "example.com/My_LB.v2",
            "networking.gke.io/l4-regional-external-legacy",
        ] {
            LoadBalancerClasses::new(true, [good]).unwrap();
        }
    }
}
