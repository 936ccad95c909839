//! A controller's work queue, as client-go's: keys waiting (each once), due now or after a delay, handed out
//! in the order they came due, a key never twice at once; and client-go's work-queue metrics.
//!
//! A [`Runner`](crate::Runner) drives the queue of the node and service controllers: it takes due keys
//! ([`WorkQueue::next`]) and the [`Working`] guard it holds while the key is reconciled puts the key back
//! in line when it was added meanwhile. A controller that runs its own loop (kube-runtime's, say) reports to
//! the queue instead, which then only counts: an object is *added* when a change or a trigger schedules it
//! (a key already waiting is not added twice, as client-go's queue deduplicates), *requeued* after a delay
//! (counted as added when it comes due, as client-go's delaying queue adds it then), and *worked on* from
//! the start of its sync to the end ([`WorkQueue::start`]). From that come client-go's families, under its
//! names: `workqueue_depth`, `workqueue_adds_total`,
//! `workqueue_queue_duration_seconds`, `workqueue_work_duration_seconds`, `workqueue_retries_total`,
//! `workqueue_unfinished_work_seconds` and `workqueue_longest_running_processor_seconds`, labelled by the
//! queue's `name` (the controller's canonical name). Periodic passes (routes, node lifecycle) are work
//! without a queue: they report work durations and in-progress time only.

use parking_lot::{Mutex, MutexGuard};
use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use tokio::sync::Notify;
use tokio::time::Instant;

/// `{name}`: a work queue.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct QueueLabels {
    pub(crate) name: String,
}

/// The families a queue counts into (the gauges are read at each scrape by [`QueueCollector`]).
#[derive(Clone)]
pub(crate) struct QueueFamilies {
    pub(crate) adds: Family<QueueLabels, Counter>,
    pub(crate) retries: Family<QueueLabels, Counter>,
    pub(crate) queue_duration: Family<QueueLabels, Histogram>,
    pub(crate) work_duration: Family<QueueLabels, Histogram>,
}

impl QueueFamilies {
    pub(crate) fn new() -> QueueFamilies {
        // client-go's buckets: 10 ns × 10^n, 10 buckets.
        let buckets = || Histogram::new(exponential_buckets(10e-9, 10.0, 10));
        QueueFamilies {
            adds: Family::default(),
            retries: Family::default(),
            queue_duration: Family::new_with_constructor(buckets),
            work_duration: Family::new_with_constructor(buckets),
        }
    }
}

/// One object waiting: when it is (or becomes) due, whether its add was counted yet, and whether it is in
/// line (`State::ready`).
#[derive(Debug, Clone, Copy)]
struct Waiting {
    due: Instant,
    counted: bool,
    in_line: bool,
}

/// Above this many slots, an emptied table is given back: a burst of 10k nodes leaves no 10k-slot tables
/// behind.
const SHRINK_ABOVE: usize = 1024;

#[derive(Debug, Default)]
struct State {
    waiting: HashMap<Arc<str>, Waiting>,
    /// Whether a runner takes keys from this queue; only then do keys line up in `ready` and `later`.
    driven: bool,
    /// Keys due, in the order they came due (a key whose entry is gone from `waiting`, or no longer
    /// `in_line`, is skipped).
    ready: VecDeque<Arc<str>>,
    /// Keys due later, earliest first (stale entries are skipped as in `ready`).
    later: BinaryHeap<Reverse<(Instant, Arc<str>)>>,
    /// Keys being reconciled by the runner: added again meanwhile, they wait until the reconcile ends.
    running: HashSet<Arc<str>>,
    next: u64,
    /// Work in progress: when each unit began.
    working: BTreeMap<u64, Instant>,
}

impl State {
    /// The table's own copy of `key`, or a new one.
    fn key(&self, key: &str) -> Arc<str> {
        self.waiting
            .get_key_value(key)
            .map_or_else(|| Arc::from(key), |(key, _)| key.clone())
    }

    /// Puts a waiting `key` in line, when a runner drives the queue and the key is not being reconciled:
    /// in `ready` when due, else in `later`. Whether the runner should look again.
    fn line_up(&mut self, key: &Arc<str>, now: Instant) -> bool {
        if !self.driven || self.running.contains(key) {
            return false;
        }
        let Some(waiting) = self.waiting.get_mut(key) else {
            return false;
        };
        if waiting.in_line {
            return false;
        }
        if waiting.due <= now {
            waiting.in_line = true;
            self.ready.push_back(key.clone());
        } else {
            self.later.push(Reverse((waiting.due, key.clone())));
        }
        true
    }

