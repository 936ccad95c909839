//! Never two actors: a lock is released only after everything under it stopped, every Kubernetes request
//! has a deadline (a write's is never past its lock), and a controller that panics or is stuck turns its
//! health check red.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use control_plane::{ApiServer, Backend};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, ListParams, PostParams};
use kube_ccm_leadermigration::elector::{LeaderState, Role};
use kube_ccm_leadermigration::scopes::{LossPolicy, ScopesError, StopCause};
use kube_ccm_leadermigration::{ControllerSelection, LeaseTimings};
use kube_ccm_provider::CloudProvider;
use kube_ccm_runtime::{
    ClientFactory, ControllerContext, ControllerDefinition, ControllerRegistry, ControllerSettings, Fence,
    Health, LeaderElectionConfig, Manager, ManagerConfig, ManagerError,
};
use kube_ccm_test_apiserver::{FaultAction, FaultSpec, TestApiServer};
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

const MAIN_LEASE: &str = "cloud-controller-manager";
const IDENTITY: &str = "fence-host_1";
/// Every wait in these tests ends by this.
const BOUND: Duration = Duration::from_secs(20);

struct Bare;

#[async_trait]
impl CloudProvider for Bare {
    fn provider_name(&self) -> &str {
        "bare"
    }
}

/// Ignores `stop`: a sync that never ends.
async fn stubborn(context: ControllerContext) {
    context.set_started();
    let _working = context.working();
    std::future::pending::<()>().await;
}

async fn panicky(context: ControllerContext) {
    context.set_started();
    panic!("boom: the controller's invariant broke");
}

/// One unit of work that never finishes, though the controller stops when told.
async fn stuck(context: ControllerContext) {
    context.set_started();
    let _working = context.working();
    context.stop().cancelled().await;
}

fn manager(
    server: &ApiServer,
    name: &'static str,
    run: fn(ControllerContext) -> futures::future::BoxFuture<'static, ()>,
) -> Manager {
    let mut registry = ControllerRegistry::empty();
    registry.register(ControllerDefinition::new(name, run)).unwrap();
    let timings = LeaseTimings::new(
        Duration::from_secs(2),
        Duration::from_secs(1),
        Duration::from_millis(200),
    )
    .unwrap();
    let election = LeaderElectionConfig::new("kube-system", MAIN_LEASE, timings, LossPolicy::Exit);
    let mut settings = ControllerSettings::defaults("test-cluster");
    // Stuck after ten of these.
    settings.cloud_call_timeout = Duration::from_millis(50);
    let config = ManagerConfig {
        component: "cloud-controller-manager".into(),
        clients: ClientFactory::new(
            server.config(),
            "cloud-controller-manager",
            IDENTITY,
            1000.0,
            1000,
        ),
        leader_election: Some(election),
        selection: ControllerSelection::parse(&["*"], registry.catalog()).unwrap(),
        controllers: settings,
    };
    Manager::new(config, registry, Arc::new(Bare))
}

