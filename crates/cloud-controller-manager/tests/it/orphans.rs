//! The orphan sweep under kills: LoadBalancer services created and deleted by the hundred while the
//! managers are killed (SIGKILL) at random points, with the fake cloud losing some answers after applying
//! the write, and services now and then deleted with their finalizer removed by hand, some while no
//! manager runs. At the end the cloud holds exactly the live services' load balancers, and the audit finds
//! no write outside its writer's tenure. The control: the same without the sweep leaks what was deleted
//! while no manager ran.

use std::collections::BTreeSet;
use std::time::Duration;

use control_plane::Backend;
use harness::{Replica, Side, Workload, has_ingress};
use k8s_openapi::api::core::v1::Service;
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams};
use kube_ccm_fake::{AdminRequest, CloudRequest, CloudResponse, Knobs};
use rand::rngs::StdRng;
use rand::{Rng as _, SeedableRng as _};

use crate::migration::Plane;

const WAIT: Duration = Duration::from_secs(30);
/// How long the end may take to converge: a take-over after the last kill, then a sweep's grace.
const CONVERGE: Duration = Duration::from_secs(120);
/// The replicas' slots.
const SLOTS: [&str; 2] = ["a", "b"];
/// Live services kept while cycling: each new one beyond them retires an older one.
const LIVE: usize = 4;

/// What a run did and left.
#[derive(Debug, Default)]
struct Cycles {
    /// Services deleted.
    deleted: u32,
    /// Of them, deleted with their finalizer removed first.
    forced: u32,
    /// Services deleted, finalizer removed, while no manager ran, each with its load balancer in place
    /// (`default/web-N`): what only a sweep can find.
    orphaned: BTreeSet<String>,
    /// Processes killed.
    kills: u32,
    /// The services (`default/web-N`) of the load balancers at the end whose service is gone.
    leaked: BTreeSet<String>,
    /// Live services without an ingress at the end.
    unserved: BTreeSet<String>,
}

/// Two replicas of ours, with the migration configuration, and the sweep on or off.
struct Replicas<'p> {
    plane: &'p Plane,
    flags: &'static [&'static str],
    started: u32,
    running: Vec<Replica>,
}

impl<'p> Replicas<'p> {
    fn start(plane: &'p Plane, sweep: bool) -> Replicas<'p> {
        let flags: &'static [&'static str] = if sweep {
            &[
                "--cloud-call-timeout=2s",
                "--load-balancer-orphan-sweep-period=1s",
                "--load-balancer-orphan-grace=2s",
            ]
        } else {
            &[
                "--cloud-call-timeout=2s",
                "--load-balancer-orphan-sweep-period=0s",
            ]
        };
        let mut replicas = Replicas {
            plane,
            flags,
            started: 0,
            running: Vec::new(),
        };
        replicas.running = SLOTS.iter().map(|slot| replicas.replica(slot)).collect();
        replicas
    }

    fn replica(&mut self, slot: &str) -> Replica {
        self.started += 1;
        let name = format!("ccm-{slot}-{}", self.started);
        Replica::start_with(&self.plane.environment, &name, Side::Ccm, self.flags).unwrap()
    }

    /// SIGKILL to the replica in `slot`, and a new one in its place.
    fn kill_one(&mut self, slot: usize) {
        self.running[slot].kill().unwrap();
        self.running[slot].wait(WAIT).unwrap();
        self.running[slot] = self.replica(SLOTS[slot]);
    }

    /// SIGKILL to every replica; they stay down until [`Replicas::restart`].
    fn kill_all(&mut self) {
        for replica in &self.running {
            replica.kill().unwrap();
        }
        for replica in &mut self.running {
            replica.wait(WAIT).unwrap();
        }
    }

    fn restart(&mut self) {
        self.running = SLOTS.iter().map(|slot| self.replica(slot)).collect();
    }

    fn logs(&self) -> String {
        self.running
            .iter()
            .map(|r| format!("--- {}\n{}", r.name, r.log_tail()))
            .collect()
    }
}

/// Deletes `web-<index>`, its finalizer removed first when `forced` (as an operator unsticking a namespace).
async fn delete(services: &Api<Service>, index: u32, forced: bool) {
    let name = format!("web-{index}");
    if forced {
        let unfinalized = Patch::Merge(serde_json::json!({"metadata": {"finalizers": null}}));
        services
            .patch(&name, &PatchParams::default(), &unfinalized)
            .await
            .unwrap();
    }
    services.delete(&name, &DeleteParams::default()).await.unwrap();
}

