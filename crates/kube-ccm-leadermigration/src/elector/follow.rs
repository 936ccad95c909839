//! Following the Lease with a watch, so standbys act the moment it changes and cost nothing meanwhile.

use futures::StreamExt;
use kube::api::{Api, DynamicObject};
use kube::runtime::{WatchStreamExt, watcher};
use tokio::sync::mpsc;

/// What the watch on the Lease reports.
pub(super) enum Update {
    Object(Box<DynamicObject>),
    Deleted,
    Failing,
}

/// Follows the Lease with a watch, sending what changes; stops when the elector is dropped.
pub(super) async fn follow(api: Api<DynamicObject>, name: String, sender: mpsc::Sender<Update>) {
    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let mut events = std::pin::pin!(watcher(api, config).default_backoff());
    let mut seen_in_list = false;
    while let Some(event) = events.next().await {
        let update = match event {
            Ok(watcher::Event::Init) => {
                seen_in_list = false;
                continue;
            }
            Ok(watcher::Event::InitApply(object)) => {
                seen_in_list = true;
                Update::Object(Box::new(object))
            }
            Ok(watcher::Event::InitDone) if !seen_in_list => Update::Deleted,
            Ok(watcher::Event::InitDone) => continue,
            Ok(watcher::Event::Apply(object)) => Update::Object(Box::new(object)),
            Ok(watcher::Event::Delete(_)) => Update::Deleted,
            Err(error) => {
                tracing::debug!(lease = %name, %error, "watch on the lease is failing; polling instead");
                Update::Failing
            }
        };
        if sender.send(update).await.is_err() {
            return;
        }
    }
}