    /// The next key due, or when the next one comes due (if any does).
    fn pop(&mut self, now: Instant) -> Result<Arc<str>, Option<Instant>> {
        while let Some(Reverse((due, _))) = self.later.peek() {
            if *due > now {
                break;
            }
            let Some(Reverse((_, key))) = self.later.pop() else {
                break;
            };
            if let Some(waiting) = self.waiting.get_mut(&key)
                && !waiting.in_line
                && waiting.due <= now
                && !self.running.contains(&key)
            {
                waiting.in_line = true;
                self.ready.push_back(key);
            }
        }
        while let Some(key) = self.ready.pop_front() {
            if self.waiting.get(&key).is_some_and(|waiting| waiting.in_line) {
                return Ok(key);
            }
        }
        Err(self.later.peek().map(|Reverse((due, _))| *due))
    }

    /// Gives back the memory of emptied tables.
    fn shrink(&mut self) {
        if self.waiting.is_empty() && self.waiting.capacity() > SHRINK_ABOVE {
            self.waiting.shrink_to_fit();
        }
        if self.ready.is_empty() && self.ready.capacity() > SHRINK_ABOVE {
            self.ready.shrink_to_fit();
        }
        if self.later.is_empty() && self.later.capacity() > SHRINK_ABOVE {
            self.later.shrink_to_fit();
        }
        if self.running.is_empty() && self.running.capacity() > SHRINK_ABOVE {
            self.running.shrink_to_fit();
        }
    }
}

/// A controller's work queue, as its metrics see it. One per controller name, kept across the controller's
/// restarts (its waiting objects are dropped when it stops).
#[derive(Debug)]
pub struct WorkQueue {
    labels: QueueLabels,
    adds: Counter,
    retries: Counter,
    queue_duration: Histogram,
    work_duration: Histogram,
    state: Mutex<State>,
    /// Wakes the runner: a key was lined up.
    wake: Notify,
}

impl WorkQueue {
    pub(crate) fn new(name: &str, families: &QueueFamilies) -> WorkQueue {
        let labels = QueueLabels {
            name: name.to_owned(),
        };
        WorkQueue {
            adds: families.adds.get_or_create(&labels).clone(),
            retries: families.retries.get_or_create(&labels).clone(),
            queue_duration: families.queue_duration.get_or_create(&labels).clone(),
            work_duration: families.work_duration.get_or_create(&labels).clone(),
            labels,
            state: Mutex::default(),
            wake: Notify::new(),
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock()
    }

    /// `key` is scheduled now (a change, a trigger). A key already waiting is not added again, but comes due
    /// now if it was due later.
    pub fn add(&self, key: &str) {
        let now = Instant::now();
        let mut state = self.state();
        let key = state.key(key);
        let waiting = state.waiting.entry(key.clone()).or_insert(Waiting {
            due: now,
            counted: false,
            in_line: false,
        });
        waiting.due = waiting.due.min(now);
        if !waiting.counted {
            waiting.counted = true;
            self.adds.inc();
        }
        if state.line_up(&key, now) {
            drop(state);
            self.wake.notify_one();
        }
    }

    /// Each of `keys`, scheduled now.
    pub fn add_all<'k>(&self, keys: impl IntoIterator<Item = &'k str>) {
        for key in keys {
            self.add(key);
        }
    }

    /// `key` is scheduled `after` from now (a requeue); `retry` when it follows a failure
    /// (`workqueue_retries_total`). The add is counted when the key comes due. A key already waiting keeps
    /// the earlier of the two times.
    pub fn add_after(&self, key: &str, after: Duration, retry: bool) {
        if retry {
            self.retries.inc();
        }
        let now = Instant::now();
        let due = now + after;
        let mut state = self.state();
        let key = state.key(key);
        let mut moved = true;
        state
            .waiting
            .entry(key.clone())
            .and_modify(|waiting| {
                moved = due < waiting.due;
                waiting.due = waiting.due.min(due);
            })
            .or_insert(Waiting {
                due,
                counted: false,
                in_line: false,
            });
        if moved && state.line_up(&key, now) {
            drop(state);
            self.wake.notify_one();
        }
    }

    /// Work begins on `key` (or on a periodic pass when `None`): its time in the queue is observed, and the
    /// work lasts until the returned guard is dropped.
    pub(crate) fn start(self: &Arc<Self>, key: Option<&str>) -> Working {
        let now = Instant::now();
        let mut state = self.state();
        if let Some(key) = key {
            match state.waiting.remove(key) {
                Some(waiting) => {
                    if !waiting.counted {
                        self.adds.inc();
                    }
                    self.queue_duration
                        .observe(now.saturating_duration_since(waiting.due).as_secs_f64());
                }
                // Scheduled by something not reported (kube-runtime's own retry of a watch, say): it was
                // added, and its wait is unknown.
                None => {
                    self.adds.inc();
                }
            }
        }
        let id = state.next;
        state.next += 1;
        state.working.insert(id, now);
        Working {
            queue: self.clone(),
            id,
            key: None,
        }
    }

