//! `ccm-bench chaos`: six manager processes mid-migration (three playing kube-controller-manager with the N
//! configuration, three cloud-controller-managers with N+1; main and migration locks), a workload that adds
//! nodes and LoadBalancer services and retires some of each, a fake cloud that is slow, failing or hanging
//! at times, and, from a seeded random schedule: SIGKILL, SIGTERM, restarts, SIGSTOP for longer than the
//! lease, API-server faults (latency, 500/503/429, a process cut off: its requests hang and its watches
//! end). A process that exits on its own (a leader that lost its lease exits, as upstream's) is restarted
//! in its slot, as kubelet restarts a pod's container. Then the faults stop and the cluster must converge.
//!
//! The verdict comes from the API server's and the fake cloud's own logs: no write (Kubernetes or cloud)
//! outside its writer's lock tenure, every node initialised, every retired node deleted, no load balancer
//! orphaned or missing, no process stuck on SIGTERM, no process that ended on its own other than by
//! `exit(1)` (a panic or a stray signal fails the run).
//!
//! Partitions are real where the machine allows it (root, iproute2): each replica runs in its own network
//! namespace behind a veth link, and a partition takes the link down (`netns.rs`). Elsewhere the API
//! server cuts the process off instead (its requests hang, its watches end), and the report says so.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use harness::{Admin, Environment, Side, Timings, Workload};
use k8s_openapi::api::core::v1::{Node, Service};
use kube::api::{Api, DeleteParams, ListParams};
use leadermigration::audit::{CLOUD_VERB, Overlap, UserAgent, audit};
use provider_fake::{AdminRequest, CloudResponse, FakeCloud, FakeCloudClient, FakeCloudServer, Knobs};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;
use tokio::time::Instant;

use crate::netns::Netns;
use crate::process::{ApiServer, TempDir, manager_binary};
use crate::stats::round;

mod faults;
mod orphans;
mod plane;
mod server;

use faults::{cloud_call, inject, retire};
use orphans::Orphan;
use plane::{EXPECTED_EXIT, Peer, Plane, Slot};
use server::Server;

#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// How long the faults go on.
    #[arg(long, default_value_t = 60)]
    seconds: u64,
    /// Seed of the fault schedule (random when absent; the report gives it, to replay a run).
    #[arg(long)]
    seed: Option<u64>,
    /// Lease duration in whole seconds (renew deadline: half; retry period: a tenth).
    #[arg(long, default_value_t = 2)]
    lease_seconds: u64,
    /// How long the cluster has to converge once the faults stop.
    #[arg(long, default_value_t = 90)]
    converge_seconds: u64,
    /// The API server: `test` (ours, with its faults: latency, errors, a process cut off) or `kube` (the
    /// real kube-apiserver and etcd, `cargo xtask kube`; its faults are the network's).
    #[arg(long, default_value = "test", value_parser = ["test", "kube"])]
    apiserver: String,
    /// The managers: `rust` (six of ours, three playing kube-controller-manager at N, three
    /// cloud-controller-managers at N+1) or `go` (three of upstream's Go cloud-controller-manager and
    /// three of ours, all at N+1, sharing both Leases).
    #[arg(long, default_value = "rust", value_parser = ["rust", "go"])]
    peers: String,
    /// The run fails with fewer fault events than this.
    #[arg(long, default_value_t = 0)]
    min_events: u32,
    #[command(flatten)]
    output: crate::Output,
}

