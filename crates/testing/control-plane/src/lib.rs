//! A Kubernetes control plane for tests, chosen by one parameter: [`Backend::Test`], this repository's
//! test API server (in-process, starts in milliseconds, with fault injection), or [`Backend::Kube`], a real
//! kube-apiserver on a real etcd, built from their Go modules by `cargo xtask kube` ([`KubeApiServer`]).
//!
//! An end-to-end test is written once, as `async fn name(backend: Backend)`, and
//! [`on_both_backends!`] makes it two tests, `name::test_apiserver` and `name::kube_apiserver`. What a test
//! needs from either server is on [`ApiServer`]: an administrator's client and kubeconfig, identities
//! minted for a user or a service account ([`Credentials`]), and the server's own record of requests and
//! Lease writes (the test API server's request log, or kube-apiserver's audit log).
//!
//! Test tooling: never on a manager's code path.

mod backend;
mod binaries;
mod kube_apiserver;
mod pki;
mod process;
mod records;

pub use backend::{ApiServer, Backend, Error};
pub use binaries::{KubeBinaries, Unavailable};
pub use kube_apiserver::{FRONT_PROXY_CLIENT, KubeApiServer, KubeConfig, LEAN_AUDIT_POLICY};
pub use kube_ccm_test_apiserver::{LeaseRecord, RequestRecord, TestApiServer, UserInfo};
pub use pki::{CertifiedKey, Credentials};
pub use process::StartError;
