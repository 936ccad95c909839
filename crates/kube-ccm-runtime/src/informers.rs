//! Shared informers: one watch and one cache per resource type for all controllers of the process.
//!
//! They start when the first controller that needs them starts (a standby that leads nothing lists
//! nothing, unless `--warm-standby` starts those its controllers declare they read with the process) and
//! run until shutdown.
//!
//! The cache holds a projection: nodes as [`CachedNode`]s (what the controllers read, compactly: with
//! 10k kubelet-shaped nodes they are most of the process's memory), services as the JSON of the Service
//! without `managedFields` and the last-applied annotation ([`Compact`]), as client-go's
//! informer transforms do. It is safe because
//! controllers only ever *patch* the fields they own; no cached object is written back whole.
//!
//! The watch is kube-runtime's; the cache is this module's ([`Cache`]): each object is moved into the
//! cache once, under a key of one shared string, where kube-runtime's reflector store copies each object it
//! is given and keys it by a reference that holds four strings (name, namespace, resourceVersion, uid).
//! After a list, a subscriber gets every object again and the deletions feed every object the list no
//! longer has (deleted while the watch was down), as client-go's informers do.
//!
//! Changes go out on a lossy channel: a controller that falls behind gets every cached object again (a
//! resync) rather than holding up the watch or anyone else. Deletions are announced after the cache has
//! applied them, so a listener that reads the cache never finds the object there.

use parking_lot::RwLock;
use std::collections::HashMap;
use std::sync::{Arc, OnceLock};

use futures::stream::BoxStream;
use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::{Node, Service};
use kube::Resource;
use kube::api::Api;
use kube::runtime::{WatchStreamExt, watcher};
use kube_ccm_provider::{CacheEvent, SharedCaches};

use tokio::sync::{broadcast, watch};

use tokio_util::sync::CancellationToken;

use crate::cached::{Cached, Watched};
use crate::cached_node::CachedNode;
use crate::compact::Compact;

/// An informer's cache: the objects by key, `name` (cluster-scoped) or `namespace/name`.
pub struct Cache<K> {
    objects: Arc<RwLock<HashMap<Arc<str>, Arc<K>>>>,
}

impl<K> Clone for Cache<K> {
    fn clone(&self) -> Self {
        Cache {
            objects: self.objects.clone(),
        }
    }
}

impl<K> Default for Cache<K> {
    fn default() -> Self {
        Cache {
            objects: Arc::default(),
        }
    }
}

impl<K> Cache<K> {
    /// Every cached object.
    pub fn state(&self) -> Vec<Arc<K>> {
        self.read().values().cloned().collect()
    }

    /// The object cached under `key`: `name`, or `namespace/name`.
    pub fn get(&self, key: &str) -> Option<Arc<K>> {
        self.read().get(key).cloned()
    }

    /// How many objects are cached.
    pub fn len(&self) -> usize {
        self.read().len()
    }

    /// Whether nothing is cached.
    pub fn is_empty(&self) -> bool {
        self.read().is_empty()
    }

    fn read(&self) -> parking_lot::RwLockReadGuard<'_, HashMap<Arc<str>, Arc<K>>> {
        self.objects.read()
    }

    fn write(&self) -> parking_lot::RwLockWriteGuard<'_, HashMap<Arc<str>, Arc<K>>> {
        self.objects.write()
    }
}

/// A shared watch, its cache, a feed of changed objects and one of deleted objects.
pub struct Informer<K: Cached> {
    cache: Cache<K>,
    feed: broadcast::Sender<Arc<K>>,
    deleted: broadcast::Sender<Arc<K>>,
    ready: watch::Receiver<bool>,
}

/// Deletions are rarer than changes, and a lost one is not recovered by a resync: a deeper buffer.
const DELETIONS_BUFFER: usize = 4096;

/// Changes a subscriber may fall behind by before it gets every cached object again.
const FEED_BUFFER: usize = 256;

