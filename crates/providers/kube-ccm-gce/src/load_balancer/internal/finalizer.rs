//! Upstream's finalizer `gke.networking.io/l4-ilb-v1` on a service with an internal load balancer,
//! written with the leading process's client through the status subresource.

use k8s_openapi::api::core::v1::Service;
use kube_ccm_provider::CloudError;

use super::FINALIZER_ILB_V1;
use crate::GceProvider;

impl GceProvider {
    /// The services API of the leading client; `None` without one (a provider not run by the manager).
    fn services_api(&self, service: &Service) -> Option<kube::Api<Service>> {
        let client = self.leading.read().clone()?;
        Some(kube::Api::namespaced(
            client,
            service.metadata.namespace.as_deref().unwrap_or("default"),
        ))
    }

    /// Adds [`FINALIZER_ILB_V1`] to the service (unless it has it), at the version this call was given.
    pub(super) async fn add_ilb_finalizer(&self, service: &Service) -> Result<(), CloudError> {
        let finalizers = service.metadata.finalizers.clone().unwrap_or_default();
        if finalizers.iter().any(|f| f == FINALIZER_ILB_V1) {
            return Ok(());
        }
        let Some(api) = self.services_api(service) else {
            return Ok(());
        };
        let mut wanted = finalizers;
        wanted.push(FINALIZER_ILB_V1.to_owned());
        let patch = serde_json::json!({"metadata": {
            "finalizers": wanted,
            "resourceVersion": service.metadata.resource_version,
        }});
        let name = service.metadata.name.as_deref().unwrap_or_default();
        api.patch_status(
            name,
            &kube_ccm_runtime::written::patch_params(),
            &kube::api::Patch::Merge(patch),
        )
        .await
        .map(drop)
        .map_err(|e| CloudError::provider(format!("adding the finalizer {FINALIZER_ILB_V1}: {e}")))
    }

    /// Removes [`FINALIZER_ILB_V1`] from the service, only it (the patch fails if the list changed at its
    /// position); a service already gone is done.
    pub(super) async fn remove_ilb_finalizer(&self, service: &Service) -> Result<(), CloudError> {
        let finalizers = service.metadata.finalizers.clone().unwrap_or_default();
        let Some(index) = finalizers.iter().position(|f| f == FINALIZER_ILB_V1) else {
            return Ok(());
        };
        let Some(api) = self.services_api(service) else {
            return Ok(());
        };
        let patch: json_patch::Patch = serde_json::from_value(serde_json::json!([
            {"op": "test", "path": format!("/metadata/finalizers/{index}"), "value": FINALIZER_ILB_V1},
            {"op": "remove", "path": format!("/metadata/finalizers/{index}")},
        ]))
        .expect("a valid JSON patch");
        let name = service.metadata.name.as_deref().unwrap_or_default();
        match api
            .patch_status(
                name,
                &kube_ccm_runtime::written::patch_params(),
                &kube::api::Patch::<()>::Json(patch),
            )
            .await
        {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(status)) if status.code == 404 => Ok(()),
            Err(e) => Err(CloudError::provider(format!(
                "removing the finalizer {FINALIZER_ILB_V1}: {e}"
            ))),
        }
    }
}
