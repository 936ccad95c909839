//! Watches: a chunked stream of `{"type": …, "object": …}` lines.
//!
//! As the real server: no `resourceVersion` (or `"0"`) starts with a synthetic ADDED per current object; a
//! `resourceVersion` replays every change after it, or, when it is older than the kept history, sends one
//! ERROR event with a 410 `Expired` Status (kube-runtime re-lists on exactly that); an object that starts
//! or stops matching the selectors arrives as ADDED or DELETED; bookmarks when asked for, including the
//! `k8s.io/initial-events-end` one for `sendInitialEvents`; `timeoutSeconds` ends the stream.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, StreamBody};
use hyper::body::Frame;
use serde_json::json;
use tokio::sync::broadcast::error::TryRecvError;
use tokio::sync::{broadcast, mpsc};

use crate::request::{Target, selectors};
use crate::resources::ResourceType;
use crate::selectors::{FieldSelector, LabelSelector};
use crate::state::State;
use crate::status::ApiError;
use crate::store::{Change, EventType, Obj};
use crate::wire::{Query, Reply};

struct Filter {
    namespace: Option<String>,
    labels: LabelSelector,
    fields: FieldSelector,
}

impl Filter {
    fn matches(&self, object: &Obj) -> bool {
        let namespace_ok = self.namespace.as_deref().is_none_or(|ns| {
            object
                .object
                .pointer("/metadata/namespace")
                .and_then(|v| v.as_str())
                == Some(ns)
        });
        namespace_ok && self.labels.matches(&object.object) && self.fields.matches(&object.object)
    }
}

