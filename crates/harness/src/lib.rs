//! Test tooling, never on a manager's code path: a control plane of `cloud-controller-manager` replicas
//! (processes) against a test API server and a fake cloud. Used by `demo`, the multi-process tests and
//! the benchmarks, so all of them exercise the same thing.
//!
//! The API server and the fake cloud are given by URL (in-process or separate processes alike); the
//! verdict comes from the API server's and the fake cloud's own records (the Lease history, the request
//! log, the cloud's log of applied changes with their callers), checked by [`leadermigration::audit`].

mod admin;
pub mod aws_cost;
mod moto;
mod replica;
mod workload;

pub use admin::{Admin, cloud_writes, holders, refused_as_invalid, wait_for_holders};
pub use moto::Moto;
pub use replica::{Environment, Replica, Side, Timings};
pub use workload::{Created, Workload, has_ingress, initialized};
