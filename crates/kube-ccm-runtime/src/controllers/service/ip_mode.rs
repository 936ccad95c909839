//! `status.loadBalancer.ingress[].ipMode`: whether kube-proxy may treat a load balancer's address as a
//! virtual IP and send in-cluster traffic for it straight to the endpoints (`VIP`, the API server's
//! default for an ingress with an IP), or must send it through the load balancer (`Proxy`: one that
//! terminates the connection, or speaks the PROXY protocol to the backends).
//!
//! The API server stores the field from Kubernetes 1.30 (feature `LoadBalancerIPMode`, on from 1.30, GA
//! in 1.32) and drops it before, or with the feature off. Which kind this server is, is learnt from the
//! answers to status writes, not from its version:
//! - where it is stored, a provider's status is compared as the server keeps it (an address without a
//!   mode is a `VIP`), so a status the server defaulted is not written again at every ensure;
//! - where it is dropped, modes are left out of comparisons and writes, and a service whose load
//!   balancer is a `Proxy` gets a Warning Event: kube-proxy will short-cut its address.
//!
//! A mode on an ingress without an IP (a hostname) is left out: the API server refuses it.

use std::sync::atomic::{AtomicU8, Ordering};

use k8s_openapi::api::core::v1::LoadBalancerStatus;

/// The mode the API server gives an address that names none.
pub(super) const VIP: &str = "VIP";
/// A load balancer kube-proxy must not short-cut.
pub(super) const PROXY: &str = "Proxy";

const STORED: u8 = 1;
const DROPPED: u8 = 2;

/// What this API server does with `ipMode`, as learnt so far: 0 until a write has shown it.
#[derive(Debug, Default)]
pub(super) struct IpModes(AtomicU8);

impl IpModes {
    /// `status` as this API server keeps it.
    pub(super) fn as_stored(&self, status: &LoadBalancerStatus) -> LoadBalancerStatus {
        let dropped = self.dropped();
        let mut status = status.clone();
        for ingress in status.ingress.iter_mut().flatten() {
            let has_ip = ingress.ip.as_deref().is_some_and(|ip| !ip.is_empty());
            if dropped || !has_ip {
                ingress.ip_mode = None;
            } else if ingress.ip_mode.is_none() {
                ingress.ip_mode = Some(VIP.to_owned());
            }
        }
        status
    }

    /// Learns from the server's answer to a write of `sent` (as [`IpModes::as_stored`] gave it): `stored`
    /// is the status in the answer.
    pub(super) fn learn(&self, sent: &LoadBalancerStatus, stored: &LoadBalancerStatus) {
        let pairs = sent.ingress.iter().flatten().zip(stored.ingress.iter().flatten());
        for (sent, stored) in pairs {
            let has_ip = sent.ip.as_deref().is_some_and(|ip| !ip.is_empty());
            // A mode sent and kept, or none sent (the field was thought dropped) and one defaulted: stored.
            // A mode sent and not kept: dropped.
            if has_ip && sent.ip == stored.ip && (sent.ip_mode.is_some() || stored.ip_mode.is_some()) {
                let learnt = if stored.ip_mode.is_some() { STORED } else { DROPPED };
                if self.0.swap(learnt, Ordering::Relaxed) != learnt && learnt == DROPPED {
                    tracing::warn!(
                        "the API server does not store status.loadBalancer.ingress[].ipMode (Kubernetes 1.30 \
                         and later do, with feature LoadBalancerIPMode): load balancers' modes are left out"
                    );
                }
                return;
            }
        }
    }

    /// Whether the server was seen to drop the field.
    pub(super) fn dropped(&self) -> bool {
        self.0.load(Ordering::Relaxed) == DROPPED
    }
}

/// Whether the provider gave an address in `Proxy` mode.
pub(super) fn wants_proxy(status: &LoadBalancerStatus) -> bool {
    status
        .ingress
        .iter()
        .flatten()
        .any(|i| i.ip_mode.as_deref() == Some(PROXY))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn status(value: serde_json::Value) -> LoadBalancerStatus {
        serde_json::from_value(json!({ "ingress": value })).unwrap()
    }

    #[test]
    fn an_address_without_a_mode_is_a_vip_where_the_server_stores_modes() {
        let modes = IpModes::default();
        let given = status(json!([{"ip": "203.0.113.1"}, {"hostname": "lb.example.com", "ipMode": "Proxy"}]));
        let stored = modes.as_stored(&given);
        assert_eq!(
            stored,
            status(json!([{"ip": "203.0.113.1", "ipMode": "VIP"}, {"hostname": "lb.example.com"}]))
        );
        let proxy = status(json!([{"ip": "203.0.113.1", "ipMode": "Proxy"}]));
        assert_eq!(modes.as_stored(&proxy), proxy);
        modes.learn(&proxy, &proxy);
        assert!(!modes.dropped());
    }

    #[test]
    fn a_server_that_drops_modes_is_learnt_and_modes_are_left_out() {
        let modes = IpModes::default();
        let proxy = status(json!([{"ip": "203.0.113.1", "ipMode": "Proxy"}]));
        let answer = status(json!([{"ip": "203.0.113.1"}]));
        modes.learn(&modes.as_stored(&proxy), &answer);
        assert!(modes.dropped() && wants_proxy(&proxy));
        assert_eq!(modes.as_stored(&proxy), answer);
        // A server upgraded meanwhile (it defaults the mode again) is learnt too.
        modes.learn(&answer, &status(json!([{"ip": "203.0.113.1", "ipMode": "VIP"}])));
        assert!(!modes.dropped());
        assert_eq!(modes.as_stored(&proxy), proxy);
        // An answer for other addresses (another writer's) teaches nothing.
        let fresh = IpModes::default();
        fresh.learn(&proxy, &status(json!([{"ip": "198.51.100.1"}])));
        assert!(!fresh.dropped());
    }
}