/// What happened and the verdict.
#[derive(Debug, Serialize)]
struct Report {
    seed: u64,
    seconds: u64,
    /// `test-apiserver`, or `kube-apiserver (Kubernetes v…)`.
    apiserver: String,
    /// The managers: `rust`, or `go` with the Go peer's version.
    peers: String,
    processes: usize,
    partition: &'static str,
    /// Faults injected, by kind.
    events: BTreeMap<&'static str, u32>,
    events_survived: u32,
    /// Kubernetes writes of controllers judged against lock tenures.
    kubernetes_writes_judged: usize,
    /// Of those that succeeded, the Go peer's and ours (with `--peers go` both must have written).
    controller_writes_by_peer: BTreeMap<&'static str, usize>,
    /// Cloud changes judged against lock tenures.
    cloud_writes_judged: usize,
    /// Overlaps by this framework's replicas, or tenures of a Lease that intersect: none may be.
    overlaps: Vec<Overlap>,
    /// With `--peers go`: writes of upstream's Go cloud-controller-manager outside its own tenure,
    /// counted and not judged (upstream's writes are not fenced on its lock: a replica whose renewals
    /// fall behind, e.g. behind its own client's rate limiter, goes on writing until it notices), the
    /// first few shown.
    upstream_writes_outside_tenure: usize,
    upstream_examples: Vec<Overlap>,
    handoffs: usize,
    worst_handoff_gap_ms: f64,
    nodes: usize,
    nodes_uninitialized: Vec<String>,
    retired_nodes_left: Vec<String>,
    load_balancer_services: usize,
    /// Load balancers whose service is gone, at the end, each with the cloud write that created it: one
    /// created by upstream's Go CCM outside its tenure is upstream's unfenced write, reported and not
    /// judged (see `orphans.rs`); any other fails the run.
    orphaned_load_balancers: Vec<Orphan>,
    /// Services being deleted whose load balancer is still there at the end.
    undeleted_load_balancers: Vec<String>,
    missing_load_balancers: Vec<String>,
    /// Processes that did not exit within ten lease durations of SIGTERM.
    stuck_processes: Vec<String>,
    /// Processes that exited on their own (a lost lease ends the process, as upstream's), by exit status;
    /// each was restarted in its slot, as kubelet restarts a pod's container. Anything but status 1 (a
    /// panic, a signal nobody sent) fails the run.
    exits: BTreeMap<String, u32>,
    /// From the end of the faults to a converged cluster (`None`: it did not converge in time).
    converged_after_s: Option<f64>,
    pass: bool,
}