/// One of `live` whose load balancer is in place, waiting (bounded) for one to be.
async fn served(services: &Api<Service>, live: &[u32]) -> u32 {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        for &index in live {
            if has_ingress(&services.get(&format!("web-{index}")).await.unwrap()) {
                return index;
            }
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "none of {live:?} served within {WAIT:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The services (`ns/name`) the cloud holds load balancers for.
async fn load_balancers(plane: &Plane) -> BTreeSet<String> {
    match plane
        .cloud
        .cloud()
        .handle(CloudRequest::Admin(AdminRequest::Snapshot))
        .await
    {
        CloudResponse::Snapshot { load_balancers, .. } => {
            load_balancers.into_iter().map(|lb| lb.service).collect()
        }
        other => panic!("{other:?}"),
    }
}

/// Cycles until `deletions` services were deleted, killing replicas on the way (`seed` decides where);
/// then waits for the end state: every live service served, no service left terminating, and (with the
/// sweep) the cloud holding exactly the live services' load balancers.
async fn cycles(sweep: bool, deletions: u32, seed: u64) -> Cycles {
    let plane = Plane::start(Backend::Test).await;
    plane
        .cloud
        .cloud()
        .handle(CloudRequest::Admin(AdminRequest::SetKnobs(Knobs {
            latency_ms: 20,
            lost_answer_rate: 0.05,
            ..Knobs::default()
        })))
        .await;
    let workload = Workload::new(plane.server.client(), plane.cloud.url());
    workload.add_node(0).await.unwrap();
    workload.add_node(1).await.unwrap();
    let services: Api<Service> = Api::namespaced(plane.server.client(), "default");
    let mut rng = StdRng::seed_from_u64(seed);
    let mut replicas = Replicas::start(&plane, sweep);
    let mut run = Cycles::default();
    let mut live: Vec<u32> = Vec::new();
    let mut index = 0u32;
    while run.deleted < deletions {
        workload.add_service(index).await.unwrap();
        live.push(index);
        index += 1;
        if live.len() > LIVE {
            let victim = live.swap_remove(rng.random_range(0..live.len()));
            let forced = rng.random_bool(0.3);
            delete(&services, victim, forced).await;
            run.deleted += 1;
            run.forced += u32::from(forced);
        }
        let roll: f64 = rng.random();
        // Once early for certain, so even a short run has services deleted while none ran.
        if roll < 0.04 || index == 12 {
            // A service whose load balancer is in place is deleted by force while none runs.
            let victim = served(&services, &live).await;
            replicas.kill_all();
            run.kills += 2;
            delete(&services, victim, true).await;
            live.retain(|i| *i != victim);
            run.orphaned.insert(format!("default/web-{victim}"));
            run.deleted += 1;
            run.forced += 1;
            replicas.restart();
        } else if roll < 0.10 {
            replicas.kill_one(rng.random_range(0..SLOTS.len()));
            run.kills += 1;
        }
        // The workload's pace, random so the kills land at random points of the managers' work.
        tokio::time::sleep(Duration::from_millis(rng.random_range(0..60))).await;
    }

    let expected: BTreeSet<String> = live.iter().map(|i| format!("default/web-{i}")).collect();
    let deadline = tokio::time::Instant::now() + CONVERGE;
    loop {
        let listed: Vec<Service> = (services.list(&Default::default()).await.unwrap().items)
            .into_iter()
            .filter(harness::is_load_balancer)
            .collect();
        let names: BTreeSet<String> = listed
            .iter()
            .map(|s| format!("default/{}", s.metadata.name.as_deref().unwrap_or_default()))
            .collect();
        run.unserved = listed
            .iter()
            .filter(|s| !has_ingress(s))
            .map(|s| format!("default/{}", s.metadata.name.as_deref().unwrap_or_default()))
            .collect();
        let held = load_balancers(&plane).await;
        run.leaked = held.difference(&expected).cloned().collect();
        let missing = expected.difference(&held).count();
        let settled = names == expected && run.unserved.is_empty() && missing == 0;
        if settled && (!sweep || run.leaked.is_empty()) {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no end state within {CONVERGE:?}: {run:?}, {missing} live services without a load balancer\n{}",
            replicas.logs()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let report = plane.audit().await;
    assert!(
        report.overlaps.is_empty(),
        "overlaps: {:#?}\n{}",
        report.overlaps,
        replicas.logs()
    );
    run
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[allow(clippy::print_stderr)] // what the run did, for whoever reads the output
async fn two_hundred_cycles_under_kills_leave_no_load_balancer_behind() {
    let run = cycles(true, 200, 52).await;
    eprintln!("{run:?}");
    assert!(run.leaked.is_empty(), "{run:?}");
    assert!(run.deleted >= 200 && run.kills > 0, "{run:?}");
    assert!(
        !run.orphaned.is_empty(),
        "services deleted while no manager ran, so the sweep had work: {run:?}"
    );
}

/// The control: without the sweep, what was deleted while no manager ran stays in the cloud, so the test
/// above could fail.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[allow(clippy::print_stderr)] // what the run did, for whoever reads the output
async fn without_the_sweep_the_same_cycles_leak() {
    let run = cycles(false, 40, 52).await;
    eprintln!("{run:?}");
    assert!(!run.orphaned.is_empty(), "{run:?}");
    assert!(run.orphaned.is_subset(&run.leaked), "{run:?}");
}
