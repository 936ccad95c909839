//! Events as upstream's managers record them: core/v1 `events` (the group upstream's published roles grant),
//! written the way client-go's legacy recorder writes them, so an operator's existing RBAC, dashboards and
//! `kubectl get events` see the same objects.
//!
//! - A new Event is named `<object>.<hex nanoseconds>`, lives in the object's namespace (`default` for a
//!   cluster-scoped object such as a Node), and carries `source.component` and `reportingComponent` (the
//!   controller's upstream reporter name, e.g. `cloud-node-controller`, `service-controller`), `count` 1 and
//!   `firstTimestamp` = `lastTimestamp`. Beyond upstream, `source.host` and `reportingInstance` name this
//!   process (upstream leaves them empty), so an Event says which replica wrote it.
//! - A repeat (same source, object, type, reason and message) is the same Event with `count` + 1: a
//!   strategic-merge patch of `count`, `lastTimestamp` and `message`; a patch that finds the Event gone
//!   creates it again under its name.
//! - After ten different messages of one reason about one object within ten minutes, further ones are
//!   combined into one Event, `(combined from similar events): <message>`.
//! - A token bucket per source, object and type (burst 25, one more every five minutes) drops the rest,
//!   as client-go's spam filter.
//! - The three caches keep at most 4,096 keys each (the oldest go first), as client-go's.
//!
//! A message longer than 1,024 bytes is cut to that (the API server checks the length only of Events with
//! an `eventTime`, which these lack, but an Event is no place for a page of text). Recording never fails a
//! caller: a refused write is logged at debug level.
//!
//! A background recorder tries a write again when it failed before the API server answered (a connection
//! refused or reset, a request timeout), as client-go's: up to [`TRIES_PER_EVENT`] tries, ten seconds
//! apart, the first wait a random part of that so that many processes do not all come back at once. An
//! answer is final (as client-go's, which abandons an Event on any status error), and so is a write the
//! lock refused: a process that lost its lock does not keep trying.
//!
//! A controller's recorder writes in the background ([`EventRecorder::in_background`]), as client-go's
//! broadcaster does: a sync never waits for its Events (a load balancer's two cost each sync two API
//! round trips: 79 services/s where upstream did 118 in `bench versus`). One task a recorder writes them
//! in the order they were recorded (a count's patch never overtakes the Event's creation); past
//! [`QUEUED_EVENTS`] waiting, further ones are dropped, as client-go's. They go through the controller's
//! client, so its lock fences them as any other write: those still queued are refused once it stops.

use parking_lot::Mutex;
use std::collections::{HashMap, VecDeque};
use std::hash::Hash;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Event, EventSource, ObjectReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, Time};
use kube::api::{Api, Patch, PostParams};
use tokio::time::Instant;

pub(crate) use kube::runtime::events::EventType;

/// The longest message recorded; longer ones are cut at a character boundary.
pub(crate) const MAX_MESSAGE_BYTES: usize = 1024;
/// Entries each cache keeps (client-go's `maxLruCacheEntries`).
const CACHE_ENTRIES: usize = 4096;
/// Different messages of one reason about one object before they are combined.
const AGGREGATE_AFTER: usize = 10;
/// The window in which those messages count.
const AGGREGATE_WINDOW: Duration = Duration::from_secs(600);
/// The spam filter's burst, and the time to earn one more Event.
const SPAM_BURST: f64 = 25.0;
const SPAM_REFILL: Duration = Duration::from_secs(300);
/// The prefix of a combined Event's message (client-go's).
const COMBINED: &str = "(combined from similar events): ";
/// Events a background recorder holds before it drops new ones (client-go's `maxQueuedEvents`).
pub(crate) const QUEUED_EVENTS: usize = 1000;
/// Tries at one Event's write before it is given up (client-go's `maxTriesPerEvent`).
pub(crate) const TRIES_PER_EVENT: u32 = 12;
/// The wait between those tries (client-go's `sleepDuration`).
const RETRY_EVERY: Duration = Duration::from_secs(10);

