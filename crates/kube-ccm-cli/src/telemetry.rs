//! Logs (tracing: `-v`, `--logging-format text|json`, `RUST_LOG`) and, when `OTEL_EXPORTER_OTLP_ENDPOINT`
//! (or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`) is set, traces exported with OpenTelemetry over OTLP/HTTP
//! (protobuf). Nothing is exported otherwise.
//!
//! The spans: each sync (`reconcile`, with the controller, the object and the Lease), and beneath it its
//! cloud calls (`cloud_call`) and API requests (`HTTP`), elections. The exporter speaks plain HTTP (as an in-cluster collector on
//! port 4318 does); the standard `OTEL_*` variables configure it (endpoint, headers, timeout,
//! `OTEL_SERVICE_NAME`).

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;
use tracing_subscriber::{EnvFilter, Layer as _, Registry, reload};

/// What must be flushed at exit, and the log verbosity's handle.
pub(crate) struct Telemetry {
    traces: Option<SdkTracerProvider>,
    verbosity: Option<reload::Handle<EnvFilter, Registry>>,
}

impl Telemetry {
    /// Sets the log verbosity as `-v` would (`/debug/flags/v`); it then overrides `RUST_LOG` too.
    pub(crate) fn verbosity(&self) -> crate::serve::SetVerbosity {
        let handle = self.verbosity.clone();
        std::sync::Arc::new(move |v| match &handle {
            Some(handle) => handle
                .reload(EnvFilter::new(level(v)))
                .map_err(|error| format!("cannot change the log verbosity: {error}")),
            None => Err("logging was set up elsewhere in this process".to_owned()),
        })
    }

    /// Exports the spans still buffered. Call it outside the runtime's `block_on`, with the runtime alive.
    pub(crate) fn shutdown(self) {
        if let Some(provider) = self.traces
            && let Err(error) = provider.shutdown()
        {
            tracing::warn!(%error, "cannot flush the last traces");
        }
    }
}

/// Whether the environment asks for OTLP traces.
fn otlp_requested() -> bool {
    [
        "OTEL_EXPORTER_OTLP_ENDPOINT",
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    ]
    .iter()
    .any(|name| std::env::var_os(name).is_some_and(|v| !v.is_empty()))
}

/// The OTLP trace pipeline; must run inside the tokio runtime (its batch processor is a task of it).
fn otlp() -> Result<SdkTracerProvider, String> {
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .build()
        .map_err(|e| e.to_string())?;
    let processor = opentelemetry_sdk::trace::span_processor_with_async_runtime::BatchSpanProcessor::builder(
        exporter,
        opentelemetry_sdk::runtime::Tokio,
    )
    .build();
    let service = std::env::var("OTEL_SERVICE_NAME")
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "cloud-controller-manager".to_owned());
    Ok(SdkTracerProvider::builder()
        .with_span_processor(processor)
        .with_resource(
            opentelemetry_sdk::Resource::builder()
                .with_service_name(service)
                .build(),
        )
        .build())
}

/// Sets up logging on stderr, and trace export when asked for. `RUST_LOG`, when set, overrides `-v`.
/// Call it inside the tokio runtime.
///
/// `split_stream` (`--log-text-split-stream`): errors to stderr, everything else to stdout, as upstream's
/// text format splits them; otherwise one stream, stderr.
pub(crate) fn init(verbosity: u8, json: bool, split_stream: bool) -> Telemetry {
    let filter = || EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(level(verbosity)));
    use std::io::IsTerminal;
    use tracing_subscriber::fmt::writer::MakeWriterExt as _;
    let fmt = if split_stream {
        let errors_apart = std::io::stderr
            .with_max_level(tracing::Level::ERROR)
            .or_else(std::io::stdout);
        let fmt = tracing_subscriber::fmt::layer()
            .with_writer(errors_apart)
            .with_ansi(false);
        if json { fmt.json().boxed() } else { fmt.boxed() }
    } else {
        let fmt = tracing_subscriber::fmt::layer()
            .with_writer(std::io::stderr)
            .with_ansi(std::io::stderr().is_terminal());
        if json { fmt.json().boxed() } else { fmt.boxed() }
    };
    let (traces, problem) = if otlp_requested() {
        match otlp() {
            Ok(provider) => (Some(provider), None),
            Err(error) => (None, Some(error)),
        }
    } else {
        (None, None)
    };
    // Traces also carry the `HTTP` span of every API request (a debug span), under the reconcile that
    // made it.
    let otel = traces.as_ref().map(|provider| {
        tracing_opentelemetry::layer()
            .with_tracer(provider.tracer("cloud-controller-manager"))
            .with_filter(
                filter().add_directive(
                    format!("{}=debug", kube_ccm_runtime::HTTP_SPAN_TARGET)
                        .parse()
                        .expect("a valid directive"),
                ),
            )
    });
    let (logs, handle) = reload::Layer::new(filter());
    // A second initialisation (tests) is harmless; its handle then reaches nothing.
    let installed = tracing_subscriber::registry()
        .with(fmt.with_filter(logs))
        .with(otel)
        .try_init()
        .is_ok();
    if let Some(error) = problem {
        tracing::warn!(%error, "OTEL_EXPORTER_OTLP_ENDPOINT is set but traces cannot be exported");
    }
    Telemetry {
        traces,
        verbosity: installed.then_some(handle),
    }
}

/// The log filter for `-v` (`RUST_LOG`, when set at start, overrides it).
fn level(verbosity: u8) -> &'static str {
    match verbosity {
        0 | 1 => "info",
        2..=5 => "info,kube_ccm_runtime=debug,kube_ccm_leadermigration=debug,kube_ccm_cli=debug",
        _ => "debug,kube_ccm_runtime=trace,kube_ccm_leadermigration=trace",
    }
}
