//! The test API server as a judge sees it: its admin API (request log, Lease history, faults) and the
//! current Lease holders.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use ccm_audit::{CLOUD_VERB, LeaseWrite, RequestEntry, UserAgent};
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::Api;

/// The API server's admin API, over HTTP(S), through a kube client.
#[derive(Clone)]
pub struct Admin {
    client: kube::Client,
}

impl Admin {
    /// An admin client for the server `client` talks to.
    pub fn new(client: kube::Client) -> Admin {
        Admin { client }
    }

    async fn lines<T: serde::de::DeserializeOwned>(&self, path: &str) -> Result<Vec<T>> {
        let request = http::Request::get(path).body(Vec::new())?;
        let text = self
            .client
            .request_text(request)
            .await
            .with_context(|| format!("GET {path}"))?;
        text.lines()
            .filter(|l| !l.is_empty())
            .map(|l| serde_json::from_str(l).with_context(|| format!("a record of {path}")))
            .collect()
    }

    /// Every Lease write so far.
    pub async fn leases(&self) -> Result<Vec<LeaseWrite>> {
        self.lines("/_admin/leases").await
    }

    /// Every request so far.
    pub async fn requests(&self) -> Result<Vec<RequestEntry>> {
        self.lines("/_admin/requests").await
    }

    /// Removes every fault.
    pub async fn clear_faults(&self) -> Result<()> {
        let request = http::Request::delete("/_admin/faults").body(Vec::new())?;
        self.client.request_text(request).await?;
        Ok(())
    }

    /// Adds a fault (`FaultSpec` JSON).
    pub async fn add_fault(&self, spec: serde_json::Value) -> Result<()> {
        let request = http::Request::post("/_admin/faults")
            .header("content-type", "application/json")
            .body(serde_json::to_vec(&spec)?)?;
        self.client.request_text(request).await?;
        Ok(())
    }
}

/// Current holders of the given Leases in `kube-system` (`None`: free or absent).
pub async fn holders(client: &kube::Client, leases: &[&str]) -> Result<BTreeMap<String, Option<String>>> {
    let api: Api<Lease> = Api::namespaced(client.clone(), "kube-system");
    let mut holders = BTreeMap::new();
    for name in leases {
        let holder = api
            .get_opt(name)
            .await?
            .and_then(|l| l.spec)
            .and_then(|s| s.holder_identity)
            .filter(|h| !h.is_empty());
        holders.insert((*name).to_owned(), holder);
    }
    Ok(holders)
}

/// Waits until `condition` holds for the current holders.
pub async fn wait_for_holders(
    client: &kube::Client,
    leases: &[&str],
    timeout: Duration,
    what: &str,
    mut condition: impl FnMut(&BTreeMap<String, Option<String>>) -> bool,
) -> Result<BTreeMap<String, Option<String>>> {
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        let current = holders(client, leases).await?;
        if condition(&current) {
            return Ok(current);
        }
        if tokio::time::Instant::now() > deadline {
            bail!("timed out after {timeout:?} waiting for {what}; holders: {current:?}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Writes of the controller managers that the server refused as invalid (400 or 422): a real API server
/// refuses them too, so any is a bug in what the managers write.
pub fn refused_as_invalid(requests: &[RequestEntry]) -> Vec<&RequestEntry> {
    requests
        .iter()
        .filter(|r| matches!(r.status, 400 | 422))
        .filter(|r| r.method != "GET")
        .filter(|r| UserAgent::parse(&r.user_agent).is_some())
        .collect()
}

/// The changes the fake cloud at `cloud_url` applied, as the audit's request records: each judged, by its
/// caller's `User-Agent` and the time it was applied, against the lock tenures exactly as a Kubernetes
/// write is (path `cloud:<call>/<object>`, verb `cloud`).
pub async fn cloud_writes(cloud_url: &str) -> Result<Vec<RequestEntry>> {
    let client = kube_ccm_fake::FakeCloudClient::new(cloud_url);
    let request = kube_ccm_fake::CloudRequest::Admin(kube_ccm_fake::AdminRequest::Writes { from: 0 });
    match client.call(&request).await {
        kube_ccm_fake::CloudResponse::Writes { writes } => Ok(writes
            .into_iter()
            .map(|write| RequestEntry {
                time_us: write.time_us,
                method: "POST".to_owned(),
                path: format!("cloud:{}/{}", write.call, write.object),
                user_agent: write.caller,
                verb: Some(CLOUD_VERB.to_owned()),
                status: 200,
                resource_version: None,
                received_us: None,
            })
            .collect()),
        other => bail!("the fake cloud at {cloud_url} did not list its writes: {other:?}"),
    }
}
