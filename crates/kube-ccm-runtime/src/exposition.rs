//! What `/metrics` serves beyond the registry's own encoding: the classic text format, and the metric
//! reference `docs/operations.md` holds.

use std::collections::BTreeSet;
use std::time::Duration;

use kube_ccm_provider::{CallObserver, CloudError};

use crate::metrics::{ControllerLabels, LeaseLabels, Metrics};

impl Metrics {
    /// Every metric, in Prometheus's classic text format (0.0.4), as Go components serve it: a counter's
    /// `# HELP` and `# TYPE` name it with its `_total` suffix, and there is no `# EOF`.
    pub fn encode_text(&self) -> String {
        classic_text(&self.encode())
    }

    /// The exposition for a scraper whose `Accept` header is `accept`, and its content type: as
    /// client_golang's handler, the classic text format, and OpenMetrics to a scraper that asks for it.
    pub fn exposition(&self, accept: &str) -> (&'static str, String) {
        if accept.contains("application/openmetrics-text") {
            (
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
                self.encode(),
            )
        } else {
            ("text/plain; version=0.0.4; charset=utf-8", self.encode_text())
        }
    }
}

/// The reference of every family this framework exposes, as a Markdown table (metric, type, labels, help),
/// generated from the registry itself: `docs/operations.md` holds it, and a test keeps the two equal.
/// `cloudprovider_<provider>_…` stands for the provider's name.
pub fn metric_reference() -> String {
    const PROVIDER: &str = "provider_name_placeholder";
    let metrics = Metrics::new();
    metrics.set_provider(PROVIDER);
    metrics.set_budget(std::sync::Arc::new(kube_ccm_provider::RateBudget::new(0.0, 1)));
    // One series in each labelled family, so that its labels show.
    let lease = LeaseLabels { name: String::new() };
    metrics.leader_election_master_status.get_or_create(&lease).set(0);
    metrics.leader_holder_changes.get_or_create(&lease).inc_by(0);
    metrics.leader_lost.get_or_create(&lease).inc_by(0);
    metrics
        .running_managed_controllers
        .get_or_create(&ControllerLabels {
            name: String::new(),
            manager: String::new(),
        })
        .set(0);
    metrics.reconciled("", false, 0.0);
    metrics.set_build_info(&crate::BuildInfo::default());
    metrics.set_feature("", "", false);
    metrics.api_request("", "", "", 0.0);
    metrics.rate_limited("", "", 0.0);
    metrics.webhook_request("", 0, Duration::ZERO);
    metrics
        .cloud
        .observe("", Duration::ZERO, Err(&CloudError::Timeout));
    let queue = metrics.work_queue("");
    queue.add_after("", Duration::ZERO, true);
    drop(queue.start(Some("")));
    let mut families: Vec<(String, String, String, BTreeSet<String>)> = Vec::new();
    for line in metrics.encode_text().lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let (name, help) = rest.split_once(' ').unwrap_or((rest, ""));
            families.push((name.to_owned(), String::new(), help.to_owned(), BTreeSet::new()));
        } else if let Some(rest) = line.strip_prefix("# TYPE ") {
            if let Some(family) = families.last_mut() {
                family.1 = rest.split_once(' ').map_or("", |(_, kind)| kind).to_owned();
            }
        } else if let (Some(family), Some((_, labels))) = (families.last_mut(), line.split_once('{')) {
            for pair in labels.split(',') {
                if let Some((label, _)) = pair.split_once('=')
                    && label != "le"
                {
                    family.3.insert(label.to_owned());
                }
            }
        }
    }
    families.sort();
    let mut table = String::from("| Metric | Type | Labels | Help |\n|---|---|---|---|\n");
    for (name, kind, help, labels) in families {
        let labels: Vec<String> = labels.iter().map(|l| format!("`{l}`")).collect();
        table.push_str(&format!(
            "| `{}` | {kind} | {} | {} |\n",
            name.replace(PROVIDER, "<provider>"),
            labels.join(", "),
            help.replace('|', "\\|")
        ));
    }
    table
}

/// OpenMetrics text → the classic text format: the two differ, for what this registry writes, only in the
/// name counters' metadata carries and the end marker.
pub(crate) fn classic_text(open_metrics: &str) -> String {
    let mut text = String::with_capacity(open_metrics.len());
    // A family's `# HELP` comes before its `# TYPE`, which tells whether its name needs `_total`.
    let mut help: Option<&str> = None;
    for line in open_metrics.lines() {
        if line == "# EOF" || line.starts_with("# UNIT ") {
            continue;
        }
        if line.starts_with("# HELP ") {
            if let Some(pending) = help.replace(line) {
                text.push_str(pending);
                text.push('\n');
            }
            continue;
        }
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap_or((rest, ""));
            let classic = if kind == "counter" && !name.ends_with("_total") {
                format!("{name}_total")
            } else {
                name.to_owned()
            };
            if let Some(pending) = help.take() {
                let description = pending
                    .strip_prefix("# HELP ")
                    .and_then(|h| h.strip_prefix(name))
                    .unwrap_or_default();
                text.push_str(&format!("# HELP {classic}{description}\n"));
            }
            text.push_str(&format!("# TYPE {classic} {kind}\n"));
            continue;
        }
        if let Some(pending) = help.take() {
            text.push_str(pending);
            text.push('\n');
        }
        text.push_str(line);
        text.push('\n');
    }
    text
}
