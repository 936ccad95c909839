//! Look-ups made close together share one request.
//!
//! The node controller, the lifecycle controller and the load balancers each ask about instances in
//! their own batches, and a burst of new nodes arrives as many small batches. The first look-up opens a
//! batch for [`WINDOW`]; look-ups arriving before it closes add their keys to it; then one request
//! answers all of them. (Upstream's AWS provider batches `DescribeInstances` by ID the same way.) While
//! look-ups keep coming (a batch closed less than [`BUSY_AFTER`] ago), a batch stays open for
//! [`BUSY_WINDOW`]: a burst of new nodes costs about four requests a second, whatever its rate, at the
//! price of up to a quarter of a second more before each node is initialised.
//!
//! The batch's request is a shared future: whichever waiter polls it drives it, so a caller abandoning
//! its look-up at its own deadline does not strand the others, and no task outlives the callers.

use parking_lot::Mutex;
use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use aws_sdk_ec2::types::Instance;
use futures::FutureExt;
use futures::future::{BoxFuture, Shared};
use kube_ccm_provider::CloudError;
use tokio::time::Instant;

use crate::instances::InstanceKey;

/// How long a batch stays open for more keys.
pub const WINDOW: Duration = Duration::from_millis(100);

/// How long a batch stays open for more keys while look-ups keep coming.
pub const BUSY_WINDOW: Duration = Duration::from_millis(250);

/// Look-ups are "coming" when the last batch closed less than this long ago.
pub const BUSY_AFTER: Duration = Duration::from_secs(1);

type Found = Arc<HashMap<InstanceKey, Instance>>;

#[derive(Clone)]
struct Batch {
    keys: Arc<Mutex<BTreeSet<InstanceKey>>>,
    closed: Arc<Mutex<bool>>,
    /// Every waiter gets the same answer; a failure keeps its kind (`CloudError` is `Clone`).
    answer: Shared<BoxFuture<'static, Result<Found, CloudError>>>,
}

/// The open batch, if any.
#[derive(Default)]
pub struct Describer {
    open: Arc<Mutex<Option<Batch>>>,
    /// When the last batch closed.
    last_closed: Arc<Mutex<Option<Instant>>>,
}

impl std::fmt::Debug for Describer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Describer").finish_non_exhaustive()
    }
}

impl Describer {
    /// The instances for `keys`, from the open batch or a new one whose request `send` makes.
    pub async fn describe<F, Fut>(&self, keys: &[InstanceKey], send: F) -> Result<Found, CloudError>
    where
        F: FnOnce(BTreeSet<InstanceKey>) -> Fut + Send + 'static,
        Fut: Future<Output = Result<HashMap<InstanceKey, Instance>, CloudError>> + Send + 'static,
    {
        if keys.is_empty() {
            return Ok(Arc::default());
        }
        let batch = {
            let mut open = self.open.lock();
            match open.as_ref() {
                Some(batch) if !*batch.closed.lock() => {
                    batch.keys.lock().extend(keys.iter().cloned());
                    batch.clone()
                }
                _ => {
                    let batch = self.new_batch(keys, send);
                    *open = Some(batch.clone());
                    batch
                }
            }
        };
        batch.answer.await
    }