/// One controller's (or the leader elector's) Event recorder.
pub(crate) struct EventRecorder {
    client: kube::Client,
    source: EventSource,
    /// Whether Events carry an `eventTime` (microseconds) beside the whole-second timestamps.
    event_time: bool,
    state: Mutex<State>,
    /// Whether writes are queued to a background task ([`EventRecorder::in_background`]).
    background: bool,
    /// The background task's queue, from the first Event on.
    queue: std::sync::OnceLock<tokio::sync::mpsc::Sender<Write>>,
    /// The wait between tries at a failed write ([`RETRY_EVERY`]; shorter in tests).
    retry_every: Duration,
}

/// What an Event is about, as the caches key it.
#[derive(Hash)]
struct Subject<'a> {
    kind: &'a str,
    namespace: &'a str,
    name: &'a str,
    uid: &'a str,
    api_version: &'a str,
}

impl Subject<'_> {
    fn of(about: &ObjectReference) -> Subject<'_> {
        fn text(value: &Option<String>) -> &str {
            value.as_deref().unwrap_or_default()
        }
        Subject {
            kind: text(&about.kind),
            namespace: text(&about.namespace),
            name: text(&about.name),
            uid: text(&about.uid),
            api_version: text(&about.api_version),
        }
    }
}

/// A cache's key: 128 bits of two SipHash digests of what client-go keys by (the object, type, reason,
/// message…), not the strings themselves. A node controller records an Event for each of thousands of
/// nodes, and keyed by their strings (a key held twice, in the map and in the eviction order) the three
/// caches would hold megabytes of repeated text. Two keys share a fingerprint with a chance of about
/// 2⁻¹⁰⁴ among 4,096.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct Fingerprint(u64, u64);

impl Fingerprint {
    fn of(value: &impl Hash) -> Fingerprint {
        use std::hash::{DefaultHasher, Hasher as _};
        let digest = |salt: u8| {
            let mut hasher = DefaultHasher::new();
            salt.hash(&mut hasher);
            value.hash(&mut hasher);
            hasher.finish()
        };
        Fingerprint(digest(0), digest(1))
    }
}

/// The Event a key was last written as.
#[derive(Debug, Clone)]
struct Written {
    namespace: String,
    name: String,
    count: i32,
    first: Time,
}

/// The messages seen for one object, type and reason, and when the last of them came.
#[derive(Debug, Default)]
struct Similar {
    messages: std::collections::HashSet<Fingerprint>,
    last: Option<Instant>,
}

/// A token bucket.
#[derive(Debug)]
struct Bucket {
    tokens: f64,
    at: Instant,
}

#[derive(Default)]
struct State {
    /// By object, type, reason and message (or none, once combined).
    written: Bounded<Fingerprint, Written>,
    /// By object, field path, type and reason.
    similar: Bounded<Fingerprint, Similar>,
    /// By object and type.
    spam: Bounded<Fingerprint, Bucket>,
}

/// A map that forgets its oldest keys past [`CACHE_ENTRIES`].
struct Bounded<K, V> {
    entries: HashMap<K, V>,
    order: VecDeque<K>,
}

impl<K, V> Default for Bounded<K, V> {
    fn default() -> Self {
        Bounded {
            entries: HashMap::new(),
            order: VecDeque::new(),
        }
    }
}

impl<K: Clone + Eq + Hash, V> Bounded<K, V> {
    fn get_or_insert_with(&mut self, key: &K, make: impl FnOnce() -> V) -> &mut V {
        if !self.entries.contains_key(key) {
            self.evict();
            self.order.push_back(key.clone());
            self.entries.insert(key.clone(), make());
        }
        self.entries.get_mut(key).expect("inserted above")
    }

