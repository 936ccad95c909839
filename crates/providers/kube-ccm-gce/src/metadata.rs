//! The GCE metadata server, for what `gce.conf` leaves out: upstream reads the project and the zone of
//! the instance the manager runs on from it when `project-id` or `local-zone` is not set.
//!
//! The server is `metadata.google.internal`, or `GCE_METADATA_HOST` (`host[:port]`, as Google's Go and
//! Rust clients read it). Every request carries `Metadata-Flavor: Google` and is bounded by [`TIMEOUT`]:
//! outside GCE the name does not resolve, or nothing answers, and the manager says so at start.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};

use crate::config::CloudConfig;

/// The server's name on GCE.
pub const DEFAULT_HOST: &str = "metadata.google.internal";
/// The environment variable that names another server (`host[:port]`).
pub const HOST_VARIABLE: &str = "GCE_METADATA_HOST";
/// How long one question may take, its answer included.
pub const TIMEOUT: Duration = Duration::from_secs(5);

/// The metadata server this process asks: [`HOST_VARIABLE`], else [`DEFAULT_HOST`].
pub fn host() -> String {
    std::env::var(HOST_VARIABLE)
        .ok()
        .filter(|h| !h.trim().is_empty())
        .unwrap_or_else(|| DEFAULT_HOST.to_owned())
}

/// The value at `/computeMetadata/v1/<key>` on `host`.
pub async fn get(host: &str, key: &str) -> Result<String, String> {
    let url = format!("http://{host}/computeMetadata/v1/{key}");
    let client: hyper_util::client::legacy::Client<_, Empty<Bytes>> =
        hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new()).build_http();
    let request = http::Request::get(&url)
        .header("metadata-flavor", "Google")
        .body(Empty::new())
        .map_err(|e| format!("{url}: {e}"))?;
    let answer = async {
        let response = client.request(request).await.map_err(|e| e.to_string())?;
        let status = response.status();
        let body = response
            .into_body()
            .collect()
            .await
            .map_err(|e| e.to_string())?
            .to_bytes();
        let text = String::from_utf8_lossy(&body).trim().to_owned();
        if status.is_success() {
            Ok(text)
        } else {
            Err(format!("HTTP {status}: {text}"))
        }
    };
    match tokio::time::timeout(TIMEOUT, answer).await {
        Ok(Ok(text)) if !text.is_empty() => Ok(text),
        Ok(Ok(_)) => Err(format!("{url}: an empty answer")),
        Ok(Err(error)) => Err(format!("{url}: {error}")),
        Err(_) => Err(format!("{url}: no answer within {}s", TIMEOUT.as_secs())),
    }
}

/// Fills `project-id` and `local-zone`, when `config` leaves them out, from the metadata server at
/// `host` (the zone answers as `projects/<number>/zones/<zone>`). An error names the key and the server.
pub async fn fill(config: &mut CloudConfig, host: &str) -> Result<(), String> {
    let outside = "outside GCE, set it in the cloud-config";
    if config.project_id.is_empty() {
        config.project_id = get(host, "project/project-id").await.map_err(|e| {
            format!("[global] project-id is not set, and the metadata server cannot tell it ({e}); {outside}")
        })?;
        tracing::info!(project = %config.project_id, "project-id from the metadata server");
    }
    if config.local_zone.is_empty() {
        let zone = get(host, "instance/zone").await.map_err(|e| {
            format!("[global] local-zone is not set, and the metadata server cannot tell it ({e}); {outside}")
        })?;
        config.local_zone = zone.rsplit('/').next().unwrap_or(&zone).to_owned();
        tracing::info!(zone = %config.local_zone, "local-zone from the metadata server");
    }
    config.check().map_err(|e| e.to_string())
}