impl<K: Cached> Informer<K> {
    fn start(client: kube::Client, shutdown: &CancellationToken) -> Informer<K> {
        let cache = Cache::default();
        let (feed, _) = broadcast::channel(FEED_BUFFER);
        let (deleted, _) = broadcast::channel(DELETIONS_BUFFER);
        let (ready_sender, ready) = watch::channel(false);
        let api: Api<Watched<K>> = Api::all(client);
        let stream = watcher(api, watcher::Config::default()).default_backoff();
        let mut reflector = Reflector {
            cache: cache.clone(),
            feed: feed.clone(),
            deleted: deleted.clone(),
            ready: ready_sender,
            relisted: None,
            listing_since: None,
        };
        let stop = shutdown.clone();
        tokio::spawn(async move {
            let mut stream = std::pin::pin!(stream);
            loop {
                tokio::select! {
                    () = stop.cancelled() => return,
                    event = stream.next() => match event {
                        Some(Ok(event)) => reflector.apply(unwrapped(event)),
                        Some(Err(error)) => tracing::warn!(kind = K::Kind::kind(&()).as_ref(), %error, "watch failed; retrying"),
                        None => return,
                    },
                }
            }
        });
        Informer {
            cache,
            feed,
            deleted,
            ready,
        }
    }
}

/// The event with the cached form of its object.
fn unwrapped<K>(event: watcher::Event<Watched<K>>) -> watcher::Event<K> {
    match event {
        watcher::Event::Apply(watched) => watcher::Event::Apply(watched.object),
        watcher::Event::Delete(watched) => watcher::Event::Delete(watched.object),
        watcher::Event::Init => watcher::Event::Init,
        watcher::Event::InitApply(watched) => watcher::Event::InitApply(watched.object),
        watcher::Event::InitDone => watcher::Event::InitDone,
    }
}

/// Applies a watch's events to the cache, then tells the feeds (a listener that reads the cache finds a
/// change there, and a deleted object gone).
struct Reflector<K> {
    cache: Cache<K>,
    feed: broadcast::Sender<Arc<K>>,
    deleted: broadcast::Sender<Arc<K>>,
    ready: watch::Sender<bool>,
    /// The objects of a (re-)list under way; it replaces the cache when complete.
    relisted: Option<HashMap<Arc<str>, Arc<K>>>,
    /// When the list under way began.
    listing_since: Option<std::time::Instant>,
}

impl<K: Cached> Reflector<K> {
    /// A listed object and its key, shared with the cache where the cache holds the same version: a
    /// relist (after the server closed a watch that fell behind) then costs the objects that changed, not
    /// a second copy of the cache until the list ends (at 100k nodes, ≈ 70 MB more at the peak). The uid
    /// too must match: a server whose versions restarted (a restored etcd) may reuse one for a new object.
    fn cached_as(&self, object: K) -> (Arc<str>, Arc<K>) {
        let identity = object.identity();
        let key = identity.key();
        let cache = self.cache.read();
        match cache.get_key_value(key.as_ref()) {
            Some((key, cached))
                if identity.resource_version().is_some()
                    && cached.identity().resource_version() == identity.resource_version()
                    && cached.identity().uid() == identity.uid() =>
            {
                (key.clone(), cached.clone())
            }
            Some((key, _)) => (key.clone(), Arc::new(object)),
            None => (Arc::from(key), Arc::new(object)),
        }
    }

