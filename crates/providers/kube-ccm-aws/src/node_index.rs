//! Which node runs on which instance, from the manager's shared node cache (upstream reads its node
//! informer, handed over by `SetInformers`, through an `instanceID` index): a listed route names its node
//! by the node's name, as upstream's `instanceIDToNodeName`, and a route for a node goes to the instance
//! its provider ID names, as `nodeNameToInstanceID`. No watch of its own: the index follows the cache
//! while this replica leads, and is empty (so callers fall back to EC2's names) otherwise.

use parking_lot::RwLock;
use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, OnceLock};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use kube_ccm_provider::{CacheEvent, SharedCaches};
use tokio_util::sync::CancellationToken;

use crate::instances::instance_id_of;

#[derive(Default)]
pub(crate) struct NodeIndex {
    caches: OnceLock<Arc<dyn SharedCaches>>,
    state: RwLock<State>,
}

#[derive(Default)]
struct State {
    /// Which `follow` fills it (a follower that ended leaves a newer one's state alone).
    generation: u64,
    /// Whether the index holds the cache's full list (and follows it).
    synced: bool,
    /// Instance ID → the names of the nodes on it (one, unless something is wrong).
    nodes: HashMap<String, BTreeSet<String>>,
    /// Node name → its instance ID and the node's UID.
    instances: HashMap<String, (String, String)>,
}

impl State {
    fn remove(&mut self, name: &str) {
        if let Some((instance, _)) = self.instances.remove(name)
            && let Some(names) = self.nodes.get_mut(&instance)
        {
            names.remove(name);
            if names.is_empty() {
                self.nodes.remove(&instance);
            }
        }
    }

    /// Forgets a deleted node, unless a node of the same name with another UID replaced it (the feeds of
    /// changes and deletions are not ordered with each other).
    fn delete(&mut self, node: &Node) {
        let name = node.metadata.name.as_deref().unwrap_or_default();
        let uid = node.metadata.uid.as_deref().unwrap_or_default();
        if self.instances.get(name).is_some_and(|(_, known)| known == uid) {
            self.remove(name);
        }
    }

    fn apply(&mut self, node: &Node) {
        let Some(name) = node.metadata.name.as_deref() else {
            return;
        };
        self.remove(name);
        let instance = node
            .spec
            .as_ref()
            .and_then(|spec| spec.provider_id.as_deref())
            .and_then(instance_id_of);
        if let Some(instance) = instance {
            let uid = node.metadata.uid.clone().unwrap_or_default();
            self.instances.insert(name.to_owned(), (instance.to_owned(), uid));
            self.nodes
                .entry(instance.to_owned())
                .or_default()
                .insert(name.to_owned());
        }
    }
}

impl NodeIndex {
    /// The caches to follow (from the provider's initialisation).
    pub(crate) fn set_caches(&self, caches: Arc<dyn SharedCaches>) {
        let _ = self.caches.set(caches);
    }

    /// Follows the node cache until `stop` fires, then forgets everything.
    pub(crate) fn follow(self: &Arc<Self>, stop: CancellationToken) {
        let Some(caches) = self.caches.get().cloned() else {
            return;
        };
        let index = self.clone();
        let generation = {
            let mut state = index.write();
            *state = State {
                generation: state.generation + 1,
                ..State::default()
            };
            state.generation
        };
        tokio::spawn(async move {
            // Subscribed before the list is read, so no change falls between them.
            let mut events = caches.node_events();
            tokio::select! {
                () = stop.cancelled() => {}
                () = async {
                    caches.nodes_synced().await;
                    {
                        let mut state = index.write();
                        if state.generation != generation {
                            return;
                        }
                        for node in caches.nodes() {
                            state.apply(&node);
                        }
                        state.synced = true;
                    }
                    while let Some(event) = events.next().await {
                        let mut state = index.write();
                        if state.generation != generation {
                            return;
                        }
                        match event {
                            CacheEvent::Applied(node) => state.apply(&node),
                            CacheEvent::Deleted(node) => state.delete(&node),
                        }
                    }
                } => {}
            }
            let mut state = index.write();
            if state.generation == generation {
                *state = State {
                    generation,
                    ..State::default()
                };
            }
        });
    }

    fn write(&self) -> parking_lot::RwLockWriteGuard<'_, State> {
        self.state.write()
    }

    fn read(&self) -> parking_lot::RwLockReadGuard<'_, State> {
        self.state.read()
    }

    /// The one node on `instance`; `None` when the index is not following the cache, or no node or
    /// several are on it.
    pub(crate) fn node_on(&self, instance: &str) -> Option<String> {
        let state = self.read();
        let names = state.nodes.get(instance).filter(|_| state.synced)?;
        (names.len() == 1).then(|| names.iter().next().cloned()).flatten()
    }

    /// The instance node `name` runs on, by its provider ID; `None` when the index is not following the
    /// cache or the node has no AWS provider ID.
    pub(crate) fn instance_of(&self, name: &str) -> Option<String> {
        let state = self.read();
        state
            .instances
            .get(name)
            .filter(|_| state.synced)
            .map(|(instance, _)| instance.clone())
    }

    /// Whether the index follows the cache.
    #[cfg(test)]
    pub(crate) fn synced(&self) -> bool {
        self.read().synced
    }
}

