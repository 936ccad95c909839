//! Test tooling, never on a manager's code path: a control plane of `cloud-controller-manager` replicas
//! (processes) against a test API server and a fake cloud. Used by `demo`, the multi-process tests and
//! the benchmarks, so all of them exercise the same thing.
//!
//! The API server and the cloud are given by URL (in-process or separate processes alike); the cloud is
//! the fake cloud, AWS (moto) or GCE (the Compute double, feature `gce`): [`Cloud`]. The verdict comes
//! from the API server's and the cloud's own records (the Lease history, the request log, the cloud's log
//! of changes with their callers), checked by `ccm-audit`.

mod admin;
pub mod aws;
pub mod aws_cost;
mod cloud;
pub mod kwok;
mod lease_watch;
mod moto;
mod replica;
mod workload;

pub use admin::{Admin, cloud_writes, holders, refused_as_invalid, wait_for_holders};
#[cfg(feature = "gce")]
pub use cloud::GceCloud;
pub use cloud::{AwsCloud, Cloud, CloudLoadBalancer, CloudWrites, Inventory};
pub use lease_watch::{LeaseWatch, ObservedLease, WatchedHandoff};
pub use moto::{MOTO_REQUIREMENT, Moto};
pub use replica::{Environment, Replica, Side, Timings};
pub use workload::{Created, Workload, has_ingress, initialized, is_load_balancer};

/// The writers every judge of these tools expects beside the managers, by `User-Agent` prefix: the tests'
/// and benchmarks' own clients (the workload: nodes, services, retirements) and kube-apiserver's own
/// loopback client. Any other write that names no governed controller fails the audit.
pub const EXPECTED_CLIENTS: &[(&str, &str)] = &[
    ("the test's own client", "test-apiserver-client/"),
    ("the test's own client", "kube-apiserver-client/"),
    ("the benchmark's own client", BENCH_USER_AGENT),
    ("kube-apiserver itself", "kube-apiserver/"),
];

/// The `User-Agent` of `ccm-bench`'s own clients.
pub const BENCH_USER_AGENT: &str = "ccm-bench/";

/// `governance` expecting the writers of [`EXPECTED_CLIENTS`].
pub fn expecting_judges(governance: ccm_audit::Governance) -> ccm_audit::Governance {
    EXPECTED_CLIENTS
        .iter()
        .fold(governance, |governance, (name, prefix)| {
            governance.other_client(name, prefix)
        })
}

/// `governance` expecting the writes of upstream's Go peers that name no process (client-go's
/// `User-Agent`): the real kube-controller-manager's (since v1.31 it runs no cloud controller, so none is
/// one the audit governs) and the Go cloud-controller-manager's own client's Events.
pub fn expecting_upstream_peers(governance: ccm_audit::Governance) -> ccm_audit::Governance {
    governance
        .other_client(
            "the real kube-controller-manager (client-go names no process)",
            "kube-controller-manager/",
        )
        .other_client_writing(
            "upstream's Go CCM's own client (Events)",
            "go-cloud-controller-manager/",
            &["events"],
        )
}

/// Says loudly that `test` is skipped because `missing`; with `CI` set, where `cargo xtask test` installs
/// every tool this machine kind can have, panics instead: nothing may skip there silently.
pub fn skip_unless_ci(test: &str, missing: &str) {
    assert!(
        std::env::var_os("CI").is_none(),
        "{test}: {missing}; with CI set a missing tool fails the test"
    );
    #[allow(clippy::print_stderr)]
    {
        eprintln!("SKIPPED: {test}: {missing}");
    }
}

/// Microseconds since the epoch: the clock of the API server's and the clouds' records (one machine).
pub fn now_us() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_micros()).unwrap_or(i64::MAX))
}

/// A `kB` field of `/proc/<pid>/status` (`VmRSS:`, `VmHWM:`, `RssAnon:`, …), in MiB; `None` where there
/// is no such process, file or field.
pub fn proc_status_mib(pid: u32, field: &str) -> Option<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kib: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix(field))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    Some(kib / 1024.0)
}
