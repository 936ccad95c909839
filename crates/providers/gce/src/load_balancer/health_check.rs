//! Upstream's legacy HTTP health checks: `k8s-<cluster ID>-node` on kube-proxy's `:10256/healthz`, shared
//! by the cluster's load balancers, or the service's own on its `healthCheckNodePort`
//! (`externalTrafficPolicy: Local`); each with a firewall letting Google's health checkers in (from
//! `--cloud-provider-gce-lb-src-cidrs`, [`crate::flags`]).

use cloud_provider::CloudError;
use google_cloud_compute_v1::model::HttpHealthCheck;
use google_cloud_lro::Poller;

use super::{deleted, found, inserted};
use crate::client::Attributed as _;
use crate::{GceProvider, WriteError, gce_error};

/// kube-proxy's health port, for the shared node health check.
pub const NODE_HEALTH_CHECK_PORT: i32 = 10256;

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
            // Compute: 400 `resourceInUseByAnotherResource`, "… is already being used by …".
            Err(WriteError::Request(e))
                if e.http_payload().is_some_and(|b| {
                    String::from_utf8_lossy(b).contains("resourceInUseByAnotherResource")
                }) || e.to_string().contains("is already being used by") =>
            {
                return Ok(());
            }
            other => deleted(other, "httpHealthChecks.delete")?,
        }
        self.delete_firewall(firewall).await
    }
}