pub(crate) async fn run(args: Args) -> Result<()> {
    let seed = args.seed.unwrap_or_else(rand::random);
    let mut rng = StdRng::seed_from_u64(seed);
    let namespaces = Netns::available();
    let listen = if namespaces { "0.0.0.0:0" } else { "127.0.0.1:0" };
    let rust_sides = [Side::Kcm, Side::Ccm, Side::Kcm, Side::Ccm, Side::Kcm, Side::Ccm];
    let (sides, peers) = if args.peers == "go" {
        (
            [Side::Ccm; 6],
            vec![Peer::Go, Peer::Rust, Peer::Go, Peer::Rust, Peer::Go, Peer::Rust],
        )
    } else {
        (rust_sides, vec![Peer::Rust; 6])
    };
    // The links first: the real API server's certificate names the addresses replicas reach it at.
    let mut links = Vec::new();
    if namespaces {
        for slot in 0..sides.len() {
            links.push(Netns::create(u8::try_from(slot)?)?);
        }
    }
    let kube_binaries = if args.apiserver == "kube" || args.peers == "go" {
        Some(
            control_plane::KubeBinaries::find()
                .context("--apiserver kube / --peers go (`cargo xtask kube` builds them)")?,
        )
    } else {
        None
    };
    let server = if args.apiserver == "kube" {
        let binaries = kube_binaries.as_ref().context("kube binaries")?;
        let config = control_plane::KubeConfig {
            reachable_at: links
                .iter()
                .map(|link| link.host_ip.parse())
                .collect::<Result<_, _>>()?,
            ..control_plane::KubeConfig::default()
        };
        Server::Kube(Box::new(
            control_plane::KubeApiServer::start(binaries, &config).await?,
        ))
    } else {
        let process = ApiServer::start_on(listen, &[])?;
        let admin = Admin::new(process.client().await?);
        Server::Test { process, admin }
    };
    let client = match &server {
        Server::Test { process, .. } => process.client().await?,
        Server::Kube(kube) => kube.client(),
    };
    let cloud_server = FakeCloudServer::start(
        FakeCloud::new(
            Vec::new(),
            Knobs {
                latency_ms: 5,
                ..Knobs::default()
            },
        ),
        listen.parse()?,
    )
    .await?;
    let cloud = FakeCloudClient::new(cloud_server.url());
    let directory = TempDir::new()?;
    let lease = Duration::from_secs(args.lease_seconds.max(1));
    let environment = Environment::prepare(
        &directory.0,
        manager_binary()?,
        server.kubeconfig(),
        cloud_server.url(),
        Timings {
            lease_duration: lease,
            renew_deadline: lease / 2,
            retry_period: lease / 10,
        },
    )?;
    let mut slots = Vec::new();
    if namespaces {
        let kubeconfig = std::fs::read_to_string(server.kubeconfig())?;
        let cloud_port = cloud_server
            .url()
            .rsplit(':')
            .next()
            .unwrap_or_default()
            .to_owned();
        for (slot, netns) in links.into_iter().enumerate() {
            let kubeconfig_path = directory.0.join(format!("kubeconfig-{slot}"));
            std::fs::write(
                &kubeconfig_path,
                kubeconfig.replace(server.listen_host(), &netns.host_ip),
            )?;
            let cloud_path = directory.0.join(format!("cloud-{slot}.yaml"));
            std::fs::write(
                &cloud_path,
                format!("endpoint: http://{}:{cloud_port}\n", netns.host_ip),
            )?;
            slots.push(Slot {
                netns,
                kubeconfig: format!("--kubeconfig={}", kubeconfig_path.display()),
                cloud_config: format!("--cloud-config={}", cloud_path.display()),
            });
        }
    }
    let go = kube_binaries
        .as_ref()
        .filter(|_| args.peers == "go")
        .map(|binaries| {
            let mut go = environment.clone();
            go.binary = binaries.go_cloud_controller_manager.clone();
            go
        });
    let mut plane = Plane {
        environment,
        go,
        peers,
        replicas: Vec::new(),
        slots,
        paused: Vec::new(),
        cut: Vec::new(),
        next: 0,
        wait: lease * 10,
        stuck: Vec::new(),
        ours: BTreeSet::new(),
        exits: BTreeMap::new(),
    };
    for (slot, side) in sides.into_iter().enumerate() {
        plane.start(side, slot)?;
    }
    let processes = plane.replicas.len();

    let workload = Workload::new(client.clone(), cloud_server.url());
    let nodes: Api<Node> = Api::all(client.clone());
    let services: Api<Service> = Api::namespaced(client.clone(), "default");
    let mut retired_nodes: BTreeSet<String> = BTreeSet::new();
    let mut events: BTreeMap<&'static str, u32> = BTreeMap::new();
    let mut index = 0u32;
    let chaos_end = Instant::now() + Duration::from_secs(args.seconds);
    let mut next_fault = Instant::now() + Duration::from_millis(500);
    while Instant::now() < chaos_end {
        // The workload: a node and a service every tick; now and then a service or a node retires.
        workload.add_node(index).await?;
        workload.add_service(index).await?;
        if index > 3 && rng.random_bool(0.25) {
            let victim = rng.random_range(0..index);
            match services
                .delete(&format!("web-{victim}"), &DeleteParams::default())
                .await
            {
                Ok(_) => {}
                Err(kube::Error::Api(status)) if status.code == 404 => {}
                Err(error) => return Err(error).context("delete a service"),
            }
        }
        if index > 3 && rng.random_bool(0.1) {
            let victim = format!("node-{}", rng.random_range(0..index));
            if retired_nodes.insert(victim.clone()) {
                retire(&nodes, &cloud, &victim).await?;
            }
        }
        index += 1;

        let now = Instant::now();
        plane.resume_due(now)?;
        plane.heal_due(now)?;
        plane.restart_exited()?;
        if now >= next_fault {
            let kind = inject(&mut rng, &mut plane, server.faults(), &cloud, lease).await?;
            *events.entry(kind).or_default() += 1;
            next_fault = now + Duration::from_millis(rng.random_range(300..1500));
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }

    // The faults stop; the cluster must converge.
    let calm = Instant::now();
    plane.resume_due(calm + Duration::from_secs(3600))?;
    plane.heal_due(calm + Duration::from_secs(3600))?;
    cloud_call(
        &cloud,
        AdminRequest::SetKnobs(Knobs {
            latency_ms: 5,
            ..Knobs::default()
        }),
    )
    .await?;
    if let Some(admin) = server.faults() {
        admin.clear_faults().await?;
    }
    let deadline = calm + Duration::from_secs(args.converge_seconds);
    let (converged_after_s, state) = loop {
        let state = State::read(&nodes, &services, &cloud, &retired_nodes).await?;
        if state.converged() {
            break (Some(round(calm.elapsed().as_secs_f64())), state);
        }
        if Instant::now() >= deadline {
            break (None, state);
        }
        plane.restart_exited()?;
        tokio::time::sleep(Duration::from_millis(500)).await;
    };

    for (replica, _) in &plane.replicas {
        replica.terminate()?;
    }
    let wait = plane.wait;
    for (replica, _) in &mut plane.replicas {
        if replica.wait(wait).is_err() {
            plane.stuck.push(replica.name.clone());
            replica.kill()?;
        }
    }

    let mut requests = server.requests().await?;
    requests.extend(harness::cloud_writes(cloud_server.url()).await?);
    let report = audit(
        &server.leases().await?,
        &requests,
        &plane.environment.governance()?,
    );
    let cloud_writes_judged = requests
        .iter()
        .filter(|r| r.verb.as_deref() == Some(CLOUD_VERB))
        .count();
    let events_survived = events.values().sum();
    let orphaned = orphans::explain(&state.orphaned, &requests, &report.overlaps, &plane.ours);
    // Upstream's unfenced writes are its own; a write of ours outside its tenure, an unowned write, or
    // two tenures at once fail the run.
    let (upstream, overlaps): (Vec<Overlap>, Vec<Overlap>) =
        report
            .overlaps
            .iter()
            .cloned()
            .partition(|overlap| match overlap {
                Overlap::WriteOutsideTenure { identity, .. } => !plane.ours.contains(identity),
                _ => false,
            });
    let mut controller_writes_by_peer: BTreeMap<&'static str, usize> = BTreeMap::new();
    for request in &requests {
        let write = request.method != "GET" && (200..300).contains(&request.status);
        if let Some(agent) = UserAgent::parse(&request.user_agent)
            .filter(|a| write && a.controller != leadermigration::audit::LEADER_ELECTION)
        {
            let peer = if plane.ours.contains(&agent.identity) {
                "rust"
            } else {
                "go"
            };
            *controller_writes_by_peer.entry(peer).or_default() += 1;
        }
    }
    let both_wrote = args.peers != "go"
        || (controller_writes_by_peer.get("go").copied().unwrap_or(0) > 0
            && controller_writes_by_peer.get("rust").copied().unwrap_or(0) > 0);
    let result = Report {
        seed,
        seconds: args.seconds,
        apiserver: server.describe(),
        peers: match (&args.peers[..], &kube_binaries) {
            ("go", Some(binaries)) => format!(
                "go: three of upstream's Go cloud-controller-manager ({}) and three of ours",
                binaries.kubernetes_version
            ),
            _ => "rust: six of ours (three at N as kube-controller-manager, three at N+1)".to_owned(),
        },
        processes,
        partition: if namespaces {
            "network: each replica in its own network namespace, its veth link taken down"
        } else if server.faults().is_none() {
            "none: no network namespaces here, and the real kube-apiserver cannot cut a client off"
        } else {
            "at the API server (no network namespaces here): the cut-off process's requests hang and its watches end; not a cut TCP link"
        },
        events,
        events_survived,
        kubernetes_writes_judged: report.writes_checked.saturating_sub(cloud_writes_judged),
        controller_writes_by_peer,
        cloud_writes_judged,
        handoffs: report.handoffs.len(),
        worst_handoff_gap_ms: round(report.handoffs.iter().map(|h| h.gap_ms).fold(0.0, f64::max)),
        pass: overlaps.is_empty()
            && events_survived >= args.min_events
            && both_wrote
            && (converged_after_s.is_some() || state.converged_but_for_orphans())
            && orphaned.iter().all(Orphan::upstream_unfenced)
            && plane.stuck.is_empty()
            && plane.exits.keys().all(|status| status == EXPECTED_EXIT)
            && cloud_writes_judged > 0,
        overlaps,
        upstream_writes_outside_tenure: upstream.len(),
        upstream_examples: upstream.into_iter().take(5).collect(),
        nodes: state.nodes,
        nodes_uninitialized: state.uninitialized,
        retired_nodes_left: state.retired_left,
        load_balancer_services: state.wanted.len(),
        orphaned_load_balancers: orphaned,
        undeleted_load_balancers: state.undeleted,
        missing_load_balancers: state.missing,
        stuck_processes: plane.stuck.clone(),
        exits: plane.exits.clone(),
        converged_after_s,
    };
    args.output.write(&serde_json::to_value(&result)?)?;
    if !result.pass {
        bail!(
            "chaos run failed (seed {seed}; replica logs in {})",
            directory.keep().join("logs").display()
        );
    }
    Ok(())
}

/// The cluster and the cloud, compared.
struct State {
    nodes: usize,
    uninitialized: Vec<String>,
    retired_left: Vec<String>,
    /// `namespace/name` of every LoadBalancer service.
    wanted: BTreeSet<String>,
    /// `(service, load balancer)` of each load balancer whose service is gone.
    orphaned: Vec<(String, String)>,
    /// Services being deleted whose load balancer is still there: their controller's work in progress.
    undeleted: Vec<String>,
    missing: Vec<String>,
}

impl State {
    async fn read(
        nodes: &Api<Node>,
        services: &Api<Service>,
        cloud: &FakeCloudClient,
        retired: &BTreeSet<String>,
    ) -> Result<State> {
        let node_list = nodes.list(&ListParams::default()).await?.items;
        let names = |n: &Node| n.metadata.name.clone().unwrap_or_default();
        let uninitialized = node_list
            .iter()
            .filter(|n| !retired.contains(&names(n)) && !harness::initialized(n))
            .map(names)
            .collect();
        let retired_left = node_list
            .iter()
            .map(names)
            .filter(|n| retired.contains(n))
            .collect();
        let mut service_list = services.list(&ListParams::default()).await?.items;
        let present: BTreeSet<String> = service_list
            .iter()
            .map(|s| format!("default/{}", s.metadata.name.as_deref().unwrap_or_default()))
            .collect();
        service_list.retain(harness::is_load_balancer);
        let wanted: BTreeSet<String> = service_list
            .iter()
            .filter(|s| s.metadata.deletion_timestamp.is_none())
            .map(|s| format!("default/{}", s.metadata.name.as_deref().unwrap_or_default()))
            .collect();
        let served: BTreeSet<String> = service_list
            .iter()
            .filter(|s| s.metadata.deletion_timestamp.is_none() && harness::has_ingress(s))
            .map(|s| format!("default/{}", s.metadata.name.as_deref().unwrap_or_default()))
            .collect();
        // service -> load balancer name
        let load_balancers: BTreeMap<String, String> = match cloud_call(cloud, AdminRequest::Snapshot).await?
        {
            CloudResponse::Snapshot { load_balancers, .. } => load_balancers
                .into_iter()
                .map(|lb| (lb.service, lb.name))
                .collect(),
            other => bail!("unexpected snapshot answer {other:?}"),
        };
        let unwanted = || {
            load_balancers
                .iter()
                .filter(|(service, _)| !wanted.contains(*service))
        };
        Ok(State {
            nodes: node_list.len(),
            uninitialized,
            retired_left,
            orphaned: unwanted()
                .filter(|(service, _)| !present.contains(*service))
                .map(|(service, name)| (service.clone(), name.clone()))
                .collect(),
            undeleted: unwanted()
                .filter(|(service, _)| present.contains(*service))
                .map(|(service, _)| service.clone())
                .collect(),
            missing: wanted
                .iter()
                .filter(|s| !load_balancers.contains_key(*s) || !served.contains(*s))
                .cloned()
                .collect(),
            wanted,
        })
    }

    /// Nothing left to do.
    fn converged(&self) -> bool {
        self.orphaned.is_empty() && self.converged_but_for_orphans()
    }

    /// Nothing left to do but load balancers whose service is gone. Ours deletes one it ensured for a
    /// service deleted without its finalizer, so the run waits for them until its deadline; what is left
    /// then is judged by who created it (`orphans.rs`).
    fn converged_but_for_orphans(&self) -> bool {
        self.uninitialized.is_empty()
            && self.retired_left.is_empty()
            && self.undeleted.is_empty()
            && self.missing.is_empty()
    }
}
