//! A controller's loop: reconcile each key its [`WorkQueue`] hands out, a few at a time, until stopped.
//!
//! This is client-go's worker loop over its work queue, and what the node and service controllers (and a
//! provider's own, and node IPAM) run on. It replaces kube-runtime's `Controller`, whose scheduler
//! keeps two copies of each pending object's reference (name, namespace, resourceVersion, uid) in tables
//! that never shrink after a burst of nodes (decision 0017, `docs/decisions/`), and a second queue beside
//! the one the work-queue metrics need. Here the metrics' queue is the queue: one shared key per waiting
//! object, and the tables are given back when they empty.
//!
//! The semantics are kube-runtime's (and client-go's): a key waits once however often it is added; a key
//! being reconciled is not handed out again until that reconcile ends, and runs again after it if it was
//! added meanwhile; a reconcile's [`Action`] (or, after an error, the error policy's) requeues the key
//! after a delay, and the earlier of two times wins; a key whose object is no longer cached is dropped.
//! After `stop`, no reconcile starts and those running finish.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures::stream::{BoxStream, FuturesUnordered};
use futures::{FutureExt, Stream, StreamExt};
use tokio_util::sync::CancellationToken;

use crate::cached::Cached;
use crate::informers::{Cache, Informer};
use crate::workqueue::WorkQueue;

/// What a reconcile (or the error policy) asks for next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Action {
    requeue_after: Option<Duration>,
}

impl Action {
    /// Reconcile the object again after `duration`, unless a change comes first.
    #[must_use]
    pub const fn requeue(duration: Duration) -> Action {
        Action {
            requeue_after: Some(duration),
        }
    }

    /// Nothing until the object changes.
    #[must_use]
    pub const fn await_change() -> Action {
        Action { requeue_after: None }
    }

    /// When to reconcile again, if the object does not change first.
    pub fn requeue_after(&self) -> Option<Duration> {
        self.requeue_after
    }
}

/// Feed items taken at once when the feeds are read (see [`Runner::run`]).
const FEED_DRAIN: usize = 1024;

type Lookup<K> = Box<dyn Fn(&str) -> Option<Arc<K>> + Send + Sync>;

/// A controller's loop (see the module documentation): made by
/// [`ControllerContext::runner`](crate::ControllerContext::runner), given its feeds, then run.
pub struct Runner<K> {
    queue: Arc<WorkQueue>,
    lookup: Lookup<K>,
    concurrency: usize,
    feeds: Vec<BoxStream<'static, ()>>,
}

impl<K: Send + Sync + 'static> Runner<K> {
    /// Takes keys from `queue`, finding each key's object with `lookup` (e.g. [`by_key`] over an informer's
    /// cache).
    pub(crate) fn new(
        queue: Arc<WorkQueue>,
        lookup: impl Fn(&str) -> Option<Arc<K>> + Send + Sync + 'static,
    ) -> Runner<K> {
        Runner {
            queue,
            lookup: Box::new(lookup),
            concurrency: 1,
            feeds: Vec::new(),
        }
    }

    /// At most `limit` reconciles at once (at least one).
    #[must_use]
    pub fn concurrency(mut self, limit: u16) -> Runner<K> {
        self.concurrency = usize::from(limit.max(1));
        self
    }

    /// A stream the loop drives alongside its reconciles: one that adds keys to the queue (changes from an
    /// informer, a resync of every cached object). The loop stops early only if every feed ends.
    #[must_use]
    pub fn feed(mut self, feed: impl Stream<Item = ()> + Send + 'static) -> Runner<K> {
        self.feeds.push(feed.boxed());
        self
    }

    /// Feeds `informer`'s objects that are `wanted`: every cached one first, then each as it changes, each
    /// added under its cache key (what [`by_key`] looks up).
    #[must_use]
    pub fn watch(self, informer: &Informer<K>, wanted: fn(&K) -> bool) -> Runner<K>
    where
        K: Cached,
    {
        let queue = self.queue.clone();
        let changes = informer
            .subscribe()
            .filter(move |object| std::future::ready(wanted(object)))
            .map(move |object| queue.add(&object.identity().key()));
        let (queue, cache) = (self.queue.clone(), informer.store());
        let first = futures::stream::once(async move {
            for object in cache.state().iter().filter(|object| wanted(object)) {
                queue.add(&object.identity().key());
            }
        });
        self.feed(changes).feed(first)
    }

    /// Runs until `stop`, or until every feed has ended; then lets the running reconciles finish.
    pub async fn run<C, E, Fut>(
        self,
        stop: &CancellationToken,
        reconcile: impl Fn(Arc<K>, Arc<C>) -> Fut,
        error_policy: impl Fn(Arc<K>, &E, Arc<C>) -> Action,
        context: Arc<C>,
    ) where
        Fut: Future<Output = Result<Action, E>>,
    {
        let Runner {
            queue,
            lookup,
            concurrency,
            feeds,
        } = self;
        let _driving = queue.drive();
        let feeding = !feeds.is_empty();
        let mut feeds = futures::stream::select_all(feeds);
        let start = |object: Arc<K>, working| {
            let reconciling = reconcile(object.clone(), context.clone());
            async move { (working, object, reconciling.await) }
        };
        let mut running = FuturesUnordered::new();
        let finish = |(working, object, outcome): (crate::Working, Arc<K>, Result<Action, E>)| {
            let (action, retry) = match outcome {
                Ok(action) => (action, false),
                Err(error) => (error_policy(object, &error, context.clone()), true),
            };
            if let (Some(after), Some(key)) = (action.requeue_after, working.key()) {
                queue.add_after(key, after, retry);
            }
            // Dropped last: a key added meanwhile, or just requeued, lines up again.
            drop(working);
        };
        loop {
            tokio::select! {
                biased;
                () = stop.cancelled() => break,
                Some(done) = running.next(), if !running.is_empty() => finish(done),
                // Work is started before more is fed: under a burst the feeds are never empty, and a feed
                // polled first would hold every free slot idle until it was.
                working = queue.next(), if running.len() < concurrency => {
                    // A key whose object is gone is done with (its guard drops here).
                    if let Some(object) = working.key().and_then(&lookup) {
                        running.push(start(object, working));
                    }
                }
                // Every feed ended (the informers stopped): no new work, as after `stop`.
                fed = feeds.next(), if feeding => {
                    if fed.is_none() {
                        break;
                    }
                    // Adding a key is cheap: take what else is ready now (up to a bound, to stay fair),
                    // so that a burst does not leave the feed behind its informer (which would feed every
                    // cached object again).
                    for _ in 0..FEED_DRAIN {
                        if feeds.next().now_or_never() != Some(Some(())) {
                            break;
                        }
                    }
                }
            }
        }
        while let Some(done) = running.next().await {
            finish(done);
        }
    }
}