    fn new_batch<F, Fut>(&self, keys: &[InstanceKey], send: F) -> Batch
    where
        F: FnOnce(BTreeSet<InstanceKey>) -> Fut + Send + 'static,
        Fut: Future<Output = Result<HashMap<InstanceKey, Instance>, CloudError>> + Send + 'static,
    {
        let wanted = Arc::new(Mutex::new(keys.iter().cloned().collect::<BTreeSet<_>>()));
        let closed = Arc::new(Mutex::new(false));
        let (open, wanted_in, closed_in) = (self.open.clone(), wanted.clone(), closed.clone());
        let last_closed = self.last_closed.clone();
        let busy = last_closed.lock().is_some_and(|at| at.elapsed() < BUSY_AFTER);
        let window = if busy { BUSY_WINDOW } else { WINDOW };
        let answer = async move {
            tokio::time::sleep(window).await;
            // Closed under the same lock callers join under: no key is added after this read.
            let keys = {
                let mut open = open.lock();
                *closed_in.lock() = true;
                if open.as_ref().is_some_and(|b| Arc::ptr_eq(&b.closed, &closed_in)) {
                    *open = None;
                }
                *last_closed.lock() = Some(Instant::now());
                std::mem::take(&mut *wanted_in.lock())
            };
            send(keys).await.map(Arc::new)
        }
        .boxed()
        .shared();
        Batch {
            keys: wanted,
            closed,
            answer,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    fn id(n: u32) -> InstanceKey {
        InstanceKey::Id(format!("i-{n}"))
    }

    #[tokio::test(start_paused = true)]
    async fn look_ups_within_the_window_share_one_request_and_later_ones_start_another() {
        let describer = Arc::new(Describer::default());
        let sent = Arc::new(Mutex::new(Vec::new()));
        let ask = |keys: Vec<InstanceKey>| {
            let (describer, sent) = (describer.clone(), sent.clone());
            async move {
                describer
                    .describe(&keys, move |keys| async move {
                        sent.lock().push(keys.clone());
                        Ok(keys
                            .into_iter()
                            .map(|k| (k, Instance::builder().build()))
                            .collect())
                    })
                    .await
                    .unwrap()
            }
        };
        let first = tokio::spawn(ask(vec![id(1), id(2)]));
        tokio::time::sleep(WINDOW / 2).await;
        let second = tokio::spawn(ask(vec![id(2), id(3)]));
        assert_eq!(first.await.unwrap().len(), 3, "one answer for the batch");
        assert_eq!(second.await.unwrap().len(), 3);
        let third = ask(vec![id(4)]).await;
        assert_eq!(third.len(), 1);
        assert_eq!(
            *sent.lock(),
            [BTreeSet::from([id(1), id(2), id(3)]), BTreeSet::from([id(4)])]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_steady_stream_of_look_ups_costs_a_request_per_busy_window() {
        let describer = Arc::new(Describer::default());
        let calls = Arc::new(AtomicUsize::new(0));
        let mut asks = Vec::new();
        // A node every 20 ms for 5 s, as a burst of registrations arrives.
        for n in 0..250 {
            let (describer, calls) = (describer.clone(), calls.clone());
            asks.push(tokio::spawn(async move {
                describer
                    .describe(&[id(n)], move |keys| async move {
                        calls.fetch_add(1, Ordering::SeqCst);
                        Ok(keys
                            .into_iter()
                            .map(|k| (k, Instance::builder().build()))
                            .collect())
                    })
                    .await
                    .unwrap()
                    .len()
            }));
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        for ask in asks {
            assert!(ask.await.unwrap() >= 1);
        }
        let calls = calls.load(Ordering::SeqCst);
        // 5 s of arrivals: one request in the first window, then one per busy window (a 100 ms window
        // throughout would make about 40).
        let most = (Duration::from_secs(5).as_millis() / BUSY_WINDOW.as_millis()) as usize + 2;
        assert!(
            calls <= most,
            "{calls} requests for a 5 s stream of look-ups (at most {most})"
        );
        assert!(calls >= most / 2, "{calls}: batches stay open too long");
    }

    #[tokio::test(start_paused = true)]
    async fn a_caller_that_gives_up_does_not_strand_the_others_and_failures_are_shared() {
        let describer = Arc::new(Describer::default());
        let calls = Arc::new(AtomicUsize::new(0));
        let send = |calls: Arc<AtomicUsize>| {
            move |_keys: BTreeSet<InstanceKey>| async move {
                calls.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_secs(1)).await;
                Err::<HashMap<InstanceKey, Instance>, _>(CloudError::Retry {
                    after: Duration::from_secs(10),
                    message: "throttled".into(),
                })
            }
        };
        let (d, c) = (describer.clone(), calls.clone());
        let impatient = tokio::spawn(async move {
            tokio::time::timeout(Duration::from_millis(200), d.describe(&[id(1)], send(c))).await
        });
        let (d, c) = (describer.clone(), calls.clone());
        let patient = tokio::spawn(async move { d.describe(&[id(2)], send(c)).await });
        assert!(impatient.await.unwrap().is_err(), "gave up at its deadline");
        let failure = patient.await.unwrap().unwrap_err();
        assert!(
            matches!(failure, CloudError::Retry { after, .. } if after == Duration::from_secs(10)),
            "{failure:?}"
        );
        assert_eq!(calls.load(Ordering::SeqCst), 1, "one request for both");
    }
}
