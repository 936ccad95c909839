//! What every cloud call is handed: a deadline, a cancellation signal, and who is calling.

use std::future::Future;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::fence::FencedStream;
use crate::{CloudError, Priority, RateBudget};

/// The context of one cloud call.
///
/// **The contract for provider authors.** The deadline is never later than the validity of the lock the
/// calling controller runs under (nor than its call timeout): after it, another process may be acting on
/// the same cloud objects. Pass it to your SDK's request timeout ([`CallContext::remaining`]) and stop
/// retrying when [`CallContext::cancellation`] fires. The framework also runs every call through
/// [`CallContext::guard`], which drops the call's future at the deadline or on cancellation, closing its
/// connections; a provider that keeps work going in spawned tasks must tie them to this context itself.
///
/// The cloud's rate limit is shared by the whole process: before each request to the cloud's API (each
/// attempt of a retried one), take a turn of the process's [`RateBudget`] with [`CallContext::acquire`]
/// (or send it through [`CallContext::request`]), and report a request the cloud throttled as
/// [`CloudError::Throttled`], which pauses every controller's requests for its retry delay.
#[derive(Clone)]
pub struct CallContext {
    limit: Instant,
    lock: Option<Arc<dyn LockValidity>>,
    cancel: CancellationToken,
    caller: Arc<str>,
    observer: Option<Arc<dyn CallObserver>>,
    budget: Option<(Arc<RateBudget>, Priority)>,
}

tokio::task_local! {
    /// The context of the call [`CallContext::guard`] is polling in this task.
    static CURRENT: CallContext;
}

impl std::fmt::Debug for CallContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CallContext")
            .field("deadline", &self.deadline())
            .field("caller", &self.caller)
            .field("locked", &self.lock.is_some())
            .field("observed", &self.observer.is_some())
            .field("priority", &self.budget.as_ref().map(|(_, p)| p))
            .finish_non_exhaustive()
    }
}

/// The validity of the lock a call is made under, read at every check of the call's deadline: a lock
/// renewed while the call runs lets it go on (up to its own time limit), a lock lost ends it.
pub trait LockValidity: Send + Sync {
    /// Until when the holder may act under the lock; `None` once it may not.
    fn valid_until(&self) -> Option<Instant>;
}

/// Where the outcome of each cloud request is reported: the framework's
/// `cloudprovider_<provider>_api_request_duration_seconds` and `cloudprovider_<provider>_api_request_errors_total`.
pub trait CallObserver: Send + Sync {
    /// `request` took `elapsed` and ended with `outcome`.
    fn observe(&self, request: &str, elapsed: Duration, outcome: Result<(), &CloudError>);
}

impl CallContext {
    /// A context ending at `deadline` or when `cancel` fires; `caller` names who calls (the identity and
    /// controller, e.g. `host_1234/service-lb-controller`), for the cloud's logs.
    pub fn new(deadline: Instant, cancel: CancellationToken, caller: &str) -> CallContext {
        CallContext {
            limit: deadline,
            lock: None,
            cancel,
            caller: caller.into(),
            observer: None,
            budget: None,
        }
    }

    /// This context, ending no later than `lock` is valid, as that validity stands at each check: a call
    /// made under a lock that is renewed while it runs may go on until the deadline given to
    /// [`CallContext::new`]; once the lock may have passed on, the call is over.
    pub fn with_lock(self, lock: Arc<dyn LockValidity>) -> CallContext {
        CallContext {
            lock: Some(lock),
            ..self
        }
    }

    /// This context, reporting to `observer` (the framework sets it; a provider has no need to).
    pub fn with_observer(self, observer: Arc<dyn CallObserver>) -> CallContext {
        CallContext {
            observer: Some(observer),
            ..self
        }
    }

    /// This context, taking its requests' tokens from `budget` at `priority` ([`CallContext::acquire`]) and
    /// pausing it when a request is throttled (the framework sets it, shared by the whole process).
    pub fn with_budget(self, budget: Arc<RateBudget>, priority: Priority) -> CallContext {
        CallContext {
            budget: Some((budget, priority)),
            ..self
        }
    }

