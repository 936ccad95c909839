//! Integration tests of the `cloud-controller-manager` binary, one module per area. A single test binary
//! keeps link time down.

mod aws;
mod aws_iam;
mod bursts;
mod chart;
mod chart_install;
mod deploy;
mod gce;
mod go_peer;
mod kcm_peer;
mod kwok;
mod leader_migration_cli;
mod manager;
mod migration;
mod migration_guide;
mod migration_status;
mod monitoring;
mod orphans;
mod shipped;
mod support;
mod traces;
mod upstream_rbac;

/// The binary under test.
fn binary() -> std::process::Command {
    std::process::Command::new(env!("CARGO_BIN_EXE_cloud-controller-manager"))
}
