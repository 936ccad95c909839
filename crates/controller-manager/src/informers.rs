//! Shared informers: one watch and one cache per resource type for all controllers of the process.
//!
//! They start when the first controller that needs them starts (a standby that leads nothing lists
//! nothing) and run until shutdown.
//!
//! The cache holds a projection: nodes as [`CachedNode`]s (what the controllers read, compactly: with
//! 10k kubelet-shaped nodes they are most of the process's memory), services as the JSON of the Service
//! without `managedFields` and the last-applied annotation ([`Compact`], [`Projected`]), as client-go's
//! informer transforms do. It is safe because
//! controllers only ever *patch* the fields they own; no cached object is written back whole.
//!
//! kube-runtime's shared stream applies back-pressure to every subscriber, so an idle subscriber would
//! stall the others. Here one internal subscriber re-broadcasts on a lossy channel instead; a controller
//! that falls behind gets every cached object again (a resync) rather than blocking anyone.
//!
//! Readiness is republished too: kube-runtime 5's `Store::wait_until_ready` wakes only the last of several
//! concurrent waiters (its `DelayedInit` keeps one waker), so two controllers waiting at once would leave
//! one waiting forever. Only the informer's own task waits on it; everyone else waits on a `watch`.

use std::collections::HashSet;
use std::sync::{Arc, OnceLock};

use cloud_provider::{CacheEvent, SharedCaches};
use futures::stream::BoxStream;
use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::{Node, Service};
use kube::Resource;
use kube::api::Api;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};

use tokio::sync::{broadcast, watch};

use tokio_util::sync::CancellationToken;

use crate::cached_node::CachedNode;
use crate::compact::{Compact, Projected};

/// A shared watch, its cache, a feed of changed objects and one of deleted objects.
pub struct Informer<K: Resource<DynamicType = ()> + 'static> {
    store: Store<K>,
    feed: broadcast::Sender<Arc<K>>,
    deleted: broadcast::Sender<Arc<K>>,
    ready: watch::Receiver<bool>,
}

/// Deletions are rarer than changes, and a lost one is not recovered by a resync: a deeper buffer.
const DELETIONS_BUFFER: usize = 4096;

// Only crate-internal functions here: the bound does not leak.
#[allow(private_bounds)]
impl<K> Informer<K>
where
    K: Resource<DynamicType = ()>
        + Projected
        + Clone
        + std::fmt::Debug
        + Send
        + Sync
        + serde::de::DeserializeOwned
        + 'static,
{
    fn start(api: Api<K>, shutdown: &CancellationToken) -> Informer<K> {
        let (store, writer) = reflector::store_shared::<K>(256);
        let mut handle = writer.subscribe().expect("a shared writer has subscribers");
        // kube-runtime's shared reflector passes on changes only: deletions are taken from the watch, and
        // so are the objects a re-list no longer has (deleted while the watch was down). Those are found
        // before the re-list replaces the cache (which still holds them then); every deletion is announced
        // after the cache has applied it, so a listener that reads the cache never finds the object there.
        let (deleted, _) = broadcast::channel(DELETIONS_BUFFER);
        let announce = deleted.clone();
        let cache = store.clone();
        let mut relisted: Option<HashSet<ObjectRef<K>>> = None;
        let gone = Arc::new(std::sync::Mutex::new(Vec::<Arc<K>>::new()));
        let found_gone = gone.clone();
        let stream = watcher(api, watcher::Config::default())
            .default_backoff()
            .modify(K::project)
            .inspect(move |event| match event {
                Ok(watcher::Event::Init) => relisted = Some(HashSet::new()),
                Ok(watcher::Event::InitApply(object)) => {
                    if let Some(seen) = relisted.as_mut() {
                        seen.insert(ObjectRef::from_obj(object));
                    }
                }
                Ok(watcher::Event::InitDone) => {
                    if let Some(seen) = relisted.take() {
                        let mut gone = crate::lock(&found_gone);
                        gone.extend(
                            cache
                                .state()
                                .into_iter()
                                .filter(|cached| !seen.contains(&ObjectRef::from_obj(cached.as_ref()))),
                        );
                    }
                }
                Ok(watcher::Event::Apply(_) | watcher::Event::Delete(_)) | Err(_) => {}
            })
            .reflect_shared(writer)
            .inspect(move |event| match event {
                Ok(watcher::Event::Delete(object)) => {
                    let _ = announce.send(Arc::new(object.clone()));
                }
                Ok(watcher::Event::InitDone) => {
                    let gone = std::mem::take(&mut *crate::lock(&gone));
                    for object in gone {
                        let _ = announce.send(object);
                    }
                }
                _ => {}
            });
        let (feed, _) = broadcast::channel(256);
        let forward = feed.clone();
        let (ready_sender, ready) = watch::channel(false);
        let readiness = store.clone();
        tokio::spawn(async move {
            if readiness.wait_until_ready().await.is_ok() {
                ready_sender.send_replace(true);
            }
        });
        let stop = shutdown.clone();
        tokio::spawn(async move {
            let mut stream = std::pin::pin!(stream);
            loop {
                tokio::select! {
                    () = stop.cancelled() => return,
                    event = stream.next() => {
                        match event {
                            Some(Err(error)) => tracing::warn!(kind = K::kind(&()).as_ref(), %error, "watch failed; retrying"),
                            Some(Ok(_)) => {}
                            None => return,
                        }
                    }
                    object = handle.next() => match object {
                        // Nobody listening is fine.
                        Some(object) => { let _ = forward.send(object); }
                        None => return,
                    },
                }
            }
        });
        Informer {
            store,
            feed,
            deleted,
            ready,
        }
    }
}

