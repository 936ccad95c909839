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
use ccm_audit::audit;
use harness::{Admin, Environment, Side, Timings, Workload};
use k8s_openapi::api::core::v1::{Node, Service};
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use kube_ccm_fake::{FakeCloud, FakeCloudClient, FakeCloudServer, Knobs};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::time::Instant;

use crate::netns::{Netns, Uts};
use crate::process::{ApiServer, TempDir, manager_binary};
use crate::stats::round;

mod faults;
mod orphans;
mod plane;
mod server;
mod state;
mod verdict;

use faults::{calm_cloud, inject, retire, stall};
use plane::{Peer, Plane, Slot};
use server::Server;
use state::State;
use verdict::{Seen, judge};

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

pub(crate) async fn run(args: Args) -> Result<()> {
    let seed = args.seed.unwrap_or_else(rand::random);
    let mut rng = StdRng::seed_from_u64(seed);
    let mut run = Run::set_up(&args).await?;
    let processes = run.plane.replicas.len();
    let (worked, events) = run.faults(&args, &mut rng).await?;
    let (converged_after_s, state) = run.converge(&args, &worked).await?;
    run.plane.terminate_all()?;

    let mut requests = run.server.requests().await?;
    requests.extend(harness::cloud_writes(run.cloud_server.url()).await?);
    let mut governance = run.plane.environment.governance()?;
    if args.peers == "go" {
        // Upstream's own client (its leader-election Events) names no process: expected, for Events only.
        governance = governance.other_client_writing(
            "upstream's Go CCM's own client (Events)",
            "go-cloud-controller-manager/",
            &["events"],
        );
    }
    let report = audit(&run.server.leases().await?, &requests, &governance);
    let seen = Seen {
        report: &report,
        requests: &requests,
        plane: &run.plane,
        state,
        events,
        min_events: args.min_events,
        converged_after_s,
        peers: &args.peers,
    };
    let result = judge(seen, |result| {
        result.seed = seed;
        result.seconds = args.seconds;
        result.apiserver = run.server.describe();
        result.peers = match (&args.peers[..], &run.kube_binaries) {
            ("go", Some(binaries)) => format!(
                "go: three of upstream's Go cloud-controller-manager ({}) and three of ours",
                binaries.kubernetes_version
            ),
            _ => "rust: six of ours (three at N as kube-controller-manager, three at N+1)".to_owned(),
        };
        result.processes = processes;
        result.nodes_stalled = worked.stalled.len();
        result.services_deleted = worked.services_deleted;
        result.services_deleted_without_finalizer = worked.services_forced;
        result.partition = if run.namespaces {
            "network: each replica in its own network namespace, its veth link taken down"
        } else if run.server.faults().is_none() {
            "none: no network namespaces here, and the real kube-apiserver cannot cut a client off"
        } else {
            "at the API server (no network namespaces here): the cut-off process's requests hang and its watches end; not a cut TCP link"
        };
    });
    args.output.write(&serde_json::to_value(&result)?)?;
    if !result.pass {
        std::fs::write(
            run.directory.0.join("logs").join("timeline.log"),
            run.plane.timeline_text(),
        )?;
        bail!(
            "chaos run failed (seed {seed}; replica logs in {})",
            run.directory.keep().join("logs").display()
        );
    }
    Ok(())
}

/// What the workload did: the nodes it made (`node-0` to `node-{created - 1}`), those it retired (their
/// instances terminated) and those whose kubelet it stalled (their instances running on).
struct Worked {
    created: u32,
    retired: BTreeSet<String>,
    stalled: BTreeSet<String>,
    /// Services deleted (each a create/delete cycle of a load balancer), and of them those deleted with
    /// the cleanup finalizer removed by hand first.
    services_deleted: u32,
    services_forced: u32,
}

/// Each slot's side and manager: six of ours (three at N, three at N+1), or, with `--peers go`, all at N+1
/// with upstream's Go manager in every other slot.
fn lineup(peers: &str) -> ([Side; 6], Vec<Peer>) {
    if peers == "go" {
        (
            [Side::Ccm; 6],
            vec![Peer::Go, Peer::Rust, Peer::Go, Peer::Rust, Peer::Go, Peer::Rust],
        )
    } else {
        (
            [Side::Kcm, Side::Ccm, Side::Kcm, Side::Ccm, Side::Kcm, Side::Ccm],
            vec![Peer::Rust; 6],
        )
    }
}