fn event_line(event: &str, object: &Bytes) -> Bytes {
    let mut line = Vec::with_capacity(object.len() + 32);
    line.extend_from_slice(br#"{"type":""#);
    line.extend_from_slice(event.as_bytes());
    line.extend_from_slice(br#"","object":"#);
    line.extend_from_slice(object);
    line.extend_from_slice(b"}\n");
    Bytes::from(line)
}

fn bookmark(resource: &ResourceType, resource_version: u64, initial_events_end: bool) -> Bytes {
    let mut metadata = json!({"resourceVersion": resource_version.to_string()});
    if initial_events_end {
        metadata["annotations"] = json!({"k8s.io/initial-events-end": "true"});
    }
    let object = json!({"kind": resource.kind, "apiVersion": resource.api_version(), "metadata": metadata});
    event_line("BOOKMARK", &Bytes::from(object.to_string()))
}

/// Starts a watch and returns its streaming reply.
pub(crate) fn start(
    state: &Arc<State>,
    target: &Target,
    query: &Query,
    user_agent: &str,
) -> Result<Reply, ApiError> {
    let resource = target.resource();
    let (labels, fields) = selectors(resource, query)?;
    let filter = Filter {
        namespace: target.namespace.clone(),
        labels,
        fields,
    };
    let from = match query
        .get("resourceVersion")
        .filter(|rv| !rv.is_empty() && *rv != "0")
    {
        Some(rv) => Some(
            rv.parse::<u64>()
                .map_err(|_| ApiError::bad_request(format!("invalid resourceVersion {rv:?}")))?,
        ),
        None => None,
    };
    let send_initial = query.flag("sendInitialEvents");
    let options = Options {
        timeout: query
            .get("timeoutSeconds")
            .and_then(|t| t.parse::<u64>().ok())
            .filter(|&t| t > 0)
            .map(Duration::from_secs),
        bookmarks: query.flag("allowWatchBookmarks"),
        send_initial,
        user_agent: user_agent.to_owned(),
    };

    let (initial, subscription) = {
        let store = state.store.lock();
        let start_from = if send_initial { None } else { from };
        match store.subscribe(target.id, start_from) {
            Ok(subscription) => {
                let initial = if start_from.is_none() {
                    store.list(target.id, target.namespace.as_deref())
                } else {
                    Vec::new()
                };
                (initial, Ok(subscription))
            }
            Err(expired) => (Vec::new(), Err(expired)),
        }
    };

    let (sender, receiver) = mpsc::channel::<Bytes>(1024);
    let state = state.clone();
    tokio::spawn(async move {
        match subscription {
            Err(expired) => {
                let status = ApiError::gone(format!(
                    "too old resource version: {} ({})",
                    expired.requested, expired.oldest
                ))
                .to_status();
                let _ = sender
                    .send(event_line("ERROR", &Bytes::from(status.to_string())))
                    .await;
            }
            Ok(subscription) => {
                let stream = Stream {
                    state,
                    resource,
                    filter,
                    options,
                    sender,
                    last_rv: subscription.resource_version,
                };
                stream
                    .run(initial, subscription.replay, subscription.receiver)
                    .await;
            }
        }
    });
    let body = StreamBody::new(futures::stream::unfold(receiver, |mut receiver| async move {
        receiver
            .recv()
            .await
            .map(|bytes| (Ok::<_, std::io::Error>(Frame::data(bytes)), receiver))
    }))
    .boxed();
    Ok(Reply {
        status: 200,
        body: BodyExt::boxed(body),
        resource_version: None,
        retry_after: None,
        warnings: Vec::new(),
    })
}

struct Options {
    timeout: Option<Duration>,
    bookmarks: bool,
    send_initial: bool,
    user_agent: String,
}

struct Stream {
    state: Arc<State>,
    resource: &'static ResourceType,
    filter: Filter,
    options: Options,
    sender: mpsc::Sender<Bytes>,
    last_rv: u64,
}

impl Stream {
    async fn send(&self, bytes: Bytes) -> bool {
        self.sender.send(bytes).await.is_ok()
    }

    /// Sends what a change means to this watcher; false when the client is gone.
    async fn deliver(&mut self, change: &Change) -> bool {
        let now = self.filter.matches(&change.object);
        let before = change.previous.as_ref().is_some_and(|p| self.filter.matches(p));
        let event = match change.event {
            EventType::Added => now.then_some("ADDED"),
            EventType::Modified => match (before, now) {
                (true, true) => Some("MODIFIED"),
                (false, true) => Some("ADDED"),
                (true, false) => Some("DELETED"),
                (false, false) => None,
            },
            EventType::Deleted => (before || now).then_some("DELETED"),
        };
        self.last_rv = self.last_rv.max(change.object.rv);
        match event {
            Some(event) => self.send(event_line(event, &change.object.json)).await,
            None => true,
        }
    }

    async fn run(
        mut self,
        initial: Vec<Obj>,
        replay: Vec<Arc<Change>>,
        mut receiver: broadcast::Receiver<Arc<Change>>,
    ) {
        for object in initial.iter().filter(|o| self.filter.matches(o)) {
            if !self.send(event_line("ADDED", &object.json)).await {
                return;
            }
        }
        if self.options.send_initial && !self.send(bookmark(self.resource, self.last_rv, true)).await {
            return;
        }
        for change in &replay {
            if !self.deliver(change).await {
                return;
            }
        }
        let deadline = self.options.timeout.map(|t| tokio::time::Instant::now() + t);
        let mut close = self.state.close_watches.subscribe();
        let mut ticker = tokio::time::interval(self.state.settings.bookmark_interval);
        ticker.tick().await;
        loop {
            tokio::select! {
                change = receiver.recv() => match change {
                    Ok(change) => if !self.deliver(&change).await { return },
                    // A watcher too slow to keep up is closed, as the real server does; the client re-watches.
                    Err(broadcast::error::RecvError::Lagged(_) | broadcast::error::RecvError::Closed) => return,
                },
                _ = ticker.tick(), if self.options.bookmarks => {
                    // Read the latest version first: every change at or below it is already in the channel.
                    let latest = self.state.store.lock().resource_version();
                    let Some(waiting) = waiting(&mut receiver) else { return };
                    for change in &waiting {
                        if !self.deliver(change).await { return }
                    }
                    self.last_rv = self.last_rv.max(latest);
                    if !self.send(bookmark(self.resource, self.last_rv, false)).await { return }
                }
                () = sleep_until(deadline) => return,
                changed = close.changed() => {
                    if changed.is_err() { return }
                    let pattern = close.borrow_and_update().user_agent.clone();
                    if pattern.is_none_or(|p| self.options.user_agent.contains(&p)) { return }
                }
                () = self.sender.closed() => return,
            }
        }
    }
}

/// The changes already in `receiver`, for a bookmark to follow them; `None` when it lost some (or the
/// store is gone), and the watch must end instead. A bookmark after lost changes would tell the client it
/// has them, and its next watch would start after them; closed, it watches again from what it has (or
/// lists again), as from the real server when it falls behind.
fn waiting(receiver: &mut broadcast::Receiver<Arc<Change>>) -> Option<Vec<Arc<Change>>> {
    let mut waiting = Vec::new();
    loop {
        match receiver.try_recv() {
            Ok(change) => waiting.push(change),
            Err(TryRecvError::Empty) => return Some(waiting),
            Err(TryRecvError::Lagged(_) | TryRecvError::Closed) => return None,
        }
    }
}

async fn sleep_until(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_lines_are_json() {
        let line = event_line("ADDED", &Bytes::from_static(br#"{"a":1}"#));
        let value: serde_json::Value = serde_json::from_slice(&line).unwrap();
        assert_eq!(value, json!({"type": "ADDED", "object": {"a": 1}}));
        assert!(line.ends_with(b"\n"));
    }

    fn change(rv: u64) -> Arc<Change> {
        let object = json!({"metadata": {"name": format!("n{rv}"), "resourceVersion": rv.to_string()}});
        let json = Bytes::from(object.to_string());
        Arc::new(Change {
            event: EventType::Added,
            object: Arc::new(crate::store::Stored { object, json, rv }),
            previous: None,
        })
    }

    /// Before a bookmark, every change waiting is taken; a receiver that lost some ends the watch rather
    /// than bookmarking past them.
    #[test]
    fn a_bookmark_follows_every_waiting_change_and_never_a_lost_one() {
        let versions = |changes: Option<Vec<Arc<Change>>>| {
            changes.map(|c| c.iter().map(|c| c.object.rv).collect::<Vec<_>>())
        };
        let (sender, mut receiver) = broadcast::channel(4);
        for rv in 1..=3 {
            sender.send(change(rv)).unwrap();
        }
        assert_eq!(versions(waiting(&mut receiver)), Some(vec![1, 2, 3]));
        assert_eq!(versions(waiting(&mut receiver)), Some(vec![]));

        for rv in 4..=9 {
            sender.send(change(rv)).unwrap();
        }
        assert_eq!(versions(waiting(&mut receiver)), None, "lagged: the watch ends");

        drop(sender);
        assert_eq!(versions(waiting(&mut receiver)), None, "the store is gone");
    }
}
