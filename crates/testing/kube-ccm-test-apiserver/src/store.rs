//! In-memory storage: objects as JSON per resource type, one global resourceVersion counter, and a
//! bounded history of changes per type for watches.

use std::collections::{BTreeMap, VecDeque};
use std::ops::Bound;
use std::sync::Arc;

use bytes::Bytes;
use serde_json::Value;
use tokio::sync::broadcast;

use crate::resources::{RESOURCES, ResourceId};

/// A stored object and its serialised form (serialised once, sent to every reader and watcher).
#[derive(Debug)]
pub(crate) struct Stored {
    pub(crate) object: Value,
    pub(crate) json: Bytes,
    pub(crate) rv: u64,
}

pub(crate) type Obj = Arc<Stored>;

impl Stored {
    fn new(mut object: Value, rv: u64) -> Obj {
        object["metadata"]["resourceVersion"] = Value::String(rv.to_string());
        let json = Bytes::from(serde_json::to_vec(&object).expect("JSON values serialise"));
        Arc::new(Stored { object, json, rv })
    }
}

/// A watch event type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum EventType {
    Added,
    Modified,
    Deleted,
}

/// One committed change.
#[derive(Debug)]
pub(crate) struct Change {
    pub(crate) event: EventType,
    pub(crate) object: Obj,
    /// The object before the change, to tell watchers with selectors when it moves in or out of view.
    pub(crate) previous: Option<Obj>,
}

/// `(namespace, name)`; the namespace is empty for cluster-scoped objects.
pub(crate) type Key = (String, String);

struct Table {
    objects: BTreeMap<Key, Obj>,
    history: VecDeque<Arc<Change>>,
    /// Changes with a resourceVersion at or below this may be missing from `history`.
    compacted: u64,
    sender: broadcast::Sender<Arc<Change>>,
}

/// A watch start from a resourceVersion older than the kept history.
#[derive(Debug)]
pub(crate) struct Expired {
    pub(crate) requested: u64,
    pub(crate) oldest: u64,
}

/// Everything a watch needs to start: the changes to replay and the live feed after them.
pub(crate) struct Subscription {
    pub(crate) replay: Vec<Arc<Change>>,
    pub(crate) receiver: broadcast::Receiver<Arc<Change>>,
    pub(crate) resource_version: u64,
}

/// All stored objects.
pub(crate) struct Store {
    /// Cluster IPs and node ports handed out.
    pub(crate) allocations: crate::defaults::Allocations,
    /// Features that are on.
    pub(crate) features: crate::defaults::Features,
    rv: u64,
    tables: Vec<Table>,
    history_limit: usize,
}

impl Store {
    pub(crate) fn new(history_limit: usize) -> Store {
        let tables = RESOURCES
            .iter()
            .map(|_| Table {
                objects: BTreeMap::new(),
                history: VecDeque::new(),
                compacted: 0,
                sender: broadcast::channel(16 * 1024).0,
            })
            .collect();
        Store {
            allocations: crate::defaults::Allocations::default(),
            features: crate::defaults::Features::default(),
            rv: 1,
            tables,
            history_limit,
        }
    }

    /// The latest resourceVersion.
    pub(crate) fn resource_version(&self) -> u64 {
        self.rv
    }

    pub(crate) fn get(&self, id: ResourceId, key: &Key) -> Option<Obj> {
        self.tables[id].objects.get(key).cloned()
    }

    /// Objects in key order, optionally in one namespace.
    pub(crate) fn list(&self, id: ResourceId, namespace: Option<&str>) -> Vec<Obj> {
        let objects = &self.tables[id].objects;
        match namespace {
            Some(ns) => objects
                .range((ns.to_owned(), String::new())..)
                .take_while(|((object_ns, _), _)| object_ns == ns)
                .map(|(_, o)| o.clone())
                .collect(),
            None => objects.values().cloned().collect(),
        }
    }

