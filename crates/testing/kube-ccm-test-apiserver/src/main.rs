//! `test-apiserver`: the test double of the Kubernetes API server, as a process.
//!
//! Prints `listening on http://127.0.0.1:PORT` as its first line, writes an admin kubeconfig with
//! `--kubeconfig-out`, and runs until SIGINT or SIGTERM.

use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use kube_ccm_test_apiserver::{Config, TestApiServer};

/// A test double of the Kubernetes API server (plain HTTP on loopback; never for production).
#[derive(Debug, Parser)]
#[command(name = "test-apiserver", version)]
struct Args {
    /// Address to listen on; port 0 picks a free one.
    #[arg(long, default_value = "127.0.0.1:0")]
    listen: SocketAddr,
    /// Write an admin kubeconfig (usable by kubectl and kube-rs) here.
    #[arg(long, value_name = "FILE")]
    kubeconfig_out: Option<PathBuf>,
    /// Enforce RBAC from stored Roles and bindings (tokens from the admin API).
    #[arg(long)]
    rbac: bool,
    /// Serve HTTPS with a CA made at start (written into the kubeconfig); kubectl sends tokens only over TLS.
    #[arg(long)]
    tls: bool,
    /// Changes kept per resource type for resuming watches.
    #[arg(long, default_value_t = 20_000)]
    history_limit: usize,
    /// Milliseconds between watch bookmarks.
    #[arg(long, default_value_t = 1000)]
    bookmark_interval_ms: u64,
    /// Records kept of the request log and of the Lease write history each; older ones are dropped,
    /// counted, and a reader asking for them gets 410.
    #[arg(long, default_value_t = 500_000)]
    log_limit: usize,
    /// Serve the admin API under /_admin/ (request log, faults, RBAC switch, token minting), to loopback
    /// callers only. Off by default: it can make anyone an administrator.
    #[arg(long)]
    admin: bool,
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .init();
    let config = Config {
        listen: args.listen,
        rbac: args.rbac,
        tls: args.tls,
        history_limit: args.history_limit,
        bookmark_interval: Duration::from_millis(args.bookmark_interval_ms),
        kubeconfig_out: args.kubeconfig_out,
        log_limit: args.log_limit,
        admin: args.admin,
    };
    if !args.listen.ip().is_loopback() {
        #[allow(clippy::print_stderr)]
        {
            eprintln!(
                "test-apiserver: WARNING: listening on {} reaches beyond this machine. This is a test double: it has no real authentication{}, and must never hold anything that matters.",
                args.listen,
                if args.rbac {
                    ""
                } else {
                    " and, without --rbac, lets anyone do anything"
                }
            );
        }
    }
    let server = match TestApiServer::start_with(config).await {
        Ok(server) => server,
        Err(error) => {
            #[allow(clippy::print_stderr)]
            {
                eprintln!("test-apiserver: {error}");
            }
            return ExitCode::FAILURE;
        }
    };
    {
        let mut stdout = std::io::stdout().lock();
        let _ = writeln!(stdout, "listening on {}", server.url());
        let _ = writeln!(stdout, "kubeconfig {}", server.kubeconfig_path().display());
        let _ = stdout.flush();
    }
    let mut terminate = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(signal) => signal,
        Err(_) => return ExitCode::FAILURE,
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = terminate.recv() => {}
    }
    drop(server);
    ExitCode::SUCCESS
}
