//! Logs (tracing: `-v`, `--logging-format text|json`, `RUST_LOG`).

use tracing_subscriber::EnvFilter;

/// Sets up logging on stderr. `RUST_LOG`, when set, overrides `-v`.
pub(crate) fn init(verbosity: u8, json: bool) {
    let level = match verbosity {
        0 | 1 => "info",
        2..=5 => "info,controller_manager=debug,leadermigration=debug,cloud_controller_manager=debug",
        _ => "debug,controller_manager=trace,leadermigration=trace",
    };
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(level));
    use std::io::IsTerminal;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal());
    // A second initialisation (tests) is harmless.
    let _ = if json {
        builder.json().try_init()
    } else {
        builder.try_init()
    };
}
