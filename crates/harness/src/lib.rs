//! Test tooling, never on a manager's code path: a control plane of `cloud-controller-manager` replicas
//! (processes) against a test API server and a fake cloud. Used by `demo`, the multi-process tests and
//! the benchmarks, so all of them exercise the same thing.
//!
//! The API server and the cloud are given by URL (in-process or separate processes alike); the cloud is
//! the fake cloud, AWS (moto) or GCE (the Compute double, feature `gce`): [`Cloud`]. The verdict comes
//! from the API server's and the cloud's own records (the Lease history, the request log, the cloud's log
//! of changes with their callers), checked by [`leadermigration::audit`].

mod admin;
pub mod aws;
pub mod aws_cost;
mod cloud;
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