    /// Hands out the next key due, waiting for one as long as it takes: its time in the queue is observed,
    /// and it is being worked on (not handed out again) until the returned guard is dropped. For the one
    /// runner that drives the queue ([`Self::drive`]).
    pub(crate) async fn next(self: &Arc<Self>) -> Working {
        loop {
            let notified = self.wake.notified();
            let mut notified = std::pin::pin!(notified);
            notified.as_mut().enable();
            match self.take() {
                Ok(working) => return working,
                Err(Some(due)) => {
                    tokio::select! {
                        () = notified => {}
                        () = tokio::time::sleep_until(due) => {}
                    }
                }
                Err(None) => notified.await,
            }
        }
    }

    fn take(self: &Arc<Self>) -> Result<Working, Option<Instant>> {
        let now = Instant::now();
        let mut state = self.state();
        let key = state.pop(now)?;
        let waiting = state.waiting.remove(&key).expect("a key in line waits");
        if !waiting.counted {
            self.adds.inc();
        }
        self.queue_duration
            .observe(now.saturating_duration_since(waiting.due).as_secs_f64());
        state.running.insert(key.clone());
        state.shrink();
        let id = state.next;
        state.next += 1;
        state.working.insert(id, now);
        Ok(Working {
            queue: self.clone(),
            id,
            key: Some(key),
        })
    }

    /// A runner takes keys from this queue until the returned guard is dropped: what waits lines up.
    pub(crate) fn drive(self: &Arc<Self>) -> Driving {
        let now = Instant::now();
        let mut state = self.state();
        state.driven = true;
        let mut keys: Vec<(Instant, Arc<str>)> = state
            .waiting
            .iter()
            .map(|(key, waiting)| (waiting.due, key.clone()))
            .collect();
        keys.sort();
        for (_, key) in &keys {
            state.line_up(key, now);
        }
        Driving(self.clone())
    }

    /// Forgets what was waiting: the controller stopped.
    pub(crate) fn clear(&self) {
        let mut state = self.state();
        state.waiting.clear();
        state.ready.clear();
        state.later.clear();
        state.shrink();
    }

    /// Adds counted (`workqueue_adds_total`).
    #[cfg(test)]
    pub(crate) fn adds(&self) -> u64 {
        self.adds.get()
    }

    /// Retries counted (`workqueue_retries_total`).
    #[cfg(test)]
    pub(crate) fn retries(&self) -> u64 {
        self.retries.get()
    }

    /// Keys waiting and due (`workqueue_depth`).
    #[cfg(test)]
    pub(crate) fn depth(&self) -> i64 {
        self.gauges().0
    }

    /// Slots the queue's tables hold.
    #[cfg(test)]
    pub(crate) fn capacity(&self) -> usize {
        let state = self.state();
        state.waiting.capacity() + state.ready.capacity() + state.later.capacity() + state.running.capacity()
    }

    /// How long the oldest unit of work in progress has been running.
    pub(crate) fn longest_running(&self) -> Option<Duration> {
        self.state()
            .working
            .values()
            .min()
            .map(|started| started.elapsed())
    }

    /// Depth (waiting and due), unfinished work (seconds, summed) and the longest-running unit (seconds).
    fn gauges(&self) -> (i64, f64, f64) {
        let now = Instant::now();
        let state = self.state();
        let depth = state.waiting.values().filter(|w| w.due <= now).count() as i64;
        let running = state
            .working
            .values()
            .map(|started| now.saturating_duration_since(*started));
        let (sum, longest) = running.fold((0.0, 0.0_f64), |(sum, longest), d| {
            (sum + d.as_secs_f64(), longest.max(d.as_secs_f64()))
        });
        (depth, sum, longest)
    }
}

/// One unit of work in progress; it ends (and its duration is observed) when dropped. A key the runner
/// took is then put back in line if it was added meanwhile.
#[must_use = "the work ends when this is dropped"]
pub struct Working {
    queue: Arc<WorkQueue>,
    id: u64,
    key: Option<Arc<str>>,
}

impl Working {
    /// The key being worked on (none for a periodic pass).
    pub(crate) fn key(&self) -> Option<&str> {
        self.key.as_deref()
    }
}