/// A chaos run's world: the API server, the fake cloud, the replicas.
struct Run {
    server: Server,
    client: kube::Client,
    cloud_server: FakeCloudServer,
    cloud: FakeCloudClient,
    directory: TempDir,
    plane: Plane,
    /// Each replica runs in its own network namespace.
    namespaces: bool,
    kube_binaries: Option<control_plane::KubeBinaries>,
    lease: Duration,
}

impl Run {
    /// Starts the API server, the cloud and the six replicas.
    async fn set_up(args: &Args) -> Result<Run> {
        let uts = Uts::probe()?;
        let namespaces = Netns::available();
        let listen = if namespaces { "0.0.0.0:0" } else { "127.0.0.1:0" };
        let (sides, peers) = lineup(&args.peers);
        // The links first: the real API server's certificate names the addresses replicas reach it at.
        let links = if namespaces {
            Netns::create_all(sides.len())?
        } else {
            Vec::new()
        };
        let kube_binaries = if args.apiserver == "kube" || args.peers == "go" {
            Some(
                control_plane::KubeBinaries::find()
                    .context("--apiserver kube / --peers go (`cargo xtask kube` builds them)")?,
            )
        } else {
            None
        };
        let server = Self::server(args, kube_binaries.as_ref(), &links, listen).await?;
        let client = match &server {
            Server::Test { process, .. } => process.client().await?,
            Server::Kube(kube) => kube.client(),
        };
        let knobs = Knobs {
            latency_ms: 5,
            ..Knobs::default()
        };
        let cloud_server = FakeCloudServer::start(FakeCloud::new(Vec::new(), knobs), listen.parse()?).await?;
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
        let slots = Self::slots(links, &server, &cloud_server, &directory)?;
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
            uts,
            hosts: BTreeMap::new(),
            exits: BTreeMap::new(),
            timeline: Vec::new(),
        };
        for (slot, side) in sides.into_iter().enumerate() {
            plane.start(side, slot)?;
        }
        Ok(Run {
            server,
            client,
            cloud_server,
            cloud,
            directory,
            plane,
            namespaces,
            kube_binaries,
            lease,
        })
    }

    /// The test API server on `listen`, or the real kube-apiserver with a certificate for every link.
    async fn server(
        args: &Args,
        binaries: Option<&control_plane::KubeBinaries>,
        links: &[Netns],
        listen: &str,
    ) -> Result<Server> {
        if args.apiserver != "kube" {
            let process = ApiServer::start_on(listen, &[])?;
            let admin = Admin::new(process.client().await?);
            return Ok(Server::Test { process, admin });
        }
        let binaries = binaries.context("kube binaries")?;
        let config = control_plane::KubeConfig {
            reachable_at: links
                .iter()
                .map(|link| link.host_ip.parse())
                .collect::<Result<_, _>>()?,
            ..control_plane::KubeConfig::default()
        };
        Ok(Server::Kube(Box::new(
            control_plane::KubeApiServer::start(binaries, &config).await?,
        )))
    }

    /// Each namespaced slot's kubeconfig and cloud-config, naming the host as its link reaches it.
    fn slots(
        links: Vec<Netns>,
        server: &Server,
        cloud_server: &FakeCloudServer,
        directory: &TempDir,
    ) -> Result<Vec<Slot>> {
        if links.is_empty() {
            return Ok(Vec::new());
        }
        let kubeconfig = std::fs::read_to_string(server.kubeconfig())?;
        let cloud_port = cloud_server
            .url()
            .rsplit(':')
            .next()
            .unwrap_or_default()
            .to_owned();
        let mut slots = Vec::new();
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
        Ok(slots)
    }

    /// The workload and the seeded faults, for `--seconds`: a node and a service every tick, now and then
    /// a service retired, a node retired (its instance terminated) or a node's kubelet stalled (its
    /// instance running on). Gives what the workload did and the count of each kind of fault.
    async fn faults(
        &mut self,
        args: &Args,
        rng: &mut StdRng,
    ) -> Result<(Worked, BTreeMap<&'static str, u32>)> {
        let workload = Workload::new(self.client.clone(), self.cloud_server.url());
        let nodes: Api<Node> = Api::all(self.client.clone());
        let services: Api<Service> = Api::namespaced(self.client.clone(), "default");
        let mut retired_nodes: BTreeSet<String> = BTreeSet::new();
        let mut stalled: BTreeSet<String> = BTreeSet::new();
        let mut events: BTreeMap<&'static str, u32> = BTreeMap::new();
        let mut index = 0u32;
        let (mut services_deleted, mut services_forced) = (0u32, 0u32);
        let chaos_end = Instant::now() + Duration::from_secs(args.seconds);
        let mut next_fault = Instant::now() + Duration::from_millis(500);
        while Instant::now() < chaos_end {
            workload.add_node(index).await?;
            workload.add_service(index).await?;
            if index > 3 && rng.random_bool(0.25) {
                let victim = format!("web-{}", rng.random_range(0..index));
                // Now and then as an operator unsticking a namespace would: the finalizer removed first,
                // so no controller sees the deletion through it (the orphan sweep's case).
                // Not beside upstream's Go manager: it has no sweep, so a forced deletion while one of its
                // replicas leads the service controller leaks by upstream's design, not ours.
                let forced = args.peers != "go" && rng.random_bool(0.3);
                if forced {
                    let unfinalized = Patch::Merge(serde_json::json!({"metadata": {"finalizers": null}}));
                    match services
                        .patch(&victim, &PatchParams::default(), &unfinalized)
                        .await
                    {
                        Ok(_) => {}
                        Err(kube::Error::Api(status)) if status.code == 404 => {}
                        Err(error) => return Err(error).context("remove a service's finalizer"),
                    }
                }
                match services.delete(&victim, &DeleteParams::default()).await {
                    Ok(_) => {
                        services_deleted += 1;
                        services_forced += u32::from(forced);
                    }
                    Err(kube::Error::Api(status)) if status.code == 404 => {}
                    Err(error) => return Err(error).context("delete a service"),
                }
            }
            if index > 3 && rng.random_bool(0.1) {
                let victim = format!("node-{}", rng.random_range(0..index));
                if !retired_nodes.contains(&victim) && retire(&nodes, &self.cloud, &victim).await? {
                    retired_nodes.insert(victim);
                }
            }
            if index > 3 && rng.random_bool(0.1) {
                let victim = format!("node-{}", rng.random_range(0..index));
                if !retired_nodes.contains(&victim)
                    && !stalled.contains(&victim)
                    && stall(&nodes, &victim).await?
                {
                    stalled.insert(victim);
                }
            }
            index += 1;

            let now = Instant::now();
            self.plane.resume_due(now)?;
            self.plane.heal_due(now)?;
            self.plane.restart_exited()?;
            if now >= next_fault {
                let kind = inject(
                    rng,
                    &mut self.plane,
                    self.server.faults(),
                    &self.cloud,
                    self.lease,
                )
                .await?;
                *events.entry(kind).or_default() += 1;
                next_fault = now + Duration::from_millis(rng.random_range(300..1500));
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        let worked = Worked {
            created: index,
            retired: retired_nodes,
            stalled,
            services_deleted,
            services_forced,
        };
        Ok((worked, events))
    }

    /// The faults stop; waits (at most `--converge-seconds`) for the cluster to converge. Gives how long
    /// it took (`None`: it did not) and the state last read.
    async fn converge(&mut self, args: &Args, worked: &Worked) -> Result<(Option<f64>, State)> {
        let nodes: Api<Node> = Api::all(self.client.clone());
        let services: Api<Service> = Api::namespaced(self.client.clone(), "default");
        let calm = Instant::now();
        self.plane.resume_due(calm + Duration::from_secs(3600))?;
        self.plane.heal_due(calm + Duration::from_secs(3600))?;
        calm_cloud(&self.cloud).await?;
        if let Some(admin) = self.server.faults() {
            admin.clear_faults().await?;
        }
        let deadline = calm + Duration::from_secs(args.converge_seconds);
        loop {
            let state = State::read(&nodes, &services, &self.cloud, &worked.retired, worked.created).await?;
            if state.converged() {
                return Ok((Some(round(calm.elapsed().as_secs_f64())), state));
            }
            if Instant::now() >= deadline {
                return Ok((None, state));
            }
            self.plane.restart_exited()?;
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
}