    fn get(&self, key: &K) -> Option<&V> {
        self.entries.get(key)
    }

    fn insert(&mut self, key: K, value: V) {
        if let Some(slot) = self.entries.get_mut(&key) {
            *slot = value;
            return;
        }
        self.evict();
        self.order.push_back(key.clone());
        self.entries.insert(key, value);
    }

    /// Makes room for one more key.
    fn evict(&mut self) {
        while self.entries.len() >= CACHE_ENTRIES {
            let Some(oldest) = self.order.pop_front() else {
                break;
            };
            self.entries.remove(&oldest);
        }
    }
}

/// What to write for one recorded Event.
#[derive(Debug, PartialEq)]
enum Write {
    Create(Event),
    /// Count + 1 of an Event already written (created again if it is gone).
    Bump(Event),
    /// Dropped by the spam filter.
    Drop,
}

impl Write {
    /// The Event's reason, for the log.
    fn reason(&self) -> &str {
        match self {
            Write::Create(event) | Write::Bump(event) => event.reason.as_deref().unwrap_or_default(),
            Write::Drop => "",
        }
    }
}

/// Whether a failed Event write is worth another try: it failed before the API server answered, and not
/// because the lock governing the recorder's controller refused it or passed its validity (see
/// [`crate::client`]).
fn worth_retrying(error: &kube::Error) -> bool {
    let kube::Error::Service(error) = error else {
        return matches!(error, kube::Error::HyperError(_));
    };
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(error.as_ref());
    while let Some(error) = cause {
        if error.is::<crate::Fenced>() || error.is::<crate::Stopping>() {
            return false;
        }
        if let Some(deadline) = error.downcast_ref::<crate::DeadlineExceeded>() {
            return matches!(deadline.why, crate::Deadline::RequestTimeout);
        }
        cause = error.source();
    }
    true
}

impl EventRecorder {
    /// A recorder whose Events are reported by `component` (upstream's reporter name) from `host` (this
    /// process's identity).
    pub(crate) fn new(client: kube::Client, component: &str, host: &str) -> EventRecorder {
        EventRecorder {
            client,
            source: EventSource {
                component: Some(component.to_owned()),
                host: (!host.is_empty()).then(|| host.to_owned()),
            },
            event_time: false,
            state: Mutex::default(),
            background: false,
            queue: std::sync::OnceLock::new(),
            retry_every: RETRY_EVERY,
        }
    }

    /// A recorder whose writes happen in one background task, in order, so that recording never waits
    /// for the API server (see the module's documentation). The task ends when the recorder is dropped,
    /// after the Events already queued.
    pub(crate) fn in_background(mut self) -> EventRecorder {
        self.background = true;
        self
    }

    /// Events that also carry an `eventTime` with microseconds (client-go's legacy recorder sets none, and
    /// its timestamps are whole seconds): for the leader-election Events, from which `leader-migration
    /// status --report` orders hand-offs a few milliseconds apart. The API server then checks them as
    /// new-style Events: a reason, an action, a reporting component and instance are required.
    pub(crate) fn with_event_time(mut self) -> EventRecorder {
        self.event_time = true;
        self
    }

    /// Failed writes tried again `every` apart, not [`RETRY_EVERY`].
    #[cfg(test)]
    fn retrying_every(mut self, every: Duration) -> EventRecorder {
        self.retry_every = every;
        self
    }