#[cfg(test)]
mod tests {
    use parking_lot::Mutex;
    use std::time::Duration;

    use async_trait::async_trait;
    use futures::stream::BoxStream;
    use k8s_openapi::api::core::v1::Service;
    use tokio::sync::{Notify, broadcast};

    use super::*;

    /// Caches fed by the test: a list, then events.
    struct Fed {
        nodes: Mutex<Vec<Node>>,
        synced: Notify,
        events: broadcast::Sender<CacheEvent<Node>>,
    }

    #[async_trait]
    impl SharedCaches for Fed {
        async fn nodes_synced(&self) {
            self.synced.notified().await;
        }
        fn nodes_ready(&self) -> bool {
            true
        }
        fn node(&self, _name: &str) -> Option<Node> {
            None
        }
        fn nodes(&self) -> Vec<Node> {
            self.nodes.lock().clone()
        }
        fn node_events(&self) -> BoxStream<'static, CacheEvent<Node>> {
            let receiver = self.events.subscribe();
            Box::pin(futures::stream::unfold(receiver, |mut receiver| async move {
                receiver.recv().await.ok().map(|event| (event, receiver))
            }))
        }
        async fn services_synced(&self) {}
        fn services_ready(&self) -> bool {
            false
        }
        fn service(&self, _namespace: &str, _name: &str) -> Option<Service> {
            None
        }
        fn services(&self) -> Vec<Service> {
            Vec::new()
        }
        fn service_events(&self) -> BoxStream<'static, CacheEvent<Service>> {
            Box::pin(futures::stream::empty())
        }
    }

    fn node(name: &str, provider_id: Option<&str>) -> Node {
        node_with_uid(name, provider_id, name)
    }

    fn node_with_uid(name: &str, provider_id: Option<&str>, uid: &str) -> Node {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "uid": uid},
            "spec": {"providerID": provider_id},
        }))
        .unwrap()
    }

    async fn until(what: impl Fn() -> bool) {
        tokio::time::timeout(Duration::from_secs(5), async {
            while !what() {
                tokio::task::yield_now().await;
            }
        })
        .await
        .expect("reached in time");
    }

    #[tokio::test]
    async fn the_index_follows_the_cache_while_leading_and_forgets_after() {
        let (events, _) = broadcast::channel(16);
        let caches = Arc::new(Fed {
            nodes: Mutex::new(vec![
                node("a", Some("aws:///us-east-1a/i-0000000a")),
                node("no-id", None),
                node("twin-1", Some("aws:///us-east-1a/i-0000000b")),
                node("twin-2", Some("aws:///us-east-1b/i-0000000b")),
            ]),
            synced: Notify::new(),
            events: events.clone(),
        });
        let index = Arc::new(NodeIndex::default());
        assert_eq!(index.node_on("i-0000000a"), None, "no caches, nothing known");
        index.set_caches(caches.clone());
        let stop = CancellationToken::new();
        index.follow(stop.clone());
        assert!(!index.synced(), "not before the cache's list");
        caches.synced.notify_one();
        until(|| index.synced()).await;
        assert_eq!(index.node_on("i-0000000a").as_deref(), Some("a"));
        assert_eq!(index.instance_of("a").as_deref(), Some("i-0000000a"));
        assert_eq!(index.instance_of("no-id"), None);
        assert_eq!(
            index.node_on("i-0000000b"),
            None,
            "two nodes on one instance: neither"
        );

        events
            .send(CacheEvent::Applied(node(
                "a",
                Some("aws:///us-east-1a/i-0000000c"),
            )))
            .unwrap();
        events.send(CacheEvent::Deleted(node("twin-2", None))).unwrap();
        until(|| index.node_on("i-0000000c").is_some()).await;
        assert_eq!(index.node_on("i-0000000a"), None, "moved");
        until(|| index.node_on("i-0000000b").is_some()).await;
        assert_eq!(index.node_on("i-0000000b").as_deref(), Some("twin-1"));

        // A node deleted and made again under its name: the late deletion of the old one changes nothing.
        events
            .send(CacheEvent::Applied(node_with_uid(
                "a",
                Some("aws:///us-east-1a/i-0000000d"),
                "a-2",
            )))
            .unwrap();
        events
            .send(CacheEvent::Deleted(node_with_uid("a", None, "a")))
            .unwrap();
        until(|| index.node_on("i-0000000d").is_some()).await;
        events
            .send(CacheEvent::Applied(node(
                "marker",
                Some("aws:///us-east-1a/i-0000000e"),
            )))
            .unwrap();
        until(|| index.node_on("i-0000000e").is_some()).await;
        assert_eq!(
            index.node_on("i-0000000d").as_deref(),
            Some("a"),
            "the stale deletion is ignored"
        );

        // Leading again at once: the old follower's end does not wipe the new one's index.
        let again = CancellationToken::new();
        index.follow(again.clone());
        stop.cancel();
        caches.synced.notify_one();
        until(|| index.synced()).await;
        tokio::task::yield_now().await;
        assert!(index.synced());
        again.cancel();
        until(|| !index.synced()).await;
        assert_eq!(index.node_on("i-0000000c"), None, "forgotten once not leading");
    }
}
