use std::sync::Arc;

use super::*;

/// Takes `count` tokens one after another at `priority`; how long that took.
async fn take(budget: &RateBudget, priority: Priority, count: usize) -> Duration {
    let started = Instant::now();
    for _ in 0..count {
        budget.acquire(priority).await;
    }
    started.elapsed()
}

#[tokio::test(start_paused = true)]
async fn tokens_come_at_the_rate_after_the_burst() {
    let budget = RateBudget::new(10.0, 5);
    assert_eq!(
        take(&budget, Priority::Reconcile, 5).await,
        Duration::ZERO,
        "the burst"
    );
    let rest = take(&budget, Priority::Reconcile, 20).await;
    assert!(
        (Duration::from_millis(1990)..=Duration::from_millis(2010)).contains(&rest),
        "20 more at 10/s: {rest:?}"
    );
    let stats = budget.stats();
    assert_eq!(stats.granted, [0, 25, 0]);
    assert!(stats.waited[1] >= Duration::from_secs(2) - Duration::from_millis(10));
}

#[tokio::test(start_paused = true)]
async fn no_limit_never_waits() {
    let budget = RateBudget::new(0.0, 1);
    assert_eq!(take(&budget, Priority::Refresh, 1000).await, Duration::ZERO);
    assert_eq!(budget.stats().granted[2], 1000);
}

#[tokio::test(start_paused = true)]
async fn a_higher_priority_goes_before_the_lower_ones_waiting() {
    let budget = Arc::new(RateBudget::new(1.0, 1));
    budget.acquire(Priority::Refresh).await;
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for name in ["refresh-1", "refresh-2", "refresh-3"] {
        let (budget, order) = (budget.clone(), order.clone());
        tasks.push(tokio::spawn(async move {
            budget.acquire(Priority::Refresh).await;
            order.lock().push(name);
        }));
    }
    // The three wait for the next token; then node initialisation asks.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let (b, o) = (budget.clone(), order.clone());
    tasks.push(tokio::spawn(async move {
        b.acquire(Priority::Initialise).await;
        o.lock().push("initialise");
    }));
    for task in tasks {
        task.await.unwrap();
    }
    let order = order.lock().clone();
    assert_eq!(order[0], "initialise", "{order:?}");
    assert_eq!(order.len(), 4);
}

#[tokio::test(start_paused = true)]
async fn a_waiter_that_gives_up_does_not_hold_the_others_back() {
    let budget = Arc::new(RateBudget::new(1.0, 1));
    budget.acquire(Priority::Reconcile).await;
    let b = budget.clone();
    let high = tokio::spawn(async move { b.acquire(Priority::Initialise).await });
    tokio::time::sleep(Duration::from_millis(10)).await;
    high.abort();
    let _ = high.await;
    let low = take(&budget, Priority::Refresh, 1).await;
    assert!(low <= Duration::from_secs(1), "{low:?}");
}

#[tokio::test(start_paused = true)]
async fn a_throttle_pauses_everyone_then_resumes_at_the_rate() {
    let budget = Arc::new(RateBudget::new(100.0, 100));
    budget.throttled(Duration::from_secs(2));
    // Every priority waits out the pause; afterwards the bucket is empty, so the next 10 take 0.1 s.
    let waited = take(&budget, Priority::Initialise, 11).await;
    assert!(
        (Duration::from_millis(2095)..=Duration::from_millis(2115)).contains(&waited),
        "{waited:?}"
    );
    assert_eq!(budget.stats().pauses, 1);
    // An absurd retry delay is capped; a throttle reported during the pause (the same storm) neither
    // shortens nor extends it, nor counts.
    budget.throttled(Duration::from_secs(3600));
    budget.throttled(Duration::from_secs(1));
    assert_eq!(budget.stats().pauses, 2);
    let waited = take(&budget, Priority::Refresh, 1).await;
    assert!(
        (MAX_PAUSE..=MAX_PAUSE + Duration::from_millis(20)).contains(&waited),
        "{waited:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_throttle_wakes_those_already_waiting() {
    let budget = Arc::new(RateBudget::new(1.0, 1));
    budget.acquire(Priority::Reconcile).await;
    let b = budget.clone();
    let waiter = tokio::spawn(async move { take(&b, Priority::Reconcile, 1).await });
    tokio::time::sleep(Duration::from_millis(100)).await;
    budget.throttled(Duration::from_secs(5));
    let waited = waiter.await.unwrap();
    assert!(
        waited >= Duration::from_secs(5),
        "waited out the pause: {waited:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn an_absurdly_low_rate_is_raised_not_a_panic() {
    let budget = RateBudget::new(1e-20, 1);
    let waited = take(&budget, Priority::Reconcile, 2).await;
    assert_eq!(
        waited,
        Duration::from_secs_f64(1.0 / MIN_PER_SECOND),
        "one token at the lowest rate after the burst"
    );
}
