//! What the demo shows at the end: the verdict as text or JSON, and the tenure chart of `--report`.

use ccm_audit::Handoff;
use harness::Side;
use kube_ccm_leadermigration::{CLOUD_CONTROLLER_MANAGER, KUBE_CONTROLLER_MANAGER};
use serde_json::json;

use super::{Args, LEASES, Names, Outcome, Timeline};
use kube_ccm_cli::chart::{Bar, Chart, Gap, Mark, Tone};

/// The tenure chart of a run: every tenure the audit found (to the end, when the last replicas stopped),
/// every hand-off, every join and stop, and the verdict.
pub(super) fn report_chart(
    args: &Args,
    names: &Names,
    outcome: &Outcome,
    handoffs: &[Handoff],
    marks: Vec<Mark>,
    now_us: i64,
) -> Chart {
    let report = &outcome.report;
    let start_us = report
        .tenures
        .iter()
        .map(|t| t.start_us)
        .chain(marks.iter().map(|m| m.at_us))
        .min()
        .unwrap_or(now_us);
    let end_us = report
        .tenures
        .iter()
        .filter_map(|t| t.end_us)
        .chain(marks.iter().map(|m| m.at_us))
        .max()
        .unwrap_or(now_us)
        .max(start_us + 1);
    let component = |identity: &str| names.get(identity).map(|(_, side)| side.component().to_owned());
    let verdict = if outcome.ok() { "ok" } else { "fail" };
    let mut footer = vec![
        (
            if outcome.ok() { Tone::Good } else { Tone::Bad },
            format!(
                "verdict: {verdict} · {} overlap(s) in {} controller write(s) checked · writes refused as invalid: {}",
                report.overlaps.len(),
                report.writes_checked,
                outcome.invalid_writes
            ),
        ),
        (
            Tone::Plain,
            format!(
                "migration lease taken over by a cloud-controller-manager: {} · held at the end by: {} · nodes initialised: {}/{} · services with a load balancer: {}/{}",
                if outcome.migrated { "yes" } else { "no" },
                outcome
                    .migration_lease_ends_with
                    .map_or("nobody", Side::component),
                outcome.nodes_initialized,
                outcome.registered.nodes,
                outcome.services_with_ingress,
                outcome.registered.services
            ),
        ),
        (
            Tone::Plain,
            format!(
                "{} cloud at the end: {} · cloud changes judged: {}, unattributed: {}",
                args.cloud,
                super::cloud::describe(&outcome.inventory)[0],
                outcome.cloud_writes,
                outcome.unattributed_cloud_writes.len()
            ),
        ),
    ];
    for overlap in &report.overlaps {
        footer.push((Tone::Bad, format!("overlap: {overlap:?}")));
    }
    Chart {
        title: format!(
            "Leader migration demo: {n} replicas, N → N+1{}, stopped with {}",
            if args.rollback { " → N (rollback)" } else { "" },
            if args.crash { "SIGKILL" } else { "SIGTERM" },
            n = args.replicas,
        ),
        start_us,
        end_us,
        leases: LEASES.iter().map(|l| (*l).to_owned()).collect(),
        bars: report
            .tenures
            .iter()
            .map(|t| Bar {
                lease: t.lease.clone(),
                holder: names.name(&t.identity),
                component: component(&t.identity),
                start_us: t.start_us,
                end_us: t.end_us,
            })
            .collect(),
        gaps: handoffs
            .iter()
            .map(|h| Gap {
                lease: h.lease.clone(),
                to: names.name(&h.to),
                at_us: h.at_us,
                gap_ms: h.gap_ms,
                released: h.released,
            })
            .collect(),
        marks,
        footer,
        clock: false,
    }
}