/// Looks a key up in an informer's cache (its keys are the queue's: `name`, or `namespace/name`).
pub fn by_key<K: Send + Sync + 'static>(
    cache: Cache<K>,
) -> impl Fn(&str) -> Option<Arc<K>> + Send + Sync + 'static {
    move |key| cache.get(key)
}

#[cfg(test)]
mod tests {
    use parking_lot::Mutex;
    use std::collections::HashMap;

    use tokio::sync::Semaphore;

    use super::*;
    use crate::workqueue::QueueFamilies;

    /// A controller under test: objects are their keys; each reconcile is recorded, waits for a permit of
    /// `gate` while it runs, and answers what `answers` holds for its key (by default: await change).
    struct Harness {
        queue: Arc<WorkQueue>,
        objects: Arc<Mutex<HashMap<String, Arc<String>>>>,
        started: Mutex<Vec<String>>,
        running: Mutex<usize>,
        most: Mutex<usize>,
        gate: Semaphore,
        answers: Mutex<HashMap<String, Result<Action, Action>>>,
        stop: CancellationToken,
    }

    #[derive(Debug)]
    struct Failed;

    impl Harness {
        fn new(keys: &[&str]) -> Arc<Harness> {
            let objects = keys.iter().map(|k| ((*k).to_owned(), Arc::new((*k).to_owned())));
            Arc::new(Harness {
                queue: Arc::new(WorkQueue::new("test", &QueueFamilies::new())),
                objects: Arc::new(Mutex::new(objects.collect())),
                started: Mutex::default(),
                running: Mutex::default(),
                most: Mutex::default(),
                gate: Semaphore::new(0),
                answers: Mutex::default(),
                stop: CancellationToken::new(),
            })
        }

        fn spawn(self: &Arc<Harness>, concurrency: u16) -> tokio::task::JoinHandle<()> {
            let harness = self.clone();
            let objects = self.objects.clone();
            let runner = Runner::new(self.queue.clone(), move |key: &str| {
                objects.lock().get(key).cloned()
            })
            .concurrency(concurrency)
            .feed(futures::stream::pending());
            tokio::spawn(async move {
                let stop = harness.stop.clone();
                runner.run(&stop, reconcile, error_policy, harness).await;
            })
        }

        /// The runner, started and waiting for keys.
        async fn start(self: &Arc<Harness>, concurrency: u16) -> tokio::task::JoinHandle<()> {
            let task = self.spawn(concurrency);
            Harness::settle().await;
            task
        }

        fn started(&self) -> Vec<String> {
            self.started.lock().clone()
        }

        /// Lets the runner and its reconciles go as far as they can (time is paused: nothing is due
        /// until the test advances it).
        async fn settle() {
            for _ in 0..50 {
                tokio::task::yield_now().await;
            }
        }
    }

    async fn reconcile(key: Arc<String>, harness: Arc<Harness>) -> Result<Action, Failed> {
        harness.started.lock().push(key.to_string());
        {
            let mut running = harness.running.lock();
            *running += 1;
            let mut most = harness.most.lock();
            *most = (*most).max(*running);
        }
        harness.gate.acquire().await.expect("open").forget();
        *harness.running.lock() -= 1;
        match harness.answers.lock().get(key.as_str()) {
            Some(Ok(action)) => Ok(*action),
            Some(Err(_)) => Err(Failed),
            None => Ok(Action::await_change()),
        }
    }