impl<K> Informer<K>
where
    K: Resource<DynamicType = ()> + Clone + Send + Sync + 'static,
{
    /// The cache.
    pub fn store(&self) -> Store<K> {
        self.store.clone()
    }

    /// Waits until the initial list is in the cache (or forever, if the informer stopped first).
    pub async fn ready(&self) {
        let mut ready = self.ready.clone();
        if ready.wait_for(|ready| *ready).await.is_err() {
            std::future::pending::<()>().await;
        }
    }

    /// Objects as they are deleted (their last cached state). A subscriber that falls more than a few
    /// thousand deletions behind loses some, and says so in the log.
    pub fn deletions(&self) -> impl Stream<Item = Arc<K>> + Send + 'static {
        let receiver = self.deleted.subscribe();
        futures::stream::unfold(receiver, |mut receiver| async move {
            loop {
                match receiver.recv().await {
                    Ok(object) => return Some((object, receiver)),
                    Err(broadcast::error::RecvError::Lagged(lost)) => {
                        tracing::warn!(
                            kind = K::kind(&()).as_ref(),
                            lost,
                            "fell behind the deletions feed"
                        );
                    }
                    Err(broadcast::error::RecvError::Closed) => return None,
                }
            }
        })
    }

    /// Objects as they change; after falling behind, every cached object again.
    pub fn subscribe(&self) -> impl Stream<Item = Arc<K>> + Send + 'static {
        let receiver = self.feed.subscribe();
        let store = self.store.clone();
        futures::stream::unfold(
            (receiver, Vec::<Arc<K>>::new()),
            move |(mut receiver, mut backlog)| {
                let store = store.clone();
                async move {
                    loop {
                        if let Some(object) = backlog.pop() {
                            return Some((object, (receiver, backlog)));
                        }
                        match receiver.recv().await {
                            Ok(object) => return Some((object, (receiver, backlog))),
                            Err(broadcast::error::RecvError::Lagged(_)) => backlog = store.state(),
                            Err(broadcast::error::RecvError::Closed) => return None,
                        }
                    }
                }
            },
        )
    }
}

/// The informers of one process.
pub(crate) struct Informers {
    client: kube::Client,
    shutdown: CancellationToken,
    nodes: OnceLock<Informer<CachedNode>>,
    services: OnceLock<Informer<Compact<Service>>>,
}

