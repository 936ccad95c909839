//! The `User-Agent` every request of a controller manager carries, naming its process and controller, so
//! the API server's records (and a cloud's audit log) say who wrote what: the runtime renders it, the
//! overlap audit (test tooling) reads it back.

/// The controller name used in the `User-Agent` of leader-election requests.
pub const LEADER_ELECTION: &str = "leader-election";

/// The `User-Agent` of every request a controller manager makes:
/// `<component>/<version> (<os>/<arch>) <identity>/<controller>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UserAgent {
    /// e.g. `cloud-controller-manager`.
    pub component: String,
    /// Binary version.
    pub version: String,
    /// `<hostname>_<uuid>`.
    pub identity: String,
    /// Canonical controller name, or [`LEADER_ELECTION`].
    pub controller: String,
}

impl UserAgent {
    /// The header value.
    pub fn render(&self) -> String {
        format!(
            "{}/{} ({}/{}) {}/{}",
            self.component,
            self.version,
            std::env::consts::OS,
            std::env::consts::ARCH,
            self.identity,
            self.controller
        )
    }

    /// Parses a header value written by [`UserAgent::render`]; other clients give `None`.
    pub fn parse(text: &str) -> Option<UserAgent> {
        if is_client_go(text) {
            return None;
        }
        let (head, rest) = text.split_once(" (")?;
        let (_platform, tail) = rest.split_once(") ")?;
        let (component, version) = head.split_once('/')?;
        let (identity, controller) = tail.rsplit_once('/')?;
        if component.is_empty() || identity.is_empty() || controller.is_empty() || identity.contains(' ') {
            return None;
        }
        Some(UserAgent {
            component: component.to_owned(),
            version: version.to_owned(),
            identity: identity.to_owned(),
            controller: controller.to_owned(),
        })
    }
}

/// Whether a `User-Agent` is client-go's default (`<binary>/<version> (<os>/<arch>) kubernetes/<commit>`,
/// with `/<client>` after it when the client was named): the request came from a Go program on
/// client-go, such as kube-controller-manager or an upstream cloud-controller-manager, whose elector
/// follows client-go's rules (the overlap audit judges its takeovers by them).
pub fn is_client_go(user_agent: &str) -> bool {
    user_agent
        .split_once(") ")
        .is_some_and(|(_, tail)| tail.starts_with("kubernetes/"))
}

#[cfg(test)]
mod tests {
    use super::*;

    const CCM: &str = "cloud-controller-manager";

    fn ua(component: &str, identity: &str, controller: &str) -> String {
        UserAgent {
            component: component.into(),
            version: "0.1.0".into(),
            identity: identity.into(),
            controller: controller.into(),
        }
        .render()
    }

    #[test]
    fn user_agents_round_trip_and_others_are_ignored() {
        let text = ua(CCM, "host-1.example_7c9e", "service-lb-controller");
        let parsed = UserAgent::parse(&text).unwrap();
        assert_eq!(
            (
                parsed.component.as_str(),
                parsed.identity.as_str(),
                parsed.controller.as_str()
            ),
            (CCM, "host-1.example_7c9e", "service-lb-controller")
        );
        // client-go's defaults name no process: never read as an identity `kubernetes` or
        // `kubernetes/<commit>`.
        for client_go in [
            "kubectl/v1.33.1 (linux/amd64) kubernetes/4cb5f07",
            "kube-controller-manager/v1.37.2 (linux/amd64) kubernetes/$Format/service-controller",
        ] {
            assert_eq!(UserAgent::parse(client_go), None, "{client_go}");
            assert!(is_client_go(client_go), "{client_go}");
        }
        assert!(!is_client_go(&text));
        assert_eq!(UserAgent::parse("curl/8.0"), None);
        assert!(!is_client_go("curl/8.0"));
    }
}
