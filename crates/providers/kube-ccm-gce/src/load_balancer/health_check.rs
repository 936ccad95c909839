//! Health checks. The external load balancer's are upstream's legacy HTTP health checks
//! (`httpHealthChecks`); the internal load balancer's are global `healthChecks` of type `HTTP` with the
//! same names, ports and timing (`GceProvider::ensure_internal_health_check`). Both: `k8s-<cluster ID>-node` on kube-proxy's `:10256/healthz`, shared
//! by the cluster's load balancers, or the service's own on its `healthCheckNodePort`
//! (`externalTrafficPolicy: Local`); each with a firewall letting Google's health checkers in (from
//! `--cloud-provider-gce-lb-src-cidrs`, [`kube_ccm_provider::flags`]).

use google_cloud_compute_v1::model::{self, HealthCheck, HttpHealthCheck};
use google_cloud_lro::Poller;
use k8s_openapi::api::core::v1::Service;
use kube_ccm_provider::CloudError;

use super::{deleted, found, inserted};
use crate::client::Attributed as _;
use crate::{GceProvider, WriteError, gce_error};

/// kube-proxy's health port, for the shared node health check.
pub const NODE_HEALTH_CHECK_PORT: i32 = 10256;

/// The health check a load balancer named `lb` uses, with its port, and whether it is the service's own:
/// `lb` on the service's `healthCheckNodePort` when it keeps traffic local, else the cluster's shared
/// `k8s-<cluster ID>-node` on kube-proxy's port (both kinds of load balancer, as upstream).
pub fn health_check_of(service: &Service, lb: &str, cluster_id: &str) -> ((String, i32), bool) {
    match kube_ccm_provider::service::health_check_path_port(service) {
        Some((_, port)) => ((lb.to_owned(), port), true),
        None => ((format!("k8s-{cluster_id}-node"), NODE_HEALTH_CHECK_PORT), false),
    }
}

/// Compute's session affinity for the service's: `CLIENT_IP` or `NONE`.
pub fn session_affinity(service: &Service) -> &'static str {
    match service.spec.as_ref().and_then(|s| s.session_affinity.as_deref()) {
        Some("ClientIP") => "CLIENT_IP",
        _ => "NONE",
    }
}

impl GceProvider {
    /// The health check, made or corrected; its link.
    pub(super) async fn ensure_health_check(&self, name: &str, port: i32) -> Result<String, CloudError> {
        let mut wanted = HttpHealthCheck::default();
        wanted.name = Some(name.to_owned());
        wanted.port = Some(port);
        wanted.request_path = Some("/healthz".into());
        wanted.description = Some(format!("{{\"kubernetes.io/service-name\":\"{name}\"}}"));
        wanted.check_interval_sec = Some(8);
        wanted.timeout_sec = Some(1);
        wanted.healthy_threshold = Some(1);
        wanted.unhealthy_threshold = Some(3);
        let get = || {
            self.clients
                .http_health_checks
                .get()
                .set_project(self.project())
                .set_http_health_check(name)
                .attributed()
                .send()
        };
        match found(get().await, "httpHealthChecks.get")? {
            None => {
                let done = self
                    .clients
                    .http_health_checks
                    .insert()
                    .set_project(self.project())
                    .set_body(wanted)
                    .attributed()
                    .poller()
                    .until_done()
                    .await;
                inserted(WriteError::check(done), "httpHealthChecks.insert")?;
            }
            Some(existing) => {
                // Larger intervals and thresholds set by hand are kept, as upstream.
                let lower = |have: Option<i32>, want: Option<i32>| have.unwrap_or(0) < want.unwrap_or(0);
                let stale = existing.port != wanted.port
                    || existing.request_path != wanted.request_path
                    || existing.description != wanted.description
                    || lower(existing.check_interval_sec, wanted.check_interval_sec)
                    || lower(existing.timeout_sec, wanted.timeout_sec)
                    || lower(existing.healthy_threshold, wanted.healthy_threshold)
                    || lower(existing.unhealthy_threshold, wanted.unhealthy_threshold);
                if stale {
                    let done = self
                        .clients
                        .http_health_checks
                        .patch()
                        .set_project(self.project())
                        .set_http_health_check(name)
                        .set_body(wanted)
                        .attributed()
                        .poller()
                        .until_done()
                        .await;
                    WriteError::check(done).map_err(|e| e.into_cloud("httpHealthChecks.patch"))?;
                }
            }
        }
        let check = get().await.map_err(|e| gce_error("httpHealthChecks.get", e))?;
        Ok(check.self_link.unwrap_or_default())
    }

