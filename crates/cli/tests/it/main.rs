//! Integration tests of the `cloud-controller-manager` binary, one module per area. A single test binary
//! keeps link time down.

mod leader_migration_cli;
mod migration;
mod support;
