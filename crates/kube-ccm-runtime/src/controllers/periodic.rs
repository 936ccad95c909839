//! The loop of the periodic controllers: a round at once (or after one period), then one every period,
//! and optionally one soon after the cache changes, until the controller is stopped.

use std::future::Future;
use std::time::Duration;

use futures::stream::BoxStream;
use futures::{FutureExt, StreamExt};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// When rounds happen.
pub(crate) struct Schedule {
    /// Time between rounds: from the end of one to the start of the next, or from start to start
    /// (`from_start`, upstream's `NonSlidingUntil`).
    pub(crate) period: Duration,
    pub(crate) from_start: bool,
    /// The first round runs at once; otherwise after one period.
    pub(crate) first_round_at_once: bool,
    /// Changes that bring the next round forward, and how long to let them settle first (changes that
    /// arrive meanwhile join that round).
    pub(crate) on_change: Option<(BoxStream<'static, ()>, Duration)>,
    /// A round brought forward by a change starts no sooner than this after the previous one started.
    pub(crate) min_gap: Duration,
}

/// Runs `round` on `schedule` until `stop` fires. A round in progress is finished, not interrupted: the
/// controller's own calls see the same stop token.
pub(crate) async fn run<F, Fut>(stop: &CancellationToken, schedule: Schedule, mut round: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = ()>,
{
    let Schedule {
        period,
        from_start,
        first_round_at_once,
        on_change,
        min_gap,
    } = schedule;
    let (mut changes, settle) = match on_change {
        Some((changes, settle)) => (Some(changes), settle),
        None => (None, Duration::ZERO),
    };
    if !first_round_at_once && !pause(stop, period).await {
        return;
    }
    loop {
        let started = Instant::now();
        round().await;
        let next = if from_start {
            started + period
        } else {
            Instant::now() + period
        };
        let change = async {
            match changes.as_mut() {
                Some(changes) => changes.next().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep_until(next) => {}
            change = change => {
                if change.is_none() {
                    return;
                }
                let wait = settle.max((started + min_gap).saturating_duration_since(Instant::now()));
                let earliest = (Instant::now() + wait).min(next);
                tokio::select! {
                    () = stop.cancelled() => return,
                    () = tokio::time::sleep_until(earliest) => {}
                }
                // Drain what arrived meanwhile; one round covers it all.
                if let Some(changes) = changes.as_mut() {
                    while let Some(Some(())) = changes.next().now_or_never() {}
                }
            }
        }
    }
}

/// Waits for `duration` or until `stop`; false when stopped.
pub(crate) async fn pause(stop: &CancellationToken, duration: Duration) -> bool {
    tokio::select! {
        () = stop.cancelled() => false,
        () = tokio::time::sleep(duration) => true,
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU32, Ordering};

    use super::*;

    fn counting() -> (Arc<AtomicU32>, impl FnMut() -> std::future::Ready<()>) {
        let rounds = Arc::new(AtomicU32::new(0));
        let counter = rounds.clone();
        (rounds, move || {
            counter.fetch_add(1, Ordering::SeqCst);
            std::future::ready(())
        })
    }

    #[tokio::test(start_paused = true)]
    async fn rounds_every_period_and_stop_when_told() {
        let stop = CancellationToken::new();
        let (rounds, round) = counting();
        let schedule = Schedule {
            period: Duration::from_secs(10),
            from_start: false,
            first_round_at_once: true,
            on_change: None,
            min_gap: Duration::ZERO,
        };
        let task = tokio::spawn({
            let stop = stop.clone();
            async move { run(&stop, schedule, round).await }
        });
        tokio::time::sleep(Duration::from_secs(25)).await;
        assert_eq!(rounds.load(Ordering::SeqCst), 3, "at 0 s, 10 s and 20 s");
        stop.cancel();
        task.await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn the_first_round_can_wait_a_period_and_changes_bring_rounds_forward_once() {
        let stop = CancellationToken::new();
        let (rounds, round) = counting();
        let (sender, receiver) = tokio::sync::mpsc::unbounded_channel::<()>();
        let changes =
            futures::stream::unfold(receiver, |mut r| async move { r.recv().await.map(|c| (c, r)) });
        let schedule = Schedule {
            period: Duration::from_secs(100),
            from_start: false,
            first_round_at_once: false,
            on_change: Some((changes.boxed(), Duration::from_secs(1))),
            min_gap: Duration::ZERO,
        };
        let task = tokio::spawn({
            let stop = stop.clone();
            async move { run(&stop, schedule, round).await }
        });
        tokio::time::sleep(Duration::from_secs(99)).await;
        assert_eq!(rounds.load(Ordering::SeqCst), 0);
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert_eq!(rounds.load(Ordering::SeqCst), 1, "after one period");
        for _ in 0..5 {
            sender.send(()).unwrap();
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert_eq!(rounds.load(Ordering::SeqCst), 2, "five changes, one round");
        stop.cancel();
        task.await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn rounds_brought_forward_by_changes_keep_a_minimum_gap() {
        let stop = CancellationToken::new();
        let (rounds, round) = counting();
        let (sender, receiver) = tokio::sync::mpsc::unbounded_channel::<()>();
        let changes =
            futures::stream::unfold(receiver, |mut r| async move { r.recv().await.map(|c| (c, r)) });
        let schedule = Schedule {
            period: Duration::from_secs(60),
            from_start: true,
            first_round_at_once: true,
            on_change: Some((changes.boxed(), Duration::from_secs(1))),
            min_gap: Duration::from_secs(10),
        };
        let task = tokio::spawn({
            let stop = stop.clone();
            async move { run(&stop, schedule, round).await }
        });
        // A flood of changes, one every 100 ms for 30 s: one round per 10 s, not one per change.
        for _ in 0..300 {
            let _ = sender.send(());
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let counted = rounds.load(Ordering::SeqCst);
        assert!((3..=4).contains(&counted), "{counted} rounds in 30 s");
        stop.cancel();
        task.await.unwrap();
    }
}