    /// Records an Event about `about`. `action` is kept in the Event's `action` field (upstream's legacy
    /// recorder sets none). Never fails: a refused write is logged.
    pub(crate) async fn record(
        &self,
        about: &ObjectReference,
        kind: EventType,
        reason: &str,
        action: &str,
        message: String,
    ) {
        let write = self.correlate(about, kind, reason, action, message, (Instant::now(), now()));
        if write == Write::Drop {
            tracing::debug!(reason, "event dropped by the spam filter");
            return;
        }
        if !self.background {
            if let Err(error) = Self::write_event(&self.client, &write).await {
                tracing::debug!(%error, reason, component = self.source.component.as_deref(), "cannot record event");
            }
            return;
        }
        let queue = self.queue.get_or_init(|| {
            let (sender, mut receiver) = tokio::sync::mpsc::channel(QUEUED_EVENTS);
            let (client, source, every) = (self.client.clone(), self.source.clone(), self.retry_every);
            tokio::spawn(async move {
                while let Some(write) = receiver.recv().await {
                    EventRecorder::write_retrying(&client, write, &source, every).await;
                }
            });
            sender
        });
        if queue.try_send(write).is_err() {
            tracing::debug!(
                reason,
                component = self.source.component.as_deref(),
                "event dropped: {QUEUED_EVENTS} are waiting to be written"
            );
        }
    }

    /// Writes one Event, trying again (at most [`TRIES_PER_EVENT`] times, `every` apart) while its write
    /// fails before the API server answers; see the module's documentation.
    async fn write_retrying(client: &kube::Client, write: Write, source: &EventSource, every: Duration) {
        let component = source.component.as_deref();
        let mut tries = 0;
        loop {
            let Err(error) = Self::write_event(client, &write).await else {
                return;
            };
            let reason = write.reason();
            tries += 1;
            if !worth_retrying(&error) {
                tracing::debug!(%error, reason, component, "cannot record event");
                return;
            }
            if tries >= TRIES_PER_EVENT {
                tracing::warn!(%error, reason, component, tries, "cannot record event: giving up");
                return;
            }
            // The first wait is random, so that the recorders of many processes spread out.
            let wait = if tries == 1 {
                every.mul_f64(rand::random::<f64>())
            } else {
                every
            };
            tracing::debug!(%error, reason, component, tries, ?wait, "cannot record event yet: trying again");
            tokio::time::sleep(wait).await;
        }
    }

    /// Writes one Event: creates it, or patches its count (creating it again if it is gone).
    async fn write_event(client: &kube::Client, write: &Write) -> Result<(), kube::Error> {
        let (event, bump) = match write {
            Write::Drop => return Ok(()),
            Write::Create(event) => (event, false),
            Write::Bump(event) => (event, true),
        };
        let namespace = event.metadata.namespace.as_deref().unwrap_or_default();
        let api: Api<Event> = Api::namespaced(client.clone(), namespace);
        if bump {
            let name = event.metadata.name.as_deref().unwrap_or_default();
            let patch = serde_json::json!({
                "count": event.count,
                "lastTimestamp": event.last_timestamp,
                "message": event.message,
            });
            // Gone meanwhile (expired, deleted): created again under its name, as client-go does.
            match api
                .patch(name, &crate::written::patch_params(), &Patch::Strategic(patch))
                .await
            {
                Err(kube::Error::Api(status)) if status.code == 404 => {}
                other => return other.map(drop),
            }
        }
        api.create(&PostParams::default(), event).await.map(drop)
    }

