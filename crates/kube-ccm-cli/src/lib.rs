//! `kube-ccm-cli`: the manager and its operator tools, as a library a provider's own binary calls with
//! its registry (a provider's binary reaches it through the `kube-ccm` facade, as `kube_ccm::main`):
//!
//! ```no_run
//! use kube_ccm_runtime::Registry;
//!
//! fn main() -> std::process::ExitCode {
//!     let mut registry = Registry::new(); // the framework's controllers
//!     registry
//!         .register_provider("fake", kube_ccm_fake::factory)
//!         .expect("one provider of that name");
//!     kube_ccm_cli::main(registry)
//! }
//! ```
//!
//! - [`main`] (`app`): the command line, the manager (`startup`, `serve`, `telemetry`) and the
//!   `leader-migration` tools.
//! - `settings`: upstream's flags, each declared once, layered with a config file and the environment;
//!   `feature_gates`: `--feature-gates`, with upstream's gates.
//! - `chart` and `for_demo`: hidden, for the demo (`crates/ccm-demo`), which adds its subcommand to this
//!   command line and is not part of any shipped binary.
//!
//! This crate is the only one that knows clap, figment, environment variables and files.

#![allow(clippy::print_stderr)]

mod app;
#[doc(hidden)]
pub mod chart;
mod duration;
mod feature_gates;
mod identity;
mod leader_migration;
mod lenient;
mod serve;
mod settings;
mod startup;
mod telemetry;
mod version;

pub use app::main;

/// What the demo (`crates/ccm-demo`), built on this crate, reuses. Not an API: hidden, and free to change.
#[doc(hidden)]
pub mod for_demo {
    pub use crate::app::{Extension, main_with};
    pub use crate::leader_migration::status::conditions_now;
}

/// The parsers of user input that `fuzz/` drives, reached from there. Not an API: hidden, and free to
/// change.
#[doc(hidden)]
pub mod fuzzing {
    /// `--feature-gates`: the warnings, or the error naming the flag.
    pub fn feature_gates(text: &str) -> Result<Vec<String>, String> {
        crate::feature_gates::FeatureGates::parse(text).map(|(_, warnings)| warnings)
    }

    /// `--tls-cipher-suites`, `--tls-curve-preferences` and `--tls-min-version`: whether only TLS 1.3 is
    /// left, or the error naming the flag.
    pub fn tls_flags(suites: &[String], groups: &[String], min_version: &str) -> Result<bool, String> {
        let suites = crate::serve::cipher_suites("--tls-cipher-suites", suites)?;
        crate::serve::kx_groups("--tls-curve-preferences", groups)?;
        let tls13 = crate::startup::tls13_only("--tls-min-version", min_version)?;
        Ok(tls13 || suites.is_some_and(|s| s.is_empty()))
    }
}
pub use duration::{DurationError, GoDuration};