    /// Deletes a health check and its firewall; one still used by a target pool is kept (with its
    /// firewall), as upstream.
    pub(super) async fn delete_health_check(&self, name: &str, firewall: &str) -> Result<(), CloudError> {
        let done = self
            .clients
            .http_health_checks
            .delete()
            .set_project(self.project())
            .set_http_health_check(name)
            .attributed()
            .poller()
            .until_done()
            .await;
        match WriteError::check(done) {
            Err(error) if error.is_in_use() => return Ok(()),
            other => deleted(other, "httpHealthChecks.delete")?,
        }
        self.delete_firewall(firewall).await
    }
}

/// Whether an existing health check needs writing: another port, path or description, or an interval,
/// timeout or threshold below the wanted one (larger values set by hand are kept, as upstream).
fn stale(have: &HealthCheck, want: &HealthCheck) -> bool {
    let lower = |have: Option<i32>, want: Option<i32>| have.unwrap_or(0) < want.unwrap_or(0);
    let http = |c: &HealthCheck| {
        c.http_health_check
            .as_ref()
            .map(|h| (h.port, h.request_path.clone()))
    };
    http(have).is_none()
        || http(have) != http(want)
        || have.description.as_deref().unwrap_or_default() != want.description.as_deref().unwrap_or_default()
        || lower(have.check_interval_sec, want.check_interval_sec)
        || lower(have.timeout_sec, want.timeout_sec)
        || lower(have.healthy_threshold, want.healthy_threshold)
        || lower(have.unhealthy_threshold, want.unhealthy_threshold)
}

impl GceProvider {
    async fn get_internal_health_check(&self, name: &str) -> Result<Option<HealthCheck>, CloudError> {
        found(
            self.clients
                .health_checks
                .get()
                .set_project(self.project())
                .set_health_check(name)
                .attributed()
                .send()
                .await,
            "healthChecks.get",
        )
    }

    /// The internal load balancer's health check (`HTTP` on `port`, `/healthz`), made or corrected;
    /// its link.
    pub(super) async fn ensure_internal_health_check(
        &self,
        name: &str,
        port: i32,
        description: &str,
    ) -> Result<String, CloudError> {
        let mut http = model::HTTPHealthCheck::default();
        http.port = Some(port);
        http.request_path = Some("/healthz".into());
        let mut wanted = HealthCheck::default();
        wanted.name = Some(name.to_owned());
        wanted.description = Some(description.to_owned());
        wanted.r#type = Some(model::health_check::Type::Http);
        wanted.http_health_check = Some(http);
        wanted.check_interval_sec = Some(8);
        wanted.timeout_sec = Some(1);
        wanted.healthy_threshold = Some(1);
        wanted.unhealthy_threshold = Some(3);
        match self.get_internal_health_check(name).await? {
            None => {
                let done = self
                    .clients
                    .health_checks
                    .insert()
                    .set_project(self.project())
                    .set_body(wanted)
                    .attributed()
                    .poller()
                    .until_done()
                    .await;
                inserted(WriteError::check(done), "healthChecks.insert")?;
            }
            Some(existing) if stale(&existing, &wanted) => {
                // A full update; what was set larger by hand stays.
                let keep = |have: Option<i32>, want: Option<i32>| have.max(want);
                wanted.check_interval_sec = keep(existing.check_interval_sec, wanted.check_interval_sec);
                wanted.timeout_sec = keep(existing.timeout_sec, wanted.timeout_sec);
                wanted.healthy_threshold = keep(existing.healthy_threshold, wanted.healthy_threshold);
                wanted.unhealthy_threshold = keep(existing.unhealthy_threshold, wanted.unhealthy_threshold);
                let done = self
                    .clients
                    .health_checks
                    .update()
                    .set_project(self.project())
                    .set_health_check(name)
                    .set_body(wanted)
                    .attributed()
                    .poller()
                    .until_done()
                    .await;
                WriteError::check(done).map_err(|e| e.into_cloud("healthChecks.update"))?;
            }
            Some(_) => {}
        }
        let check = self
            .get_internal_health_check(name)
            .await?
            .ok_or_else(|| CloudError::provider(format!("health check {name} vanished after it was made")))?;
        Ok(check.self_link.unwrap_or_default())
    }

    /// Deletes an internal load balancer's health check and then its firewall; one still used by a
    /// backend service is kept, with its firewall (the shared one, while other services use it).
    pub(super) async fn delete_internal_health_check(
        &self,
        name: &str,
        firewall: &str,
    ) -> Result<(), CloudError> {
        let done = self
            .clients
            .health_checks
            .delete()
            .set_project(self.project())
            .set_health_check(name)
            .attributed()
            .poller()
            .until_done()
            .await;
        match WriteError::check(done) {
            Err(error) if error.is_in_use() => return Ok(()),
            other => deleted(other, "healthChecks.delete")?,
        }
        self.delete_firewall(firewall).await?;
        // The IPv6 health checkers' firewall of a dual-stack load balancer (`internal::ipv6`).
        self.delete_firewall(&format!("{firewall}-ipv6")).await
    }
}
