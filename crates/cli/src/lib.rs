//! `cloud-controller-manager`: the manager and its operator tools, as a library a provider's own binary
//! calls with its registry:
//!
//! ```no_run
//! use controller_manager::Registry;
//!
//! fn main() -> std::process::ExitCode {
//!     let mut registry = Registry::new(); // the framework's controllers
//!     registry
//!         .register_provider("fake", provider_fake::factory)
//!         .expect("one provider of that name");
//!     cloud_controller_manager::main(registry)
//! }
//! ```
//!
//! - [`main`] (`app`): the command line, the manager (`startup`, `serve`, `telemetry`) and the
//!   `leader-migration` tools.
//! - `settings`: upstream's flags, each declared once, layered with a config file and the environment;
//!   `feature_gates`: `--feature-gates`, with upstream's gates.
//! - `demo` (feature `demo`): a leader migration on this machine, with the test API server and the fake
//!   cloud; a provider's own binary leaves it out with `default-features = false`.
//!
//! This crate is the only one that knows clap, figment, environment variables and files.

#![allow(clippy::print_stderr)]

mod app;
mod chart;
#[cfg(feature = "demo")]
mod demo;
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
pub use duration::{DurationError, GoDuration};
