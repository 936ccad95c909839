//! The fencing check: once a manager's lock is lost, no cloud write of its provider lands. The manager
//! gives every cloud call a deadline no later than its lock's validity; this check proves that the
//! provider keeps it when it matters, with a real lock taken away mid-flight, judged from the fixture's
//! write count against the Lease's history on the API server.

use std::time::{Duration, SystemTime};

use kube_ccm_leadermigration::LeaseTimings;
use kube_ccm_leadermigration::scopes::LossPolicy;
use kube_ccm_runtime::LeaderElectionConfig;
use kube_ccm_test_apiserver::{FaultAction, FaultSpec};

use crate::contract::{ensure, fail, load_balancer};
use crate::controllers::{Cluster, IDENTITY, cloud_load_balancers_when, create_service};
use crate::{FIXTURE_FAILED, Failure, Fixture};

/// The manager's Lease.
const LEASE: &str = "cloud-controller-manager";
/// Its duration: after this since its last renewal, another process may take it and act.
const LEASE_DURATION: Duration = Duration::from_secs(2);
/// How long the cloud holds each request while the lock is taken away: longer than the lease, so a call
/// begun under the lock reaches the cloud only after the lock has passed, unless it is abandoned.
const HOLD: Duration = Duration::from_secs(4);
/// After the hold, how long a late write is watched for.
const WATCH: Duration = Duration::from_secs(3);

/// A manager leading with a load-balancer call in flight loses its lock (the API server stops answering it,
/// as in a partition): no write of that call, nor any later one, lands in the cloud once the lock may have
/// passed to another process (its last renewal plus the lease's duration).
pub async fn no_cloud_write_lands_after_the_lock_is_lost(fixture: &dyn Fixture) -> Result<(), Failure> {
    load_balancer(fixture, &*fixture.provider().await?)?;
    let cluster = Cluster::start(fixture).await?;
    let node = cluster.register("conformance-fence", None).await?;
    let timings = LeaseTimings::new(LEASE_DURATION, Duration::from_secs(1), Duration::from_millis(200))
        .map_err(|e| Failure(format!("lease timings: {e}")))?;
    let election = LeaderElectionConfig::new("kube-system", LEASE, timings, LossPolicy::Exit);
    let running = cluster.run(Some(election)).await?;
    cluster.initialised(&node).await?;

    // A positive control: the fixture's write count moves when the manager makes a load balancer, so a late
    // write would be seen.
    let before = fixture.writes().await?;
    let first = create_service(&cluster, "first").await?;
    cloud_load_balancers_when(&cluster, &first, "the first service's load balancer", |l| {
        l.len() == 1
    })
    .await?;
    // A fixture may record a write just after the cloud shows it (the example's file cloud renames its
    // state, then appends to its audit log): the count is given a moment to catch up.
    let counted_by = tokio::time::Instant::now() + Duration::from_secs(5);
    let mut made = fixture.writes().await?;
    while made <= before && tokio::time::Instant::now() < counted_by {
        tokio::time::sleep(Duration::from_millis(20)).await;
        made = fixture.writes().await?;
    }
    if made <= before {
        return Err(Failure(format!(
            "{FIXTURE_FAILED}: the cloud's write count did not move ({before} → {made}) while a load balancer was made: a late write could not be seen"
        )));
    }

    fixture.set_latency(HOLD).await?;
    let asked = tokio::time::Instant::now();
    create_service(&cluster, "second").await?;
    cluster
        .until_called(
            "the manager's ensure of the second service, in flight",
            "ensure_load_balancer",
            asked,
            |c| c.ended.is_none(),
        )
        .await?;
    let cut = tokio::time::Instant::now();
    cluster.server.add_fault(FaultSpec {
        user_agent: Some("cloud-controller-manager".into()),
        action: FaultAction::Partition,
        duration_ms: None,
    });

    // The cloud's write count, sampled from the cut until the end of the watch.
    let mut samples: Vec<(SystemTime, u64)> = vec![(SystemTime::now(), fixture.writes().await?)];
    let mut unheld = false;
    let end = cut + LEASE_DURATION + HOLD + WATCH;
    while tokio::time::Instant::now() < end {
        tokio::time::sleep(Duration::from_millis(100)).await;
        if !unheld && tokio::time::Instant::now() >= cut + LEASE_DURATION {
            // The lock has passed by now; a call still going on sends what follows without delay.
            fixture.set_latency(Duration::ZERO).await?;
            unheld = true;
        }
        samples.push((SystemTime::now(), fixture.writes().await?));
    }

    let renewed = cluster
        .server
        .leases()
        .into_iter()
        .filter(|l| l.name == LEASE && l.holder_identity.as_deref() == Some(IDENTITY))
        .map(|l| l.time_us)
        .max();
    let Some(renewed) = renewed else {
        return fail(format!(
            "the manager never held its Lease {LEASE} as {IDENTITY}: the check could not take a lock away"
        ));
    };
    let passed = SystemTime::UNIX_EPOCH
        + Duration::from_micros(u64::try_from(renewed).unwrap_or_default())
        + LEASE_DURATION;
    let in_flight = cluster
        .calls_of(&["ensure_load_balancer"])
        .iter()
        .any(|c| c.started >= asked && c.started < cut && c.ended.is_none_or(|e| e > cut));
    ensure(in_flight, || {
        "no ensure_load_balancer was in flight when the lock was taken away: the check judged nothing".into()
    })?;
    let Some(&(_, at_pass)) = samples.iter().find(|(at, _)| *at >= passed) else {
        return fail("the watch ended before the lock could pass: the check judged nothing");
    };
    let last = samples.last().map_or(at_pass, |(_, count)| *count);
    ensure(last == at_pass, || {
        format!(
            "{} cloud writes landed after the manager's lock could have passed to another process (its last renewal plus {LEASE_DURATION:?}): a call begun under the lock went on past its deadline",
            last - at_pass
        )
    })?;
    // The manager exits when its lock is lost; its error says so, which is what this check asked for.
    drop(running);
    Ok(())
}