    /// The priority of this call's requests in the process's budget, if it has one.
    pub fn priority(&self) -> Option<Priority> {
        self.budget.as_ref().map(|(_, p)| *p)
    }

    /// Waits for this call's turn to send one request to the cloud: a token of the process's
    /// [`RateBudget`] at the call's priority (at once without a budget). Call it before each request (each
    /// attempt of a retried one), or use [`CallContext::request`]. Fails as [`CallContext::guard`] does when
    /// the deadline passes or the call is cancelled while waiting.
    pub async fn acquire(&self) -> Result<(), CloudError> {
        match &self.budget {
            None => Ok(()),
            Some((budget, priority)) => {
                self.guard(async {
                    budget.acquire(*priority).await;
                    Ok(())
                })
                .await
            }
        }
    }

    /// One request to the cloud: [`CallContext::acquire`], then [`CallContext::call`] (timed, reported
    /// as `request`, and pausing the budget when the cloud throttles it).
    pub async fn request<T>(
        &self,
        request: &str,
        call: impl Future<Output = Result<T, CloudError>>,
    ) -> Result<T, CloudError> {
        self.acquire().await?;
        self.call(request, call).await
    }

    /// A context for tests and tools: `timeout` from now, never cancelled.
    pub fn with_timeout(timeout: Duration) -> CallContext {
        CallContext::new(Instant::now() + timeout, CancellationToken::new(), "")
    }

    /// When the call must be finished, as it stands now: the deadline given to [`CallContext::new`], or
    /// earlier the validity of the lock the call is made under ([`CallContext::with_lock`]). It moves
    /// later as the lock is renewed (never past the deadline given to `new`), and to now once the lock is
    /// lost.
    pub fn deadline(&self) -> Instant {
        match &self.lock {
            None => self.limit,
            Some(lock) => match lock.valid_until() {
                Some(valid_until) => valid_until.min(self.limit),
                None => Instant::now().min(self.limit),
            },
        }
    }

    /// Whether the call's time is up (its deadline is not in the future).
    pub fn is_over(&self) -> bool {
        Instant::now() >= self.deadline()
    }

    /// The time left until the deadline (zero once it passed).
    pub fn remaining(&self) -> Duration {
        self.deadline().saturating_duration_since(Instant::now())
    }

    /// Fires when the caller gives up (its controller is stopping).
    pub fn cancellation(&self) -> &CancellationToken {
        &self.cancel
    }

    /// Who calls.
    pub fn caller(&self) -> &str {
        &self.caller
    }

    /// The caller as an HTTP header value, for a provider to name it in its requests' `User-Agent`; `None`
    /// when it is empty or has a character a header cannot carry.
    pub fn caller_header(&self) -> Option<&str> {
        let printable = self.caller.bytes().all(|b| b == b' ' || b.is_ascii_graphic());
        (!self.caller.is_empty() && printable).then_some(&*self.caller)
    }

    /// The context of the cloud call this task is making, if it is making one: [`CallContext::guard`] (and so
    /// [`CallContext::call`]) sets it while it polls the call, the innermost call's for nested ones.
    ///
    /// For the parts of a provider that cannot be handed a context because an SDK calls them: an
    /// interceptor that names the caller in each request (so the cloud's audit log, CloudTrail or Cloud
    /// Audit Logs, says which process and controller made it), or a connector that fences the connection
    /// a request is sent on. Work an SDK spawns onto other tasks sees `None`.
    pub fn current() -> Option<CallContext> {
        CURRENT.try_with(CallContext::clone).ok()
    }

    /// A context for a part of this call: the same cancellation and caller, a deadline no later than this
    /// one's.
    pub fn narrowed(&self, timeout: Duration) -> CallContext {
        CallContext {
            limit: self.limit.min(Instant::now() + timeout),
            lock: self.lock.clone(),
            cancel: self.cancel.clone(),
            caller: self.caller.clone(),
            observer: self.observer.clone(),
            budget: self.budget.clone(),
        }
    }

