//! The internal load balancer's regional backend service: made, or updated with the fingerprint it has
//! when it differs (upstream's `backendSvcEqual`); deleted unless a forwarding rule still uses it.

use std::collections::BTreeSet;

use google_cloud_compute_v1::model::{self, BackendService};
use google_cloud_lro::Poller;
use kube_ccm_provider::CloudError;

use super::super::{deleted, found, inserted, link_path};
use super::{InternalPlan, SCHEME_INTERNAL};
use crate::client::Attributed as _;
use crate::{GceProvider, WriteError};

/// Upstream's `backendSvcEqual`: protocol, description, affinity, scheme, health checks and backend
/// groups (as sets of paths).
pub fn backend_services_equal(have: &BackendService, want: &BackendService) -> bool {
    let paths = |links: Vec<&str>| {
        links
            .into_iter()
            .map(|l| link_path(l).to_owned())
            .collect::<BTreeSet<_>>()
    };
    let groups = |b: &BackendService| paths(b.backends.iter().filter_map(|b| b.group.as_deref()).collect());
    let checks = |b: &BackendService| paths(b.health_checks.iter().map(String::as_str).collect());
    let protocol = |b: &BackendService| {
        b.protocol
            .as_ref()
            .and_then(|p| p.name())
            .unwrap_or_default()
            .to_owned()
    };
    let affinity = |b: &BackendService| {
        b.session_affinity
            .as_ref()
            .and_then(|a| a.name())
            .unwrap_or("NONE")
            .to_owned()
    };
    let scheme = |b: &BackendService| {
        b.load_balancing_scheme
            .as_ref()
            .and_then(|s| s.name())
            .unwrap_or_default()
            .to_owned()
    };
    protocol(have) == protocol(want)
        && have.description.as_deref().unwrap_or_default() == want.description.as_deref().unwrap_or_default()
        && affinity(have) == affinity(want)
        && scheme(have) == scheme(want)
        && checks(have) == checks(want)
        && groups(have) == groups(want)
}

pub(super) fn backends(groups: &[String]) -> Vec<model::Backend> {
    groups
        .iter()
        .map(|group| {
            let mut backend = model::Backend::default();
            backend.group = Some(group.clone());
            backend
        })
        .collect()
}

impl GceProvider {
    pub(super) fn backend_service_url(&self, name: &str) -> String {
        format!(
            "https://www.googleapis.com/compute/v1/projects/{}/regions/{}/backendServices/{name}",
            self.project(),
            self.region()
        )
    }

    pub(super) async fn get_backend_service(&self, name: &str) -> Result<Option<BackendService>, CloudError> {
        found(
            self.clients
                .backend_services
                .get()
                .set_project(self.project())
                .set_region(self.region())
                .set_backend_service(name)
                .attributed()
                .send()
                .await,
            "regionBackendServices.get",
        )
    }

    /// The backend service made, or updated (with the fingerprint it has) when it differs.
    pub(super) async fn ensure_backend_service(
        &self,
        plan: &InternalPlan,
        health_check: &str,
        groups: &[String],
    ) -> Result<(), CloudError> {
        let mut wanted = BackendService::default();
        wanted.name = Some(plan.backend_service.clone());
        wanted.description = Some(plan.backend_description.clone());
        wanted.protocol = Some(model::backend_service::Protocol::from(plan.protocol.as_str()));
        wanted.health_checks = vec![health_check.to_owned()];
        wanted.backends = backends(groups);
        wanted.session_affinity = Some(model::backend_service::SessionAffinity::from(
            plan.session_affinity.as_str(),
        ));
        wanted.load_balancing_scheme =
            Some(model::backend_service::LoadBalancingScheme::from(SCHEME_INTERNAL));
        match self.get_backend_service(&plan.backend_service).await? {
            None => {
                let done = self
                    .clients
                    .backend_services
                    .insert()
                    .set_project(self.project())
                    .set_region(self.region())
                    .set_body(wanted)
                    .attributed()
                    .poller()
                    .until_done()
                    .await;
                inserted(WriteError::check(done), "regionBackendServices.insert").map(drop)
            }
            Some(existing) if !backend_services_equal(&existing, &wanted) => {
                wanted.fingerprint = existing.fingerprint;
                self.update_backend_service(&plan.backend_service, wanted).await
            }
            Some(_) => Ok(()),
        }
    }

    pub(super) async fn update_backend_service(
        &self,
        name: &str,
        body: BackendService,
    ) -> Result<(), CloudError> {
        let done = self
            .clients
            .backend_services
            .update()
            .set_project(self.project())
            .set_region(self.region())
            .set_backend_service(name)
            .set_body(body)
            .attributed()
            .poller()
            .until_done()
            .await;
        WriteError::check(done).map_err(|e| e.into_cloud("regionBackendServices.update"))
    }

    /// Deletes a backend service; gone or still used by another rule is done.
    pub(super) async fn delete_backend_service(&self, name: &str) -> Result<(), CloudError> {
        let done = self
            .clients
            .backend_services
            .delete()
            .set_project(self.project())
            .set_region(self.region())
            .set_backend_service(name)
            .attributed()
            .poller()
            .until_done()
            .await;
        match WriteError::check(done) {
            Err(error) if error.is_in_use() => Ok(()),
            other => deleted(other, "regionBackendServices.delete"),
        }
    }
}