    fn error_policy(key: Arc<String>, _: &Failed, harness: Arc<Harness>) -> Action {
        match harness.answers.lock().get(key.as_str()) {
            Some(Err(action)) => *action,
            _ => Action::await_change(),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_key_added_many_times_is_reconciled_once_and_again_after_a_change_while_running() {
        let harness = Harness::new(&["a", "b"]);
        let task = harness.start(4).await;
        for _ in 0..3 {
            harness.queue.add("a");
        }
        harness.queue.add("b");
        Harness::settle().await;
        assert_eq!(harness.started(), ["a", "b"], "one reconcile per waiting key");

        // Changed while its reconcile runs: not handed out again until that one ends.
        harness.queue.add("a");
        harness.queue.add("a");
        Harness::settle().await;
        assert_eq!(harness.started().len(), 2, "never twice at once");
        harness.gate.add_permits(2);
        Harness::settle().await;
        assert_eq!(harness.started(), ["a", "b", "a"], "once more after it ends");
        assert_eq!(harness.queue.adds(), 3);

        harness.gate.add_permits(1);
        harness.stop.cancel();
        task.await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn no_more_than_the_concurrency_run_at_once_and_a_key_without_an_object_is_dropped() {
        let keys: Vec<String> = (0..10).map(|i| format!("n{i}")).collect();
        let harness = Harness::new(&keys.iter().map(String::as_str).collect::<Vec<_>>());
        let task = harness.start(3).await;
        harness.queue.add_all(keys.iter().map(String::as_str));
        harness.queue.add("gone");
        Harness::settle().await;
        assert_eq!(
            harness.started(),
            ["n0", "n1", "n2"],
            "in the order they came due"
        );
        harness.gate.add_permits(20);
        Harness::settle().await;
        assert_eq!(harness.started().len(), 10);
        assert_eq!(*harness.most.lock(), 3);
        assert!(!harness.started().contains(&"gone".to_owned()));
        assert_eq!(
            harness.queue.depth(),
            0,
            "the missing object's key left the queue too"
        );
        harness.stop.cancel();
        task.await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn requeues_come_due_after_their_delay_and_an_error_counts_a_retry() {
        let harness = Harness::new(&["ok", "bad"]);
        harness
            .answers
            .lock()
            .insert("ok".into(), Ok(Action::requeue(Duration::from_secs(30))));
        harness
            .answers
            .lock()
            .insert("bad".into(), Err(Action::requeue(Duration::from_secs(5))));
        let task = harness.start(2).await;
        harness.gate.add_permits(100);
        harness.queue.add_all(["ok", "bad"]);
        Harness::settle().await;
        assert_eq!(harness.started(), ["ok", "bad"]);
        assert_eq!(harness.queue.retries(), 1);

        tokio::time::advance(Duration::from_secs(4)).await;
        Harness::settle().await;
        assert_eq!(harness.started().len(), 2, "nothing due yet");
        tokio::time::advance(Duration::from_secs(1)).await;
        Harness::settle().await;
        assert_eq!(harness.started(), ["ok", "bad", "bad"]);

        // A change brings a requeued key forward; the earlier time wins.
        harness.answers.lock().clear();
        harness.queue.add("ok");
        Harness::settle().await;
        assert_eq!(harness.started()[3..], ["ok"]);
        tokio::time::advance(Duration::from_secs(60)).await;
        Harness::settle().await;
        assert_eq!(
            harness.started().len(),
            5,
            "bad's last requeue only: ok's was taken by the change"
        );
        harness.stop.cancel();
        task.await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn after_stop_the_running_reconciles_finish_and_no_new_one_starts() {
        let harness = Harness::new(&["a", "b"]);
        let task = harness.start(1).await;
        harness.queue.add_all(["a", "b"]);
        Harness::settle().await;
        assert_eq!(harness.started(), ["a"]);
        harness.stop.cancel();
        Harness::settle().await;
        assert!(!task.is_finished(), "waits for the running reconcile");
        harness.gate.add_permits(10);
        tokio::time::timeout(Duration::from_secs(5), task)
            .await
            .expect("the runner ends")
            .unwrap();
        assert_eq!(harness.started(), ["a"], "b was not started after stop");
    }

    #[tokio::test(start_paused = true)]
    async fn a_burst_leaves_no_large_tables_behind() {
        let keys: Vec<String> = (0..20_000).map(|i| format!("node-{i}")).collect();
        let harness = Harness::new(&keys.iter().map(String::as_str).collect::<Vec<_>>());
        harness.gate.add_permits(100_000);
        let task = harness.start(64).await;
        harness.queue.add_all(keys.iter().map(String::as_str));
        assert!(harness.queue.capacity() >= 20_000);
        tokio::time::timeout(Duration::from_secs(60), async {
            while harness.started().len() < keys.len() {
                tokio::task::yield_now().await;
            }
        })
        .await
        .expect("every key reconciled");
        Harness::settle().await;
        assert!(
            harness.queue.capacity() <= 2 * 1024,
            "tables kept {} slots",
            harness.queue.capacity()
        );
        harness.stop.cancel();
        task.await.unwrap();
    }
}