impl Informers {
    pub(crate) fn new(client: kube::Client, shutdown: CancellationToken) -> Arc<Informers> {
        Arc::new(Informers {
            client,
            shutdown,
            nodes: OnceLock::new(),
            services: OnceLock::new(),
        })
    }

    /// Nodes (started on first use).
    pub(crate) fn nodes(&self) -> &Informer<CachedNode> {
        self.nodes
            .get_or_init(|| Informer::start(Api::all(self.client.clone()), &self.shutdown))
    }

    /// Services in every namespace (started on first use).
    pub(crate) fn services(&self) -> &Informer<Compact<Service>> {
        self.services
            .get_or_init(|| Informer::start(Api::all(self.client.clone()), &self.shutdown))
    }
}

impl Informers {
    fn ready_now<K: Resource<DynamicType = ()> + Clone + Send + Sync + 'static>(
        informer: Option<&Informer<K>>,
    ) -> bool {
        informer.is_some_and(|informer| *informer.ready.borrow())
    }
}

/// Both feeds of `informer` as cache events, the objects made by `object`.
fn events<K, T>(informer: &Informer<K>, object: fn(&K) -> T) -> BoxStream<'static, CacheEvent<T>>
where
    K: Resource<DynamicType = ()> + Clone + Send + Sync + 'static,
    T: Send + 'static,
{
    let applied = informer.subscribe().map(move |k| CacheEvent::Applied(object(&k)));
    let deleted = informer.deletions().map(move |k| CacheEvent::Deleted(object(&k)));
    Box::pin(futures::stream::select(applied, deleted))
}

/// What a provider reads ([`cloud_provider::InitializeContext::caches`]): these informers, their objects
/// made whole from the projections.
#[async_trait::async_trait]
impl SharedCaches for Informers {
    async fn nodes_synced(&self) {
        self.nodes().ready().await;
    }
    fn nodes_ready(&self) -> bool {
        Informers::ready_now(self.nodes.get())
    }
    fn node(&self, name: &str) -> Option<Node> {
        self.nodes()
            .store()
            .get(&ObjectRef::new(name))
            .map(|node| node.to_node())
    }
    fn nodes(&self) -> Vec<Node> {
        let store = Informers::nodes(self).store();
        store.state().iter().map(|node| node.to_node()).collect()
    }
    fn node_events(&self) -> BoxStream<'static, CacheEvent<Node>> {
        events(Informers::nodes(self), CachedNode::to_node)
    }
    async fn services_synced(&self) {
        Informers::services(self).ready().await;
    }
    fn services_ready(&self) -> bool {
        Informers::ready_now(self.services.get())
    }
    fn service(&self, namespace: &str, name: &str) -> Option<Service> {
        Informers::services(self)
            .store()
            .get(&ObjectRef::new(name).within(namespace))
            .map(|service| service.object())
    }
    fn services(&self) -> Vec<Service> {
        let store = Informers::services(self).store();
        store.state().iter().map(|service| service.object()).collect()
    }
    fn service_events(&self) -> BoxStream<'static, CacheEvent<Service>> {
        events(Informers::services(self), Compact::object)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use k8s_openapi::api::core::v1::Node;

    use super::*;

    /// Regression: kube-runtime's `wait_until_ready` wakes only one of several concurrent waiters.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn every_concurrent_waiter_sees_the_informer_ready() {
        let server = test_apiserver::TestApiServer::start().await.unwrap();
        let nodes: Api<Node> = Api::all(server.client());
        let node: Node = serde_json::from_value(serde_json::json!({"metadata": {"name": "n1"}})).unwrap();
        nodes.create(&Default::default(), &node).await.unwrap();
        for _ in 0..5 {
            let informers = Informers::new(server.client(), CancellationToken::new());
            let waiters: Vec<_> = (0..4)
                .map(|_| {
                    let informers = informers.clone();
                    tokio::spawn(async move { informers.nodes().ready().await })
                })
                .collect();
            for waiter in waiters {
                tokio::time::timeout(Duration::from_secs(10), waiter)
                    .await
                    .expect("every waiter wakes")
                    .unwrap();
            }
            assert_eq!(informers.nodes().store().state().len(), 1);
        }
    }
}