    /// Reports one request a provider made to its cloud's API (name it as the API does, e.g.
    /// `DescribeInstances`), for the framework's per-provider metrics. A throttled request is reported with
    /// [`CloudError::Throttled`], and is counted as throttled; it also pauses the process's budget for its retry
    /// delay, so no controller sends another request before then. The framework reports each of its own
    /// calls to the provider the same way, under the trait method's name (`ensure_load_balancer`).
    pub fn observe(&self, request: &str, elapsed: Duration, outcome: Result<(), &CloudError>) {
        if let (Err(CloudError::Throttled { after, .. }), Some((budget, _))) = (outcome, &self.budget) {
            budget.throttled(*after);
        }
        if let Some(observer) = &self.observer {
            observer.observe(request, elapsed, outcome);
        }
    }

    /// [`CallContext::guard`], timed and reported as `request` (see [`CallContext::observe`]), in a
    /// `cloud_call` span (its `request` and `caller`, and the `error` if it fails) under the caller's.
    pub async fn call<T>(
        &self,
        request: &str,
        call: impl Future<Output = Result<T, CloudError>>,
    ) -> Result<T, CloudError> {
        use tracing::Instrument;
        let span = tracing::info_span!(
            "cloud_call",
            request,
            caller = %self.caller,
            error = tracing::field::Empty
        );
        let started = Instant::now();
        let outcome = self.guard(call).instrument(span.clone()).await;
        if let Err(error) = &outcome {
            span.record("error", tracing::field::display(error));
        }
        self.observe(request, started.elapsed(), outcome.as_ref().map(|_| ()));
        outcome
    }

    /// Runs `call`, abandoning it (dropping its future) at the deadline ([`CloudError::Timeout`]) or on
    /// cancellation ([`CloudError::Cancelled`]). The clock is read before every poll of `call`, so a process
    /// that was frozen past the deadline (SIGSTOP) does not take one more step of the call when it wakes,
    /// before any timer has fired. Under a lock, the deadline is read again when its timer fires, so a call
    /// goes on while renewals extend the lock.
    pub async fn guard<T>(&self, call: impl Future<Output = Result<T, CloudError>>) -> Result<T, CloudError> {
        let mut call = std::pin::pin!(call);
        let mut expiry = std::pin::pin!(tokio::time::sleep_until(self.deadline()));
        let mut cancelled = std::pin::pin!(self.cancel.cancelled());
        std::future::poll_fn(|task| {
            if self.cancel.is_cancelled() {
                return Poll::Ready(Err(CloudError::Cancelled));
            }
            if self.is_over() {
                return Poll::Ready(Err(CloudError::Timeout));
            }
            if let Poll::Ready(outcome) = CURRENT.sync_scope(self.clone(), || call.as_mut().poll(task)) {
                return Poll::Ready(outcome);
            }
            if !self.rearm(expiry.as_mut(), task) {
                return Poll::Ready(Err(CloudError::Timeout));
            }
            if cancelled.as_mut().poll(task).is_ready() {
                return Poll::Ready(Err(CloudError::Cancelled));
            }
            Poll::Pending
        })
        .await
    }

    /// Polls `expiry`, the timer of this call's deadline; when it fired, sets it again for the deadline as it
    /// now stands and returns whether the call may go on.
    pub(crate) fn rearm(
        &self,
        mut expiry: std::pin::Pin<&mut tokio::time::Sleep>,
        task: &mut std::task::Context<'_>,
    ) -> bool {
        while expiry.as_mut().poll(task).is_ready() {
            let deadline = self.deadline();
            if Instant::now() >= deadline {
                return false;
            }
            expiry.as_mut().reset(deadline);
        }
        true
    }