/// Waits until `check` of `health` fails, and returns why.
async fn failing(health: &Health, check: &str) -> String {
    let deadline = Instant::now() + BOUND;
    loop {
        let verdict = health.health();
        if let Some((_, Err(why))) = verdict.checks.iter().find(|(name, _)| name == check) {
            return why.to_string();
        }
        assert!(Instant::now() < deadline, "{check} never failed: {verdict:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn holder(server: &ApiServer) -> Option<String> {
    let leases: Api<Lease> = Api::namespaced(server.client(), "kube-system");
    leases
        .get_opt(MAIN_LEASE)
        .await
        .unwrap()
        .and_then(|l| l.spec)
        .and_then(|s| s.holder_identity)
        .filter(|h| !h.is_empty())
}

async fn a_controller_that_does_not_stop_keeps_the_lock_unreleased(backend: Backend) {
    let server = ApiServer::for_test(backend).await;
    let manager = manager(&server, "stubborn-controller", |c| Box::pin(stubborn(c)));
    let health = manager.health();
    let shutdown = CancellationToken::new();
    let run = tokio::spawn(manager.run(shutdown.clone()));
    let deadline = Instant::now() + BOUND;
    while holder(&server).await.as_deref() != Some(IDENTITY) {
        assert!(Instant::now() < deadline, "never led");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Ready with the scope's controllers started (that check exists only once the scope runs): before
    // that, a shutdown is one of a process that never led, and rightly ends in order.
    let started = || {
        let readiness = health.readiness();
        readiness.ok
            && readiness
                .checks
                .iter()
                .any(|(name, _)| name == "controllers-started-cloud-controller-manager")
    };
    while !started() {
        assert!(Instant::now() < deadline, "never ready: {:?}", health.readiness());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    shutdown.cancel();
    let outcome = tokio::time::timeout(BOUND, run)
        .await
        .expect("the manager gave up in time")
        .unwrap();
    match outcome {
        Err(ManagerError::Scopes(error @ ScopesError::StopTimeout { .. })) => {
            let ScopesError::StopTimeout { lease, cause, .. } = &error else {
                unreachable!()
            };
            assert_eq!((lease.as_str(), *cause), (MAIN_LEASE, StopCause::Shutdown));
            assert!(error.to_string().ends_with("on shutdown"), "{error}");
        }
        other => panic!("expected a stop timeout, got {other:?}"),
    }
    // Not released: the record still names this process, so nobody takes over before it expires.
    assert_eq!(holder(&server).await.as_deref(), Some(IDENTITY));
    let releases = server
        .leases()
        .into_iter()
        .filter(|w| w.name == MAIN_LEASE && w.holder_identity.as_deref().is_none_or(str::is_empty))
        .count();
    assert_eq!(
        releases, 0,
        "the lock was released while its controller still ran"
    );
}

#[tokio::test]
async fn a_panicking_controller_turns_its_health_check_red_with_the_message() {
    let server = ApiServer::Test(TestApiServer::start().await.unwrap());
    let manager = manager(&server, "panicky-controller", |c| Box::pin(panicky(c)));
    let health = manager.health();
    let shutdown = CancellationToken::new();
    let run = tokio::spawn(manager.run(shutdown.clone()));
    let why = failing(&health, "panicky-controller").await;
    assert!(
        why.contains("panicked: boom: the controller's invariant broke"),
        "{why}"
    );
    assert!(!health.health().ok);
    shutdown.cancel();
    tokio::time::timeout(BOUND, run).await.unwrap().unwrap().unwrap();
}

#[tokio::test]
async fn a_stuck_controller_turns_its_health_check_red() {
    let server = ApiServer::Test(TestApiServer::start().await.unwrap());
    let manager = manager(&server, "stuck-controller", |c| Box::pin(stuck(c)));
    let health = manager.health();
    let shutdown = CancellationToken::new();
    let run = tokio::spawn(manager.run(shutdown.clone()));
    let why = failing(&health, "stuck-controller").await;
    assert!(
        why.starts_with("stuck: one unit of work has been running for"),
        "{why}"
    );
    shutdown.cancel();
    tokio::time::timeout(BOUND, run).await.unwrap().unwrap().unwrap();
}

fn config_map(name: &str) -> ConfigMap {
    serde_json::from_value(serde_json::json!({"metadata": {"name": name}})).unwrap()
}

#[tokio::test]
async fn a_request_to_a_silent_server_is_abandoned_at_its_deadline() {
    let server = TestApiServer::start().await.unwrap();
    server.add_fault(FaultSpec {
        user_agent: Some("silenced-controller".into()),
        action: FaultAction::Partition,
        duration_ms: None,
    });
    let clients = ClientFactory::new(
        server.config(),
        "cloud-controller-manager",
        IDENTITY,
        1000.0,
        1000,
    )
    .with_request_timeout(Duration::from_millis(300));
    let api: Api<ConfigMap> =
        Api::namespaced(clients.client("silenced-controller", None).unwrap(), "default");
    let started = Instant::now();
    let error = tokio::time::timeout(BOUND, api.list(&ListParams::default()))
        .await
        .expect("bounded")
        .unwrap_err();
    assert!(
        error
            .to_string()
            .contains("request abandoned after its deadline (request timeout)"),
        "{error:?}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn a_write_in_flight_is_abandoned_when_its_lock_stops_being_valid() {
    let server = TestApiServer::start().await.unwrap();
    server.add_fault(FaultSpec {
        user_agent: Some("fenced-controller".into()),
        action: FaultAction::Latency { ms: 3_000 },
        duration_ms: None,
    });
    let (_state, receiver) = watch::channel(LeaderState {
        lease: "some-lease".into(),
        role: Role::Leading,
        holder: Some(IDENTITY.into()),
        renewed_at: Some(Instant::now()),
        valid_until: Some(Instant::now() + Duration::from_millis(400)),
    });
    let clients = ClientFactory::new(
        server.config(),
        "cloud-controller-manager",
        IDENTITY,
        1000.0,
        1000,
    );
    let client = clients
        .client("fenced-controller", Some(Fence::new(receiver)))
        .unwrap();
    let api: Api<ConfigMap> = Api::namespaced(client, "default");
    let error = tokio::time::timeout(BOUND, api.create(&PostParams::default(), &config_map("late")))
        .await
        .expect("bounded")
        .unwrap_err();
    assert!(
        error.to_string().contains("lease some-lease no longer valid"),
        "{error:?}"
    );
    // Once the lock is no longer valid, nothing is even sent.
    let error = api
        .create(&PostParams::default(), &config_map("later"))
        .await
        .unwrap_err();
    assert!(
        error.to_string().contains("does not hold lease some-lease"),
        "{error:?}"
    );
    let stored: Api<ConfigMap> = Api::namespaced(server.client(), "default");
    assert!(stored.get_opt("later").await.unwrap().is_none());
    // The abandoned write never landed: the server records it closed by its client before its answer
    // (499), not applied when its 3 s of latency ran out.
    let record = until_recorded(&server, "fenced-controller").await;
    assert_eq!(record.status, 499, "{record:?}");
    assert!(stored.get_opt("late").await.unwrap().is_none());
}

/// The server's record of the first write by `user_agent`, once it has one (answered or abandoned).
async fn until_recorded(server: &TestApiServer, user_agent: &str) -> kube_ccm_test_apiserver::RequestRecord {
    tokio::time::timeout(BOUND, async {
        loop {
            if let Some(record) = server
                .requests()
                .into_iter()
                .find(|r| r.user_agent.contains(user_agent) && r.method == "POST")
            {
                return record;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the server records the write")
}

/// A graceful stop does not wait for the client's rate limiter: a request still waiting for a token when
/// the controllers under its lock start stopping is refused at once and never sent (so the scope stops
/// within its grace and the lock is released, where it used to expire).
#[tokio::test]
async fn a_request_waiting_for_the_rate_limiter_is_never_sent_once_its_controllers_stop() {
    let server = TestApiServer::start().await.unwrap();
    let (_state, receiver) = watch::channel(LeaderState {
        lease: "some-lease".into(),
        role: Role::Leading,
        holder: Some(IDENTITY.into()),
        renewed_at: Some(Instant::now()),
        valid_until: Some(Instant::now() + Duration::from_secs(600)),
    });
    let stop = CancellationToken::new();
    // One token now, the next a minute later.
    let clients = ClientFactory::new(
        server.config(),
        "cloud-controller-manager",
        IDENTITY,
        1.0 / 60.0,
        1,
    );
    let client = clients
        .client(
            "fenced-controller",
            Some(Fence::new(receiver).stopping_with(stop.clone())),
        )
        .unwrap();
    let api: Api<ConfigMap> = Api::namespaced(client, "default");
    api.create(&PostParams::default(), &config_map("first"))
        .await
        .unwrap();
    let mut waiting = tokio::spawn({
        let api = api.clone();
        async move { api.create(&PostParams::default(), &config_map("second")).await }
    });
    assert!(
        tokio::time::timeout(Duration::from_millis(300), &mut waiting)
            .await
            .is_err(),
        "the second request waits for its token"
    );
    stop.cancel();
    let error = tokio::time::timeout(Duration::from_secs(5), waiting)
        .await
        .expect("refused at once, not a minute later")
        .unwrap()
        .unwrap_err();
    assert!(
        error
            .to_string()
            .contains("the controllers under lease some-lease are stopping"),
        "{error:?}"
    );
    // Nor is anything sent after.
    let error = api.get_opt("first").await.unwrap_err();
    assert!(error.to_string().contains("are stopping"), "{error:?}");
    let stored: Api<ConfigMap> = Api::namespaced(server.client(), "default");
    assert!(stored.get_opt("first").await.unwrap().is_some());
    assert!(stored.get_opt("second").await.unwrap().is_none());
}

/// A write sent just before its controllers stop (a background Event) is answered before the lock can be
/// released: [`Fence::settled`] waits for it. One that is never answered is waited for only while the lock
/// is valid (after that its connection carries nothing).
#[tokio::test]
async fn the_lock_is_released_only_after_every_write_sent_under_it_was_answered() {
    let server = TestApiServer::start().await.unwrap();
    server.add_fault(FaultSpec {
        user_agent: Some("slow-controller".into()),
        action: FaultAction::Latency { ms: 700 },
        duration_ms: None,
    });
    server.add_fault(FaultSpec {
        user_agent: Some("cut-off-controller".into()),
        action: FaultAction::Partition,
        duration_ms: None,
    });
    let clients = ClientFactory::new(
        server.config(),
        "cloud-controller-manager",
        IDENTITY,
        1000.0,
        1000,
    );
    let leading = |valid_for: Duration| {
        watch::channel(LeaderState {
            lease: "some-lease".into(),
            role: Role::Leading,
            holder: Some(IDENTITY.into()),
            renewed_at: Some(Instant::now()),
            valid_until: Some(Instant::now() + valid_for),
        })
    };

    let (_state, receiver) = leading(Duration::from_secs(600));
    let stop = CancellationToken::new();
    let fence = Fence::new(receiver).stopping_with(stop.clone());
    let api: Api<ConfigMap> = Api::namespaced(
        clients.client("slow-controller", Some(fence.clone())).unwrap(),
        "default",
    );
    let write = tokio::spawn(async move { api.create(&PostParams::default(), &config_map("event")).await });
    tokio::time::timeout(BOUND, async {
        while fence.writes_in_flight() == 0 {
            tokio::task::yield_now().await;
        }
    })
    .await
    .expect("the write is on its way");
    stop.cancel();
    tokio::time::timeout(BOUND, fence.settled())
        .await
        .expect("settled once the write is answered");
    assert_eq!(fence.writes_in_flight(), 0);
    assert_eq!(
        fence.valid_until(),
        None,
        "once settled, nothing acts under the fence"
    );
    let stored: Api<ConfigMap> = Api::namespaced(server.client(), "default");
    assert!(
        stored.get_opt("event").await.unwrap().is_some(),
        "the write was answered before settled() returned"
    );
    write.await.unwrap().unwrap();

    let (_state, receiver) = leading(Duration::from_millis(500));
    let stop = CancellationToken::new();
    let fence = Fence::new(receiver).stopping_with(stop.clone());
    let api: Api<ConfigMap> = Api::namespaced(
        clients.client("cut-off-controller", Some(fence.clone())).unwrap(),
        "default",
    );
    let write = tokio::spawn(async move { api.create(&PostParams::default(), &config_map("lost")).await });
    tokio::time::timeout(BOUND, async {
        while fence.writes_in_flight() == 0 {
            tokio::task::yield_now().await;
        }
    })
    .await
    .expect("the write is on its way");
    stop.cancel();
    tokio::time::timeout(BOUND, fence.settled())
        .await
        .expect("settled when the lock stops being valid");
    assert!(fence.valid_until().is_none_or(|until| until <= Instant::now()));
    write.await.unwrap().unwrap_err();
    assert_eq!(
        fence.writes_in_flight(),
        0,
        "the abandoned write is no longer counted"
    );
    // The cut-off write never landed: it never reached the server (a partition), and its client gave it
    // up, so the partition's end cannot deliver it.
    server.clear_faults();
    let stored: Api<ConfigMap> = Api::namespaced(server.client(), "default");
    assert!(stored.get_opt("lost").await.unwrap().is_none());
    assert!(
        !server
            .requests()
            .iter()
            .any(|r| r.user_agent.contains("cut-off-controller") && r.method == "POST"),
        "the server handled the cut-off write"
    );
}

/// Whether the connection from `local` (this host's end of it) is still established, per the kernel.
#[cfg(target_os = "linux")]
fn established(local: std::net::SocketAddr) -> bool {
    let std::net::SocketAddr::V4(local) = local else {
        panic!("{local} is not IPv4")
    };
    let wanted = format!(
        "{:08X}:{:04X}",
        u32::from_le_bytes(local.ip().octets()),
        local.port()
    );
    let table = std::fs::read_to_string("/proc/net/tcp").unwrap();
    table.lines().skip(1).any(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        fields.get(1) == Some(&wanted.as_str()) && fields.get(3) == Some(&"01")
    })
}

/// A write still in the socket's send queue when its lock stops being valid is never delivered: its
/// connection is reset, so the kernel discards what it had not sent. Closed the ordinary way, the kernel
/// would go on sending it (a partition that heals later, or even after the process exited, delivers it).
/// Here a peer that reads nothing until the write was abandoned holds the queue back, as a partition does.
#[cfg(target_os = "linux")]
#[tokio::test]
async fn a_write_still_queued_when_its_lock_expires_is_discarded_not_delivered_later() {
    use tokio::io::AsyncReadExt;

    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    socket.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let listener = socket.listen(1).unwrap();
    // Far more than the socket buffers on both sides hold.
    let body_size = 16 << 20;
    let mut big = config_map("big");
    big.data = Some([("blob".to_owned(), "x".repeat(body_size))].into());
    let config = kube::Config::new(
        format!("http://{}", listener.local_addr().unwrap())
            .parse()
            .unwrap(),
    );
    let (_state, receiver) = watch::channel(LeaderState {
        lease: "some-lease".into(),
        role: Role::Leading,
        holder: Some(IDENTITY.into()),
        renewed_at: Some(Instant::now()),
        valid_until: Some(Instant::now() + Duration::from_millis(1500)),
    });
    let client = ClientFactory::new(config, "cloud-controller-manager", IDENTITY, 1000.0, 1000)
        .client("fenced-controller", Some(Fence::new(receiver)))
        .unwrap();
    let api: Api<ConfigMap> = Api::namespaced(client, "default");
    let write = tokio::spawn(async move { api.create(&PostParams::default(), &big).await });
    let (mut peer, writer) = tokio::time::timeout(BOUND, listener.accept())
        .await
        .expect("bounded")
        .unwrap();

    let error = tokio::time::timeout(BOUND, write)
        .await
        .expect("bounded")
        .unwrap()
        .unwrap_err();
    assert!(
        error.to_string().contains("lease some-lease no longer valid"),
        "{error:?}"
    );
    // The writer's end leaves ESTABLISHED once it is closed: gone if reset, FIN_WAIT1 with its queue if not.
    let closed_by = Instant::now() + BOUND;
    while established(writer) {
        assert!(
            Instant::now() < closed_by,
            "the abandoned write's connection stays open"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    // Everything the peer will ever receive.
    let mut received = 0;
    let mut buffer = vec![0; 1 << 16];
    let ending = loop {
        match tokio::time::timeout(BOUND, peer.read(&mut buffer))
            .await
            .expect("bounded")
        {
            Ok(0) => break "an orderly close".to_owned(),
            Ok(read) => received += read,
            Err(error) => break error.to_string(),
        }
    };
    assert!(
        received < body_size,
        "the abandoned write was delivered after its lock expired ({received} bytes, then {ending})"
    );
    assert!(ending.contains("reset"), "{ending}");
}

control_plane::on_both_backends!(a_controller_that_does_not_stop_keeps_the_lock_unreleased);