pub(super) fn show(args: &Args, timeline: &Timeline, names: &Names, outcome: &Outcome) {
    let Outcome {
        report,
        migrated,
        rollback,
        migration_lease_ends_with,
        registered,
        nodes_initialized,
        services_with_ingress,
        invalid_writes,
        cloud_writes,
        unattributed_cloud_writes,
        inventory,
        apiserver,
        judged_from,
        from,
    } = outcome;
    // The old side by its kind: kube-controller-manager (ours playing it, or the real one) or upstream's
    // Go cloud-controller-manager.
    let old_side = match from["kind"].as_str() {
        Some("go-cloud-controller-manager") => "upstream's Go cloud-controller-manager",
        _ => KUBE_CONTROLLER_MANAGER,
    };
    let side_name = |side: Side| match side {
        Side::Kcm => old_side,
        Side::Ccm => CLOUD_CONTROLLER_MANAGER,
    };
    let ends_with = migration_lease_ends_with.map(side_name);
    let handoffs: Vec<serde_json::Value> = report
        .handoffs
        .iter()
        .map(|h| {
            json!({
                "lease": h.lease,
                "from": names.name(&h.from),
                "to": names.name(&h.to),
                "gap_ms": (h.gap_ms * 10.0).round() / 10.0,
                "released": h.released,
            })
        })
        .collect();
    let verdict = if outcome.ok() { "ok" } else { "fail" };
    if args.output == "json" {
        let result = json!({
            "verdict": verdict,
            "mode": if *rollback { "rollback" } else { "migration" },
            "apiserver": apiserver,
            "from": from,
            "judged_from": judged_from,
            "migration_lease_ends_with": ends_with,
            "overlaps": report.overlaps.len(),
            "overlap_list": report.overlaps,
            "handoffs": handoffs,
            "nodes_initialized": nodes_initialized,
            "services_with_ingress": services_with_ingress,
            "writes_checked": report.writes_checked,
            "invalid_writes": invalid_writes,
            "cloud": args.cloud,
            "cloud_writes_checked": cloud_writes,
            "unattributed_cloud_writes": unattributed_cloud_writes,
            "cloud_at_end": {
                "instances": inventory.instances,
                "routes": inventory.routes,
                "load_balancers": inventory.load_balancers.iter().map(|lb| json!({
                    "name": lb.name,
                    "address": lb.address,
                    "backends": lb.backends,
                })).collect::<Vec<_>>(),
            },
        });
        println!("{}", serde_json::to_string_pretty(&result).unwrap_or_default());
        return;
    }
    timeline.say(&format!("every replica stopped; auditing {judged_from}"));
    println!();
    println!("hand-offs (gap: the old holder's last write to the new holder's acquisition):");
    for h in &report.handoffs {
        println!(
            "  {:<36} {:>6} → {:<6} {:>8.1} ms  {}",
            h.lease,
            names.name(&h.from),
            names.name(&h.to),
            h.gap_ms,
            if h.released { "released" } else { "expired" }
        );
    }
    println!();
    println!(
        "overlaps: {} in {} controller write(s) checked ({cloud_writes} of them changes to the {} cloud)",
        report.overlaps.len(),
        report.writes_checked,
        args.cloud
    );
    for overlap in &report.overlaps {
        println!("  {overlap:?}");
    }
    println!(
        "migration lease taken over by a cloud-controller-manager: {}",
        if *migrated { "yes" } else { "no" }
    );
    println!(
        "migration lease held at the end by: {} (expected: {})",
        ends_with.unwrap_or("nobody"),
        if *rollback {
            old_side
        } else {
            CLOUD_CONTROLLER_MANAGER
        }
    );
    println!(
        "nodes initialised: {nodes_initialized}/{} · services with a load balancer: {services_with_ingress}/{}",
        registered.nodes, registered.services
    );
    println!("writes the API server refused as invalid: {invalid_writes}");
    println!(
        "cloud changes that named no controller (cannot be judged): {}",
        unattributed_cloud_writes.len()
    );
    for operation in unattributed_cloud_writes {
        println!("  {operation}");
    }
    println!();
    println!("in the {} cloud at the end:", args.cloud);
    for line in super::cloud::describe(inventory) {
        println!("  {line}");
    }
    println!(
        "load balancers: {} for {} LoadBalancer service(s)",
        inventory.load_balancers.len(),
        registered.services
    );
    println!("verdict: {verdict}");
}