    fn apply(&mut self, event: watcher::Event<K>) {
        match event {
            watcher::Event::Init => {
                self.relisted = Some(HashMap::new());
                self.listing_since = Some(std::time::Instant::now());
            }
            watcher::Event::InitApply(object) => {
                let (key, object) = self.cached_as(object);
                self.relisted.get_or_insert_with(HashMap::new).insert(key, object);
            }
            watcher::Event::InitDone => {
                let listed = self.relisted.take().unwrap_or_default();
                let before = std::mem::replace(&mut *self.cache.write(), listed);
                // Deleted while the watch was down: what the list no longer has.
                let cache = self.cache.read();
                let gone: Vec<Arc<K>> = before
                    .into_iter()
                    .filter(|(key, _)| !cache.contains_key(key))
                    .map(|(_, object)| object)
                    .collect();
                // Every object again, as kube-runtime's shared reflector and client-go's informers do after a
                // list.
                let listed: Vec<Arc<K>> = cache.values().cloned().collect();
                drop(cache);
                // What a take-over at scale waits for, as client-go's "caches populated".
                tracing::info!(
                    kind = K::Kind::kind(&()).as_ref(),
                    objects = listed.len(),
                    seconds = self
                        .listing_since
                        .take()
                        .map(|since| since.elapsed().as_secs_f64()),
                    "cache filled from a list"
                );
                for object in gone {
                    let _ = self.deleted.send(object);
                }
                for object in listed {
                    let _ = self.feed.send(object);
                }
                self.ready.send_replace(true);
            }
            watcher::Event::Apply(object) => {
                let object = Arc::new(object);
                let key = object.identity().key();
                let mut cache = self.cache.write();
                match cache.get_mut(key.as_ref()) {
                    Some(cached) => *cached = object.clone(),
                    None => {
                        cache.insert(Arc::from(key), object.clone());
                    }
                }
                drop(cache);
                // Nobody listening is fine.
                let _ = self.feed.send(object);
            }
            watcher::Event::Delete(object) => {
                self.cache.write().remove(object.identity().key().as_ref());
                // The object's last state, as the watch tells it.
                let _ = self.deleted.send(Arc::new(object));
            }
        }
    }
}

impl<K: Cached> Informer<K> {
    /// The cache.
    pub fn store(&self) -> Cache<K> {
        self.cache.clone()
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
                            kind = K::Kind::kind(&()).as_ref(),
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
        let store = self.cache.clone();
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
                            Err(broadcast::error::RecvError::Lagged(lost)) => {
                                backlog = store.state();
                                tracing::debug!(
                                    kind = K::Kind::kind(&()).as_ref(),
                                    lost,
                                    again = backlog.len(),
                                    "fell behind the changes feed: every cached object again"
                                );
                            }
                            Err(broadcast::error::RecvError::Closed) => return None,
                        }
                    }
                }
            },
        )
    }
}

/// A cache the manager shares between its controllers, as a controller declares it reads it
/// ([`crate::ControllerDefinition::reads`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SharedCache {
    /// Every Node.
    Nodes,
    /// Every Service.
    Services,
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
            .get_or_init(|| Informer::start(self.client.clone(), &self.shutdown))
    }

    /// Services in every namespace (started on first use).
    pub(crate) fn services(&self) -> &Informer<Compact<Service>> {
        self.services
            .get_or_init(|| Informer::start(self.client.clone(), &self.shutdown))
    }
}

impl Informers {
    fn ready_now<K: Cached>(informer: Option<&Informer<K>>) -> bool {
        informer.is_some_and(|informer| *informer.ready.borrow())
    }
}

/// Both feeds of `informer` as cache events, the objects made by `object`.
fn events<K, T>(informer: &Informer<K>, object: fn(&K) -> T) -> BoxStream<'static, CacheEvent<T>>
where
    K: Cached,
    T: Send + 'static,
{
    let applied = informer.subscribe().map(move |k| CacheEvent::Applied(object(&k)));
    let deleted = informer.deletions().map(move |k| CacheEvent::Deleted(object(&k)));
    Box::pin(futures::stream::select(applied, deleted))
}

