//! `ccm-bench apiserver`: throughput of the test API server with 10k objects, on this machine.
//!
//! The server runs as its own process, as in every other benchmark; clients are kube-rs in this process,
//! so the numbers include a real client's cost. Phases: creates, updates (merge patch), reads (get),
//! lists of every object, and watch fan-out (W watchers, E writes, each event timed from just before its
//! write to its arrival at each watcher).

use std::sync::Arc;
use std::time::Instant;

use anyhow::Result;
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams};
use serde_json::json;

use crate::process::ApiServer;
use crate::stats::{round, summary};

#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// Objects to create (and update, and read).
    #[arg(long, default_value_t = 10_000)]
    objects: usize,
    /// Requests in flight at once.
    #[arg(long, default_value_t = 64)]
    concurrency: usize,
    /// Watchers for the fan-out phase.
    #[arg(long, default_value_t = 100)]
    watchers: usize,
    /// Writes in the fan-out phase.
    #[arg(long, default_value_t = 1_000)]
    events: usize,
    #[command(flatten)]
    output: crate::Output,
}

fn configmap(name: String, data: serde_json::Value) -> ConfigMap {
    serde_json::from_value(json!({"metadata": {"name": name}, "data": data})).expect("a ConfigMap")
}

/// Runs `count` operations with `concurrency` in flight; returns operations per second.
async fn throughput<F, Fut>(count: usize, concurrency: usize, operation: F) -> Result<f64>
where
    F: Fn(usize) -> Fut,
    Fut: std::future::Future<Output = Result<()>>,
{
    let started = Instant::now();
    futures::stream::iter((0..count).map(operation))
        .buffer_unordered(concurrency)
        .try_collect::<Vec<()>>()
        .await?;
    Ok(count as f64 / started.elapsed().as_secs_f64())
}

pub(crate) async fn run(args: Args) -> Result<()> {
    let server = ApiServer::start(&[])?;
    let client = server.client().await?;
    let maps: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    eprintln!(
        "apiserver: {} objects, {} in flight, server {}",
        args.objects, args.concurrency, server.url
    );

    let creates = throughput(args.objects, args.concurrency, |i| {
        let maps = maps.clone();
        async move {
            maps.create(
                &PostParams::default(),
                &configmap(format!("bench-{i}"), json!({"value": "0"})),
            )
            .await?;
            Ok(())
        }
    })
    .await?;
    let updates = throughput(args.objects, args.concurrency, |i| {
        let maps = maps.clone();
        async move {
            maps.patch(
                &format!("bench-{i}"),
                &PatchParams::default(),
                &Patch::Merge(json!({"data": {"value": "1"}})),
            )
            .await?;
            Ok(())
        }
    })
    .await?;
    let reads = throughput(args.objects, args.concurrency, |i| {
        let maps = maps.clone();
        async move {
            maps.get(&format!("bench-{}", (i * 7919) % args.objects)).await?;
            Ok(())
        }
    })
    .await?;
    let mut list_ms = Vec::new();
    for _ in 0..5 {
        let started = Instant::now();
        let listed = maps.list(&ListParams::default()).await?;
        anyhow::ensure!(
            listed.items.len() == args.objects,
            "listed {} of {}",
            listed.items.len(),
            args.objects
        );
        list_ms.push(started.elapsed().as_secs_f64() * 1000.0);
    }
    let rss_with_objects = server.rss_mib();

    // Watch fan-out: every watcher must see every write.
    let fanout: Api<ConfigMap> = Api::namespaced(client.clone(), "kube-public");
    let epoch = Instant::now();
    let latencies = Arc::new(parking_lot::Mutex::new(Vec::with_capacity(
        args.watchers * args.events,
    )));
    let mut watchers = Vec::new();
    for _ in 0..args.watchers {
        let stream = fanout.watch(&WatchParams::default(), "0").await?;
        let latencies = latencies.clone();
        let expected = args.events;
        watchers.push(tokio::spawn(async move {
            let mut stream = Box::pin(stream);
            let mut seen = 0;
            while seen < expected {
                match stream.try_next().await {
                    Ok(Some(WatchEvent::Added(object))) => {
                        let sent: f64 = object
                            .data
                            .and_then(|d| d.get("sent_us").and_then(|s| s.parse().ok()))
                            .unwrap_or(0.0);
                        let now = epoch.elapsed().as_secs_f64() * 1e6;
                        latencies.lock().push((now - sent) / 1000.0);
                        seen += 1;
                    }
                    Ok(Some(_)) => {}
                    Ok(None) | Err(_) => break,
                }
            }
            seen
        }));
    }
    // `watch()` returns once the server has subscribed the watcher, so every write below reaches all of them.
    let started = Instant::now();
    throughput(args.events, args.concurrency, |i| {
        let fanout = fanout.clone();
        async move {
            let sent = format!("{}", epoch.elapsed().as_secs_f64() * 1e6);
            fanout
                .create(
                    &PostParams::default(),
                    &configmap(format!("fan-{i}"), json!({"sent_us": sent})),
                )
                .await?;
            Ok(())
        }
    })
    .await?;
    let mut delivered = 0;
    for watcher in watchers {
        delivered += watcher.await?;
    }
    let fanout_seconds = started.elapsed().as_secs_f64();
    anyhow::ensure!(
        delivered == args.watchers * args.events,
        "delivered {delivered} of {}",
        args.watchers * args.events
    );
    let latencies = latencies.lock().clone();

    let result = json!({
        "objects": args.objects,
        "concurrency": args.concurrency,
        "creates_per_sec": round(creates),
        "updates_per_sec": round(updates),
        "writes_per_sec": round(2.0 * args.objects as f64 / (args.objects as f64 / creates + args.objects as f64 / updates)),
        "reads_per_sec": round(reads),
        "list_all_ms": summary(&list_ms),
        "watch_fanout": {
            "watchers": args.watchers,
            "events": args.events,
            "deliveries_per_sec": round(delivered as f64 / fanout_seconds),
            "delivery_latency_ms": summary(&latencies),
        },
        "server_rss_mib": rss_with_objects.map(round),
    });
    args.output.write(&result)
}
