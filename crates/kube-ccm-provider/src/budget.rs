//! One budget for a cloud's API, shared by every controller of a process (decision 0034).
//!
//! A cloud limits the requests an account makes (EC2 throttles per account and region, Compute per
//! project); the controllers of one manager share that limit, so they share one [`RateBudget`]: a token
//! bucket (requests per second and a burst) with priorities, and a pause for everyone when the cloud
//! throttles anyway. The framework attaches it to every [`CallContext`](crate::CallContext) it makes; a
//! provider takes one token per request it sends with [`CallContext::acquire`](crate::CallContext::acquire)
//! (or [`CallContext::request`](crate::CallContext::request)), and a throttled request reported with
//! [`CloudError::Throttled`](crate::CloudError::Throttled) pauses the budget.
//!
//! Priorities are strict, with no ageing: under sustained load of a higher priority, a lower one waits
//! until its calls' deadlines (the lifecycle controller's rounds then fail, which deletes nothing).

use std::pin::pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use parking_lot::Mutex;
use tokio::sync::Notify;
use tokio::time::Instant;

/// Who goes first when the budget is short: a waiting request of a higher priority takes the next token
/// before any of a lower one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[non_exhaustive]
pub enum Priority {
    /// Initialising nodes: a new node carries no workload until it is initialised.
    Initialise,
    /// Reconciling what users asked for: load balancers, routes, a provider's own controllers.
    Reconcile,
    /// Periodic checks and refreshes: node lifecycle rounds, node address refreshes.
    Refresh,
}

impl Priority {
    /// Every priority, highest first.
    pub const ALL: [Priority; 3] = [Priority::Initialise, Priority::Reconcile, Priority::Refresh];

    /// Its name in metrics and logs.
    pub fn as_str(self) -> &'static str {
        match self {
            Priority::Initialise => "initialise",
            Priority::Reconcile => "reconcile",
            Priority::Refresh => "refresh",
        }
    }

    fn index(self) -> usize {
        match self {
            Priority::Initialise => 0,
            Priority::Reconcile => 1,
            Priority::Refresh => 2,
        }
    }
}

/// The lowest rate a budget takes (a token every ~17 minutes); a lower positive one is raised to it.
pub const MIN_PER_SECOND: f64 = 0.001;

/// The longest a throttled request pauses the budget, whatever retry delay it carries.
pub const MAX_PAUSE: Duration = Duration::from_secs(60);

/// A token bucket shared by a process's cloud requests, with priorities and a shared pause on throttling.
#[derive(Debug)]
pub struct RateBudget {
    /// Tokens added per second; not positive: no limit.
    per_second: f64,
    /// The most tokens held.
    burst: f64,
    state: Mutex<State>,
    changed: Notify,
    granted: [AtomicU64; 3],
    waited_micros: [AtomicU64; 3],
    pauses: AtomicU64,
}

#[derive(Debug)]
struct State {
    tokens: f64,
    refilled: Instant,
    paused_until: Instant,
    waiting: [usize; 3],
}

/// What a budget has granted, by priority (in [`Priority::ALL`]'s order), for metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct BudgetStats {
    /// Tokens granted.
    pub granted: [u64; 3],
    /// Time spent waiting for them.
    pub waited: [Duration; 3],
    /// Times the cloud throttled and the budget paused.
    pub pauses: u64,
}

impl RateBudget {
    /// `per_second` requests a second on average, `burst` at once; `per_second` not positive (or not a
    /// number): no limit, only the pause on throttling.
    pub fn new(per_second: f64, burst: u32) -> RateBudget {
        let burst = f64::from(burst.max(1));
        let now = Instant::now();
        RateBudget {
            per_second: match per_second {
                r if !r.is_finite() || r <= 0.0 => 0.0,
                // A token a quarter of an hour at the least: a waiter's sleep stays a sane duration.
                r => r.max(MIN_PER_SECOND),
            },
            burst,
            state: Mutex::new(State {
                tokens: burst,
                refilled: now,
                paused_until: now,
                waiting: [0; 3],
            }),
            changed: Notify::new(),
            granted: Default::default(),
            waited_micros: Default::default(),
            pauses: AtomicU64::new(0),
        }
    }

