//! The versions of a service a sync must not act on: those from before this process's own last write
//! landed in the cache (its status published, or its clean-up finished).

use parking_lot::Mutex;
use std::collections::HashMap;

use k8s_openapi::api::core::v1::Service;

use super::ServiceContext;

/// Whether `service` is one of the versions `map` holds for `key`; once it is past them, they are
/// forgotten.
fn before(map: &Mutex<HashMap<String, Vec<String>>>, key: &str, service: &Service) -> bool {
    let mut map = map.lock();
    let Some(versions) = map.get(key) else {
        return false;
    };
    if versions
        .iter()
        .any(|v| service.metadata.resource_version.as_ref() == Some(v))
    {
        return true;
    }
    map.remove(key);
    false
}

impl ServiceContext {
    /// The status of `key`'s load balancer was written over `versions` of the service.
    pub(super) fn published(&self, key: &str, versions: Vec<String>) {
        self.unpublished.lock().insert(key.to_owned(), versions);
    }

    /// Whether `service` is a version from before this process published its status.
    pub(super) fn is_before_published(&self, key: &str, service: &Service) -> bool {
        before(&self.unpublished, key, service)
    }

    /// This process's clean-up of `key` finished over `versions` of the service.
    pub(super) fn cleaned_over(&self, key: &str, versions: Vec<String>) {
        self.cleaned.lock().insert(key.to_owned(), versions);
    }

    /// Whether `service` is a version from before this process's finished clean-up.
    pub(super) fn is_before_cleaned(&self, key: &str, service: &Service) -> bool {
        before(&self.cleaned, key, service)
    }
}
