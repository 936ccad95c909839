//! Integration tests of the test API server over real HTTP: with the real kubectl, with kube-rs, and as a
//! process. One test binary keeps link time down.

mod client;
mod faults;
mod kubectl;
mod lists;
mod process;
mod rbac;
mod support;
mod validation;