    /// Requests per second (not positive: no limit).
    pub fn per_second(&self) -> f64 {
        self.per_second
    }

    /// Waits for a token at `priority`: until the budget is not paused, no request of a higher priority
    /// waits, and a token is there. Unbounded: [`CallContext::acquire`](crate::CallContext::acquire) bounds
    /// it by the call's deadline.
    pub async fn acquire(&self, priority: Priority) {
        self.wait(priority, true).await;
    }

    /// Waits until a request at `priority` would get a token at once, without taking it: for a caller that
    /// gathers work into one request while it waits (a batch of look-ups grows meanwhile).
    pub async fn ready(&self, priority: Priority) {
        self.wait(priority, false).await;
    }

    async fn wait(&self, priority: Priority, take: bool) {
        let started = Instant::now();
        let p = priority.index();
        let _waiting = Waiting::register(self, p);
        loop {
            let mut notified = pin!(self.changed.notified());
            notified.as_mut().enable();
            let wake = {
                let mut state = self.state.lock();
                let now = Instant::now();
                self.refill(&mut state, now);
                if now < state.paused_until {
                    Some(state.paused_until)
                } else if state.waiting[..p].iter().any(|&n| n > 0) {
                    None
                } else if self.per_second <= 0.0 {
                    break;
                } else if state.tokens >= 1.0 {
                    if take {
                        state.tokens -= 1.0;
                    }
                    break;
                } else {
                    let refill = (1.0 - state.tokens) / self.per_second;
                    Some(now + Duration::try_from_secs_f64(refill).unwrap_or(Duration::from_secs(3600)))
                }
            };
            match wake {
                Some(at) => {
                    tokio::select! {
                        () = tokio::time::sleep_until(at) => {}
                        () = notified => {}
                    }
                }
                None => notified.await,
            }
        }
        if !take {
            return;
        }
        self.granted[p].fetch_add(1, Ordering::Relaxed);
        let waited = u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX);
        self.waited_micros[p].fetch_add(waited, Ordering::Relaxed);
    }

    /// The cloud throttled a request: every request waits `after` (at most [`MAX_PAUSE`]) from now, then
    /// the bucket starts empty, so the requests resume at the budget's rate rather than in a burst. A
    /// throttle reported while a pause holds is the same storm (a request that was in flight, or the same
    /// failure reported again by the call around it): it neither extends the pause nor counts.
    pub fn throttled(&self, after: Duration) {
        let now = Instant::now();
        {
            let mut state = self.state.lock();
            if now < state.paused_until {
                return;
            }
            state.paused_until = now + after.min(MAX_PAUSE);
            state.tokens = 0.0;
            state.refilled = state.paused_until;
        }
        self.pauses.fetch_add(1, Ordering::Relaxed);
        self.changed.notify_waiters();
    }

    /// What the budget granted so far.
    pub fn stats(&self) -> BudgetStats {
        let mut stats = BudgetStats {
            pauses: self.pauses.load(Ordering::Relaxed),
            ..BudgetStats::default()
        };
        for p in 0..3 {
            stats.granted[p] = self.granted[p].load(Ordering::Relaxed);
            stats.waited[p] = Duration::from_micros(self.waited_micros[p].load(Ordering::Relaxed));
        }
        stats
    }

    fn refill(&self, state: &mut State, now: Instant) {
        if now > state.refilled {
            let added = now.duration_since(state.refilled).as_secs_f64() * self.per_second;
            state.tokens = (state.tokens + added).min(self.burst);
            state.refilled = now;
        }
    }
}

/// A request waiting at a priority: counted while it waits (a lower priority waits behind it), and when it
/// stops waiting (served or given up) the others look again.
struct Waiting<'b> {
    budget: &'b RateBudget,
    priority: usize,
}

impl<'b> Waiting<'b> {
    fn register(budget: &'b RateBudget, priority: usize) -> Waiting<'b> {
        budget.state.lock().waiting[priority] += 1;
        Waiting { budget, priority }
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.budget.state.lock().waiting[self.priority] -= 1;
        self.budget.changed.notify_waiters();
    }
}

#[cfg(test)]
mod tests;