/// What a provider reads ([`kube_ccm_provider::InitializeContext::caches`]): these informers, their objects
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
        self.nodes().store().get(name).map(|node| node.to_node())
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
            .get(&format!("{namespace}/{name}"))
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

    fn service(namespace: &str, name: &str, version: &str) -> Compact<Service> {
        serde_json::from_value(serde_json::json!({
            "metadata": {"namespace": namespace, "name": name, "resourceVersion": version}
        }))
        .unwrap()
    }

    fn version(service: &Compact<Service>) -> &str {
        service.identity().resource_version().unwrap()
    }

    /// What the watch's events do to the cache and the feeds: a change replaces the cached object and is
    /// fed; a deletion leaves the cache before it is announced; a re-list replaces the cache, announces what
    /// it no longer has and feeds every object again; readiness comes with the first list.
    #[test]
    fn events_update_the_cache_then_the_feeds() {
        let cache = Cache::<Compact<Service>>::default();
        let (feed, mut fed) = broadcast::channel(16);
        let (deleted, mut gone) = broadcast::channel(16);
        let (ready, is_ready) = watch::channel(false);
        let mut reflector = Reflector {
            cache: cache.clone(),
            feed,
            deleted,
            ready,
            relisted: None,
            listing_since: None,
        };
        reflector.apply(watcher::Event::Init);
        reflector.apply(watcher::Event::InitApply(service("a", "web", "1")));
        reflector.apply(watcher::Event::InitApply(service("b", "web", "1")));
        assert!(
            cache.is_empty() && !*is_ready.borrow(),
            "nothing before the list completes"
        );
        reflector.apply(watcher::Event::InitDone);
        assert!(*is_ready.borrow());
        assert_eq!(cache.len(), 2);
        let mut first: Vec<String> = (0..2).map(|_| cache_key(&fed.try_recv().unwrap())).collect();
        first.sort();
        assert_eq!(first, ["a/web", "b/web"]);

        reflector.apply(watcher::Event::Apply(service("a", "web", "2")));
        assert_eq!(version(&cache.get("a/web").unwrap()), "2");
        assert_eq!(version(&fed.try_recv().unwrap()), "2");

        reflector.apply(watcher::Event::Delete(service("b", "web", "3")));
        assert!(cache.get("b/web").is_none());
        assert_eq!(version(&gone.try_recv().unwrap()), "3", "the watch's last state");

        // A re-list after the watch was down: `a` was deleted meanwhile, `c` created.
        reflector.apply(watcher::Event::Init);
        reflector.apply(watcher::Event::InitApply(service("c", "web", "5")));
        assert_eq!(cache.len(), 1, "the old cache serves until the list completes");
        reflector.apply(watcher::Event::InitDone);
        assert_eq!(cache_key(&gone.try_recv().unwrap()), "a/web");
        assert_eq!(cache_key(&fed.try_recv().unwrap()), "c/web");
        assert!(fed.try_recv().is_err() && gone.try_recv().is_err());
        assert_eq!(cache.state().len(), 1);
    }

    /// A re-list shares each object it finds at the cached version with the cache (no second copy of the
    /// cache while it runs), and takes a changed or unversioned one as listed.
    #[test]
    fn a_relist_shares_the_unchanged_objects_with_the_cache() {
        let cache = Cache::<Compact<Service>>::default();
        let (feed, _fed) = broadcast::channel(16);
        let (deleted, _gone) = broadcast::channel(16);
        let (ready, _) = watch::channel(false);
        let mut reflector = Reflector {
            cache: cache.clone(),
            feed,
            deleted,
            ready,
            relisted: None,
            listing_since: None,
        };
        let unversioned = || -> Compact<Service> {
            serde_json::from_value(serde_json::json!({"metadata": {"namespace": "c", "name": "web"}}))
                .unwrap()
        };
        let list = |reflector: &mut Reflector<Compact<Service>>, b_version: &str| {
            reflector.apply(watcher::Event::Init);
            reflector.apply(watcher::Event::InitApply(service("a", "web", "1")));
            reflector.apply(watcher::Event::InitApply(service("b", "web", b_version)));
            reflector.apply(watcher::Event::InitApply(unversioned()));
            reflector.apply(watcher::Event::InitDone);
        };
        list(&mut reflector, "1");
        let before = [
            cache.get("a/web").unwrap(),
            cache.get("b/web").unwrap(),
            cache.get("c/web").unwrap(),
        ];
        list(&mut reflector, "2");
        assert!(
            Arc::ptr_eq(&before[0], &cache.get("a/web").unwrap()),
            "unchanged: shared"
        );
        assert!(
            !Arc::ptr_eq(&before[1], &cache.get("b/web").unwrap()),
            "changed: as listed"
        );
        assert_eq!(version(&cache.get("b/web").unwrap()), "2");
        assert!(
            !Arc::ptr_eq(&before[2], &cache.get("c/web").unwrap()),
            "no version: as listed"
        );
    }

    fn cache_key(service: &Compact<Service>) -> String {
        service.key()
    }

    /// Every concurrent waiter sees the informer ready (kube-runtime 5's `Store::wait_until_ready`, used
    /// here before, woke only one).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn every_concurrent_waiter_sees_the_informer_ready() {
        let server = kube_ccm_test_apiserver::TestApiServer::start().await.unwrap();
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