    /// What recording this Event now writes, with the caches updated (pure but for the caches).
    fn correlate(
        &self,
        about: &ObjectReference,
        kind: EventType,
        reason: &str,
        action: &str,
        mut message: String,
        (instant, wall): (Instant, Time),
    ) -> Write {
        truncate(&mut message);
        let type_ = match kind {
            EventType::Normal => "Normal",
            EventType::Warning => "Warning",
        };
        let subject = Subject::of(about);
        let field_path = about.field_path.as_deref().unwrap_or_default();
        let similar_key = Fingerprint::of(&(&subject, field_path, type_, reason));
        let spam_key = Fingerprint::of(&(&subject, type_));
        let mut state = self.state.lock();
        // The aggregator: past ten different messages in the window, one combined Event.
        let similar = state.similar.get_or_insert_with(&similar_key, Similar::default);
        if similar
            .last
            .is_some_and(|last| instant.duration_since(last) > AGGREGATE_WINDOW)
        {
            similar.messages.clear();
        }
        similar.last = Some(instant);
        similar.messages.insert(Fingerprint::of(&message));
        let (key, message) = if similar.messages.len() >= AGGREGATE_AFTER {
            let key = Fingerprint::of(&(similar_key, ""));
            let mut combined = format!("{COMBINED}{message}");
            truncate(&mut combined);
            (key, combined)
        } else {
            (Fingerprint::of(&(similar_key, message.as_str())), message)
        };
        // The event logger: a repeat is the same Event, counted.
        let written = state.written.get(&key).cloned();
        let (event, repeat) = match written {
            Some(written) => {
                let event = Event {
                    metadata: ObjectMeta {
                        name: Some(written.name.clone()),
                        namespace: Some(written.namespace.clone()),
                        ..ObjectMeta::default()
                    },
                    count: Some(written.count + 1),
                    first_timestamp: Some(written.first.clone()),
                    ..self.event(about, type_, reason, action, &message, &wall)
                };
                (event, true)
            }
            None => (self.event(about, type_, reason, action, &message, &wall), false),
        };
        state.written.insert(
            key,
            Written {
                namespace: event.metadata.namespace.clone().unwrap_or_default(),
                name: event.metadata.name.clone().unwrap_or_default(),
                count: event.count.unwrap_or(1),
                first: event.first_timestamp.clone().unwrap_or_else(|| wall.clone()),
            },
        );
        // The spam filter, after counting (as client-go: a dropped repeat still counts).
        let bucket = state.spam.get_or_insert_with(&spam_key, || Bucket {
            tokens: SPAM_BURST,
            at: instant,
        });
        let earned = instant.duration_since(bucket.at).as_secs_f64() / SPAM_REFILL.as_secs_f64();
        bucket.tokens = (bucket.tokens + earned).min(SPAM_BURST);
        bucket.at = instant;
        if bucket.tokens < 1.0 {
            return Write::Drop;
        }
        bucket.tokens -= 1.0;
        if repeat {
            Write::Bump(event)
        } else {
            Write::Create(event)
        }
    }

    /// A new Event, as client-go's `makeEvent`.
    fn event(
        &self,
        about: &ObjectReference,
        type_: &str,
        reason: &str,
        action: &str,
        message: &str,
        wall: &Time,
    ) -> Event {
        let object = about.name.clone().unwrap_or_default();
        let namespace = about
            .namespace
            .clone()
            .filter(|n| !n.is_empty())
            .unwrap_or_else(|| "default".to_owned());
        let nanos = wall.0.as_nanosecond();
        Event {
            metadata: ObjectMeta {
                name: Some(format!("{object}.{nanos:x}")),
                namespace: Some(namespace),
                ..ObjectMeta::default()
            },
            involved_object: about.clone(),
            reason: Some(reason.to_owned()),
            message: Some(message.to_owned()),
            first_timestamp: Some(wall.clone()),
            last_timestamp: Some(wall.clone()),
            count: Some(1),
            type_: Some(type_.to_owned()),
            action: (!action.is_empty()).then(|| action.to_owned()),
            event_time: self.event_time.then_some(MicroTime(wall.0)),
            source: Some(self.source.clone()),
            reporting_component: self.source.component.clone(),
            reporting_instance: self.source.host.clone(),
            ..Event::default()
        }
    }
}

fn now() -> Time {
    Time(jiff::Timestamp::now())
}

/// Cuts `message` to [`MAX_MESSAGE_BYTES`] at a character boundary.
fn truncate(message: &mut String) {
    if message.len() > MAX_MESSAGE_BYTES {
        let mut end = MAX_MESSAGE_BYTES;
        while !message.is_char_boundary(end) {
            end -= 1;
        }
        message.truncate(end);
    }
}

#[cfg(test)]
mod tests;