    /// `stream`, a connection opened for this call alone, fenced on it: every read and write fails from the
    /// deadline on or once the call is cancelled (see [`FencedStream`]). The framework's guard drops a late
    /// call's future, but only a fence keeps a frozen or partitioned process from sending its request after
    /// the lock may have passed to another.
    pub fn fence<S>(&self, stream: S) -> FencedStream<S> {
        FencedStream::new(stream, self.clone())
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use parking_lot::Mutex;

    use super::*;

    /// A lock whose validity a test sets.
    pub(crate) struct TestLock(Mutex<Option<Instant>>);

    impl TestLock {
        /// A lock valid for `valid` from now.
        pub(crate) fn valid_for(valid: Duration) -> Arc<TestLock> {
            Arc::new(TestLock(Mutex::new(Some(Instant::now() + valid))))
        }

        /// Renewed: valid for `valid` from now (`None`: lost).
        pub(crate) fn renew(&self, valid: Option<Duration>) {
            *self.0.lock() = valid.map(|valid| Instant::now() + valid);
        }
    }

    impl LockValidity for TestLock {
        fn valid_until(&self) -> Option<Instant> {
            *self.0.lock()
        }
    }

    async fn sleeping(duration: Duration) -> Result<Duration, CloudError> {
        let started = Instant::now();
        tokio::time::sleep(duration).await;
        Ok(started.elapsed())
    }

    #[tokio::test(start_paused = true)]
    async fn a_call_under_a_lock_goes_on_while_the_lock_is_renewed_and_no_further() {
        let started = Instant::now();
        let lock = TestLock::valid_for(Duration::from_secs(2));
        let cx = CallContext::with_timeout(Duration::from_secs(10)).with_lock(lock.clone());
        assert_eq!(cx.deadline(), started + Duration::from_secs(2));

        // Renewed every second for 3 s: a 5 s call outlives the lock's first validity.
        let renewals = async {
            for _ in 0..3 {
                tokio::time::sleep(Duration::from_secs(1)).await;
                lock.renew(Some(Duration::from_secs(3)));
            }
        };
        let (outcome, ()) = tokio::join!(cx.guard(sleeping(Duration::from_secs(5))), renewals);
        assert_eq!(outcome.unwrap(), Duration::from_secs(5));

        // Not renewed: the call ends when the lock's validity does (3 s after the last renewal).
        let outcome = cx.guard(sleeping(Duration::from_secs(5))).await;
        assert!(matches!(outcome, Err(CloudError::Timeout)), "{outcome:?}");
        assert_eq!(Instant::now(), started + Duration::from_secs(6));

        // Renewed for ever: the call still ends at its own deadline.
        lock.renew(Some(Duration::from_secs(3600)));
        let outcome = cx.guard(std::future::pending::<Result<(), CloudError>>()).await;
        assert!(matches!(outcome, Err(CloudError::Timeout)), "{outcome:?}");
        assert_eq!(Instant::now(), started + Duration::from_secs(10));
        assert!(cx.is_over());
    }

    #[tokio::test(start_paused = true)]
    async fn a_lost_lock_ends_the_call_no_later_than_its_last_validity() {
        let started = Instant::now();
        let lock = TestLock::valid_for(Duration::from_secs(4));
        let cx = CallContext::with_timeout(Duration::from_secs(10)).with_lock(lock.clone());
        let lose = async {
            tokio::time::sleep(Duration::from_secs(1)).await;
            lock.renew(None);
        };
        let (outcome, ()) = tokio::join!(cx.guard(std::future::pending::<Result<(), CloudError>>()), lose);
        assert!(matches!(outcome, Err(CloudError::Timeout)), "{outcome:?}");
        assert!(Instant::now() <= started + Duration::from_secs(4));
        assert!(cx.is_over(), "a lost lock leaves no time");
        assert_eq!(cx.remaining(), Duration::ZERO);
        // A new call under the lost lock is not started.
        assert!(matches!(
            cx.guard(async { Ok(()) }).await,
            Err(CloudError::Timeout)
        ));
    }

    #[tokio::test(start_paused = true)]
    async fn calls_are_abandoned_at_the_deadline_or_on_cancellation() {
        let cx = CallContext::with_timeout(Duration::from_secs(5));
        let slow = async {
            tokio::time::sleep(Duration::from_secs(60)).await;
            Ok::<_, CloudError>(1)
        };
        assert!(matches!(cx.guard(slow).await, Err(CloudError::Timeout)));
        // Past the deadline, even a call that would finish at once is not started.
        assert!(matches!(
            cx.guard(async { Ok(2) }).await,
            Err(CloudError::Timeout)
        ));
        let fresh = CallContext::with_timeout(Duration::from_secs(5));
        assert_eq!(fresh.guard(async { Ok(2) }).await.unwrap(), 2);

        let cancel = CancellationToken::new();
        let cx = CallContext::new(Instant::now() + Duration::from_secs(60), cancel.clone(), "me/c");
        let pending = std::future::pending::<Result<(), CloudError>>();
        let (outcome, ()) = tokio::join!(cx.guard(pending), async { cancel.cancel() });
        assert!(matches!(outcome, Err(CloudError::Cancelled)));
        assert!(cx.narrowed(Duration::from_secs(1)).deadline() <= cx.deadline());
    }

    #[tokio::test(start_paused = true)]
    async fn the_current_call_is_known_inside_its_guard_only() {
        assert!(CallContext::current().is_none());
        let outer = CallContext::new(
            Instant::now() + Duration::from_secs(60),
            CancellationToken::new(),
            "ccm/1 (linux/x86_64) host_1/service-lb-controller",
        );
        let seen = outer
            .guard(async {
                let current = CallContext::current().expect("inside a guard");
                tokio::time::sleep(Duration::from_millis(1)).await;
                // Still set after the call was suspended and polled again.
                let again = CallContext::current().expect("after a wake-up");
                let inner = outer.narrowed(Duration::from_secs(1));
                let nested = inner
                    .guard(async { Ok(CallContext::current().map(|cx| cx.deadline())) })
                    .await?;
                Ok((current.caller().to_owned(), again.deadline(), nested))
            })
            .await
            .unwrap();
        assert_eq!(
            seen,
            (
                outer.caller().to_owned(),
                outer.deadline(),
                Some(Instant::now() + Duration::from_secs(1))
            )
        );
        assert!(CallContext::current().is_none(), "not outside the guard");
    }

    #[tokio::test(start_paused = true)]
    async fn a_call_started_past_its_deadline_takes_no_step() {
        // The context was made, then the process froze past its deadline (no timer has fired yet).
        let cx = CallContext::with_timeout(Duration::from_secs(5));
        tokio::time::advance(Duration::from_secs(6)).await;
        let stepped = std::sync::atomic::AtomicBool::new(false);
        let call = std::future::poll_fn(|_| {
            stepped.store(true, std::sync::atomic::Ordering::SeqCst);
            Poll::Ready(Ok::<_, CloudError>(()))
        });
        assert!(matches!(cx.guard(call).await, Err(CloudError::Timeout)));
        assert!(
            !stepped.load(std::sync::atomic::Ordering::SeqCst),
            "the late call was polled"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn calls_are_reported_to_the_observer_with_their_outcome() {
        #[derive(Default)]
        struct Seen(parking_lot::Mutex<Vec<(String, Duration, Option<String>)>>);
        impl CallObserver for Seen {
            fn observe(&self, request: &str, elapsed: Duration, outcome: Result<(), &CloudError>) {
                let error = outcome.err().map(ToString::to_string);
                self.0.lock().push((request.to_owned(), elapsed, error));
            }
        }
        let seen = Arc::new(Seen::default());
        let cx = CallContext::with_timeout(Duration::from_secs(5)).with_observer(seen.clone());
        let slow = async {
            tokio::time::sleep(Duration::from_secs(2)).await;
            Ok::<_, CloudError>(())
        };
        cx.call("ensure_load_balancer", slow).await.unwrap();
        let narrowed = cx.narrowed(Duration::from_secs(1));
        let hung = narrowed.call("list_routes", std::future::pending::<Result<(), CloudError>>());
        assert!(matches!(hung.await, Err(CloudError::Timeout)));
        let throttled = CloudError::Retry {
            after: Duration::from_secs(1),
            message: "slow down".to_owned(),
        };
        narrowed.observe("DescribeInstances", Duration::from_millis(5), Err(&throttled));
        let seen = seen.0.lock();
        assert_eq!(
            *seen,
            vec![
                ("ensure_load_balancer".to_owned(), Duration::from_secs(2), None),
                (
                    "list_routes".to_owned(),
                    Duration::from_secs(1),
                    Some(CloudError::Timeout.to_string())
                ),
                (
                    "DescribeInstances".to_owned(),
                    Duration::from_millis(5),
                    Some(throttled.to_string())
                ),
            ]
        );
    }
}