impl Drop for Working {
    fn drop(&mut self) {
        let mut state = self.queue.state();
        if let Some(started) = state.working.remove(&self.id) {
            self.queue.work_duration.observe(started.elapsed().as_secs_f64());
        }
        if let Some(key) = self.key.take() {
            state.running.remove(&key);
            state.shrink();
            if state.line_up(&key, Instant::now()) {
                drop(state);
                self.queue.wake.notify_one();
            }
        }
    }
}

/// While held, a runner drives the queue; dropped, keys stop lining up (those waiting stay counted).
#[must_use = "the queue is driven while this is held"]
pub(crate) struct Driving(Arc<WorkQueue>);

impl Drop for Driving {
    fn drop(&mut self) {
        let mut state = self.0.state();
        state.driven = false;
        state.ready.clear();
        state.later.clear();
        for waiting in state.waiting.values_mut() {
            waiting.in_line = false;
        }
        state.shrink();
    }
}

/// Every controller's queue, by name.
pub(crate) type Queues = Arc<Mutex<BTreeMap<String, Arc<WorkQueue>>>>;

/// Reads the gauges of every queue at each scrape.
#[derive(Debug)]
pub(crate) struct QueueCollector(pub(crate) Queues);

impl Collector for QueueCollector {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let queues: Vec<Arc<WorkQueue>> = self.0.lock().values().cloned().collect();
        let gauges: Vec<(&QueueLabels, (i64, f64, f64))> =
            queues.iter().map(|q| (&q.labels, q.gauges())).collect();
        let mut family = |name: &str, help: &str, value: &dyn Fn(&(i64, f64, f64)) -> f64| {
            let mut descriptor =
                encoder.encode_descriptor(name, help, None, prometheus_client::metrics::MetricType::Gauge)?;
            for (labels, values) in &gauges {
                ConstGauge::new(value(values)).encode(descriptor.encode_family(*labels)?)?;
            }
            Ok::<_, std::fmt::Error>(())
        };
        family("workqueue_depth", "Current depth of workqueue", &|g| g.0 as f64)?;
        family(
            "workqueue_unfinished_work_seconds",
            "How many seconds of work has done that is in progress and hasn't been observed by work_duration. Large values indicate stuck threads. One can deduce the number of stuck threads by observing the rate at which this increases.",
            &|g| g.1,
        )?;
        family(
            "workqueue_longest_running_processor_seconds",
            "How many seconds has the longest running processor for workqueue been running.",
            &|g| g.2,
        )?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn the_queue_counts_as_client_gos() {
        let families = QueueFamilies::new();
        let queue = Arc::new(WorkQueue::new("service-lb-controller", &families));
        queue.add("a");
        queue.add("a");
        queue.add_all(["b", "c"]);
        assert_eq!(queue.gauges().0, 3, "a waiting key is not added twice");
        assert_eq!(queue.adds.get(), 3);

        tokio::time::advance(Duration::from_secs(2)).await;
        let working = queue.start(Some("a"));
        tokio::time::advance(Duration::from_secs(3)).await;
        let (depth, unfinished, longest) = queue.gauges();
        assert_eq!((depth, unfinished, longest), (2, 3.0, 3.0));
        drop(working);
        assert_eq!(queue.gauges().1, 0.0);

        // A failed key comes back after its delay: not waiting (depth) until then, added when due.
        queue.add_after("a", Duration::from_secs(10), true);
        assert_eq!(
            (queue.gauges().0, queue.adds.get(), queue.retries.get()),
            (2, 3, 1)
        );
        tokio::time::advance(Duration::from_secs(10)).await;
        assert_eq!(queue.gauges().0, 3);
        drop(queue.start(Some("a")));
        assert_eq!(queue.adds.get(), 4);

        queue.clear();
        assert_eq!(queue.gauges().0, 0);
        let text = {
            let mut registry = prometheus_client::registry::Registry::default();
            registry.register("workqueue_adds", "adds", families.adds.clone());
            registry.register(
                "workqueue_queue_duration_seconds",
                "wait",
                families.queue_duration.clone(),
            );
            let queues: Queues = Arc::default();
            queues
                .lock()
                .insert("service-lb-controller".into(), queue.clone());
            registry.register_collector(Box::new(QueueCollector(queues)));
            let mut text = String::new();
            prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
            text
        };
        for needle in [
            "workqueue_adds_total{name=\"service-lb-controller\"} 4",
            "workqueue_queue_duration_seconds_count{name=\"service-lb-controller\"} 2",
            "workqueue_depth{name=\"service-lb-controller\"} 0",
            "workqueue_longest_running_processor_seconds{name=\"service-lb-controller\"} 0",
        ] {
            assert!(text.contains(needle), "{needle} missing from\n{text}");
        }
    }
}