    /// Objects in key order after `after` (a continue token's cursor), optionally in one namespace: a page
    /// of a paged list starts where the last ended rather than scanning the table from its beginning.
    pub(crate) fn list_after<'a>(
        &'a self,
        id: ResourceId,
        namespace: Option<&'a str>,
        after: Option<&Key>,
    ) -> impl Iterator<Item = &'a Obj> + 'a {
        let start = match (after, namespace) {
            (Some(after), _) => Bound::Excluded(after.clone()),
            (None, Some(ns)) => Bound::Included((ns.to_owned(), String::new())),
            (None, None) => Bound::Unbounded,
        };
        self.tables[id]
            .objects
            .range((start, Bound::Unbounded))
            .take_while(move |((object_ns, _), _)| namespace.is_none_or(|ns| object_ns == ns))
            .map(|(_, object)| object)
    }

    pub(crate) fn count(&self, id: ResourceId) -> usize {
        self.tables[id].objects.len()
    }

    /// Stores `object` under `key` with a new resourceVersion and tells watchers.
    pub(crate) fn put(&mut self, id: ResourceId, key: Key, object: Value) -> Obj {
        self.rv += 1;
        let stored = Stored::new(object, self.rv);
        let previous = self.tables[id].objects.insert(key, stored.clone());
        let event = if previous.is_some() {
            EventType::Modified
        } else {
            EventType::Added
        };
        self.publish(
            id,
            Change {
                event,
                object: stored.clone(),
                previous,
            },
        );
        stored
    }

    /// Removes the object; the DELETED event carries it with the deletion's resourceVersion, as the real
    /// server's does.
    pub(crate) fn remove(&mut self, id: ResourceId, key: &Key) -> Option<Obj> {
        let previous = self.tables[id].objects.remove(key)?;
        self.rv += 1;
        let stored = Stored::new(previous.object.clone(), self.rv);
        self.publish(
            id,
            Change {
                event: EventType::Deleted,
                object: stored.clone(),
                previous: Some(previous),
            },
        );
        Some(stored)
    }

    fn publish(&mut self, id: ResourceId, change: Change) {
        let limit = self.history_limit;
        let table = &mut self.tables[id];
        let change = Arc::new(change);
        table.history.push_back(change.clone());
        while table.history.len() > limit {
            if let Some(dropped) = table.history.pop_front() {
                table.compacted = dropped.object.rv;
            }
        }
        // No receivers is fine: nobody is watching this type.
        let _ = table.sender.send(change);
    }

    /// Starts a watch. `from`: None for "now" (the caller replays the current state itself), Some(rv) to
    /// replay every change after `rv`.
    pub(crate) fn subscribe(&self, id: ResourceId, from: Option<u64>) -> Result<Subscription, Expired> {
        let table = &self.tables[id];
        let replay = match from {
            None => Vec::new(),
            Some(rv) if rv < table.compacted => {
                return Err(Expired {
                    requested: rv,
                    oldest: table.compacted,
                });
            }
            Some(rv) => table
                .history
                .iter()
                .filter(|c| c.object.rv > rv)
                .cloned()
                .collect(),
        };
        Ok(Subscription {
            replay,
            receiver: table.sender.subscribe(),
            resource_version: self.rv,
        })
    }

    /// The version at or below which `id`'s changes may be missing from its history.
    pub(crate) fn compacted(&self, id: ResourceId) -> u64 {
        self.tables[id].compacted
    }

    /// Forgets every type's history: watches from any earlier resourceVersion get 410 Expired.
    pub(crate) fn compact(&mut self) {
        let rv = self.rv;
        for table in &mut self.tables {
            table.history.clear();
            table.compacted = rv;
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::resources::find;

    fn key(name: &str) -> Key {
        ("default".to_owned(), name.to_owned())
    }

    #[test]
    fn versions_increase_and_history_replays_after_a_version() {
        let id = find("", "v1", "configmaps").unwrap();
        let mut store = Store::new(3);
        let a = store.put(id, key("a"), json!({"metadata": {"name": "a"}}));
        let b = store.put(id, key("b"), json!({"metadata": {"name": "b"}}));
        assert!(b.rv > a.rv);
        assert_eq!(b.object["metadata"]["resourceVersion"], b.rv.to_string());
        let subscription = store.subscribe(id, Some(a.rv)).map_err(|_| ()).unwrap();
        assert_eq!(subscription.replay.len(), 1);
        assert_eq!(subscription.replay[0].object.rv, b.rv);
        let removed = store.remove(id, &key("a")).unwrap();
        assert!(removed.rv > b.rv);
        assert_eq!(store.list(id, Some("default")).len(), 1);
    }

    #[test]
    fn watching_from_before_the_kept_history_is_expired() {
        let id = find("", "v1", "configmaps").unwrap();
        let mut store = Store::new(2);
        let first = store.put(id, key("a"), json!({"metadata": {}}));
        for name in ["b", "c", "d"] {
            store.put(id, key(name), json!({"metadata": {}}));
        }
        assert!(store.subscribe(id, Some(first.rv)).is_err());
        let now = store.resource_version();
        assert!(store.subscribe(id, Some(now)).is_ok());
        store.compact();
        assert!(store.subscribe(id, Some(now - 1)).is_err());
        assert!(store.subscribe(id, Some(now)).is_ok());
    }

    #[test]
    fn namespaced_listing_stays_in_its_namespace() {
        let id = find("", "v1", "configmaps").unwrap();
        let mut store = Store::new(10);
        store.put(id, ("a".into(), "x".into()), json!({"metadata": {}}));
        store.put(id, ("ab".into(), "x".into()), json!({"metadata": {}}));
        store.put(id, ("b".into(), "x".into()), json!({"metadata": {}}));
        assert_eq!(store.list(id, Some("a")).len(), 1);
        assert_eq!(store.list(id, None).len(), 3);
    }

    #[test]
    fn a_page_starts_after_its_cursor_and_stays_in_its_namespace() {
        let id = find("", "v1", "configmaps").unwrap();
        let mut store = Store::new(10);
        for (ns, name) in [("a", "x"), ("a", "y"), ("a", "z"), ("ab", "x"), ("b", "x")] {
            store.put(id, (ns.into(), name.into()), json!({"metadata": {"name": name}}));
        }
        let names = |namespace: Option<&str>, after: Option<(&str, &str)>| -> Vec<String> {
            let after = after.map(|(ns, name)| (ns.to_owned(), name.to_owned()));
            store
                .list_after(id, namespace, after.as_ref())
                .map(|o| {
                    o.object["metadata"]["name"]
                        .as_str()
                        .unwrap_or_default()
                        .to_owned()
                })
                .collect()
        };
        assert_eq!(names(Some("a"), None), ["x", "y", "z"]);
        assert_eq!(names(Some("a"), Some(("a", "x"))), ["y", "z"]);
        assert!(names(Some("a"), Some(("a", "z"))).is_empty());
        assert_eq!(names(None, Some(("a", "z"))), ["x", "x"]);
        assert_eq!(names(None, None).len(), 5);
    }
}
