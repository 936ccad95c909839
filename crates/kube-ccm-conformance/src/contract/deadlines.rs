//! Calls abandoned at their deadline or cancelled write nothing afterwards.

use super::*;

/// The latency the deadline checks give the cloud, and the deadline they give the call (well inside it).
const LATENCY: Duration = Duration::from_millis(600);
const SHORT_DEADLINE: Duration = Duration::from_millis(150);

/// How long the deadline checks watch the cloud, once fast again, for work left running.
pub const WATCH: Duration = Duration::from_secs(2);

/// How an abandoned call is ended.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Abandon {
    Deadline,
    Cancelled,
}

/// The two deadline checks: see [`a_call_abandoned_at_its_deadline_writes_nothing_later`].
async fn abandoned_call_writes_nothing(fixture: &dyn Fixture, how: Abandon) -> Result<(), Failure> {
    let provider = fixture.provider().await?;
    let lb = load_balancer(fixture, &*provider)?;
    let (_, a) = launched(fixture, &*provider, "conformance-late-a").await?;
    let svc = service("late");
    let cluster = fixture.cluster_name();
    let before = fixture.writes().await?;
    fixture.set_latency(LATENCY).await?;
    let cancel = CancellationToken::new();
    let call_cx = match how {
        Abandon::Deadline => CallContext::new(
            tokio::time::Instant::now() + SHORT_DEADLINE,
            cancel.clone(),
            "conformance",
        ),
        Abandon::Cancelled => {
            let canceller = cancel.clone();
            tokio::spawn(async move {
                tokio::time::sleep(SHORT_DEADLINE).await;
                canceller.cancel();
            });
            CallContext::new(tokio::time::Instant::now() + CALL, cancel.clone(), "conformance")
        }
    };
    let nodes = arcs(&[&a]);
    let outcome = call_cx
        .guard(lb.ensure_load_balancer(&call_cx, cluster, &svc, &nodes))
        .await;
    let ended = tokio::time::Instant::now();
    let expected = match how {
        Abandon::Deadline => matches!(outcome, Err(CloudError::Timeout)),
        Abandon::Cancelled => matches!(outcome, Err(CloudError::Cancelled)),
    };
    if !expected {
        fixture.set_latency(Duration::ZERO).await?;
        return fail(format!(
            "ensure_load_balancer with {SHORT_DEADLINE:?} against a cloud answering after {LATENCY:?} ended {outcome:?}, not {how:?}: the fixture's latency did not hold the call back"
        ));
    }
    // The cloud is fast again at once, so work left running finishes its requests within the window:
    // the one it had in flight (held one latency), then the rest. The fixed wait is the test here.
    fixture.set_latency(Duration::ZERO).await?;
    tokio::time::sleep_until(ended + LATENCY + WATCH).await;
    let late = fixture.writes().await?;
    let held = cloud_load_balancer(fixture, lb, &svc).await?;
    ensure(late == before && held.is_none(), || {
        format!(
            "ensure_load_balancer was abandoned ({how:?}) after {SHORT_DEADLINE:?}, yet {} cloud writes landed after it ended (load balancer: {held:?}); a provider's work must end with its call's future",
            late.saturating_sub(before)
        )
    })?;
    answer(
        "ensure_load_balancer with time enough",
        lb.ensure_load_balancer(&cx(), cluster, &svc, &nodes).await,
    )?;
    let made = cloud_load_balancer(fixture, lb, &svc).await?;
    ensure(made.is_some() && fixture.writes().await? > before, || {
        "ensure_load_balancer with time enough wrote nothing the fixture saw: the check cannot observe writes"
            .into()
    })
}

/// A call past its deadline writes nothing afterwards.
///
/// Makes `ensure_load_balancer` slower than its context allows, ends it as the framework does (dropping its
/// future, through [`CallContext::guard`]), makes the cloud fast again and watches it for one latency and
/// [`WATCH`] more: nothing of that call may land (work the provider left running in a spawned task, or
/// retries past the deadline, would be a write by a process that may no longer hold the lock). A second call with time enough must then succeed,
/// so the check is seen to be able to observe a write.
pub async fn a_call_abandoned_at_its_deadline_writes_nothing_later(
    fixture: &dyn Fixture,
) -> Result<(), Failure> {
    abandoned_call_writes_nothing(fixture, Abandon::Deadline).await
}

/// A cancelled call (its controller stopping) writes nothing afterwards.
///
/// Makes `ensure_load_balancer` slower than its context allows, ends it as the framework does (dropping its
/// future, through [`CallContext::guard`]), makes the cloud fast again and watches it for one latency and
/// [`WATCH`] more: nothing of that call may land (work the provider left running in a spawned task, or
/// retries past the deadline, would be a write by a process that may no longer hold the lock). A second call with time enough must then succeed,
/// so the check is seen to be able to observe a write.
pub async fn a_cancelled_call_writes_nothing_later(fixture: &dyn Fixture) -> Result<(), Failure> {
    abandoned_call_writes_nothing(fixture, Abandon::Cancelled).await
}
