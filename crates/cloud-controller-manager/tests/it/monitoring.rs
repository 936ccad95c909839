//! The shipped monitoring (`deploy/monitoring/`), checked by Prometheus's own `promtool` against live
//! managers: the alerting rules load and their unit tests pass, two replicas mid-migration expose metrics
//! `promtool check metrics` accepts, and every dashboard query parses and names only metrics they expose.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use harness::{Replica, Side, Workload, has_ingress, initialized};
use k8s_openapi::api::core::v1::{Node, Service};
use kube::api::Api;
use serde_json::Value;
use tokio::time::Instant;

use crate::deploy::{find, render};
use crate::migration::Plane;
use crate::support::{curl, free_port, repo_root};

const WAIT: Duration = Duration::from_secs(30);

/// `promtool`, or `None` after saying loudly that the test is skipped.
#[allow(clippy::print_stderr)]
fn promtool() -> Option<&'static str> {
    let found = Command::new("promtool")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !found {
        harness::skip_unless_ci(
            "a test with promtool",
            "promtool is not on PATH (Debian package `prometheus`; `cargo xtask test` installs it where apt-get may run)",
        );
    }
    found.then_some("promtool")
}

/// Runs `promtool ARGS` in `dir` with `input` on stdin; its output, or a panic with it.
fn run_promtool(dir: &Path, args: &[&str], input: &str) -> String {
    let mut child = Command::new("promtool")
        .args(args)
        .current_dir(dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool starts");
    std::io::Write::write_all(&mut child.stdin.take().unwrap(), input.as_bytes()).unwrap();
    let output = child.wait_with_output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(output.status.success(), "promtool {args:?} failed:\n{text}");
    text
}

/// A file of `deploy/monitoring/`.
fn shipped(file: &str) -> String {
    let path = repo_root().join("deploy/monitoring").join(file);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The PrometheusRule's `spec`: a Prometheus rule file.
fn rule_file() -> Value {
    let rule: Value = serde_saphyr::from_str(&shipped("prometheusrule.yaml")).unwrap();
    rule["spec"].clone()
}

#[test]
fn the_monitoring_kustomization_scrapes_the_shipped_managers() {
    let objects = render("deploy/monitoring");
    let service = find(&objects, "Service", "cloud-controller-manager-metrics");
    let monitor = find(&objects, "ServiceMonitor", "cloud-controller-manager");
    find(&objects, "PrometheusRule", "cloud-controller-manager");
    let dashboard = find(&objects, "ConfigMap", "cloud-controller-manager-dashboard");
    assert_eq!(dashboard["metadata"]["labels"]["grafana_dashboard"], "1");
    assert_eq!(
        dashboard["data"]["cloud-controller-manager.json"].as_str(),
        Some(shipped("dashboard.json").as_str())
    );
    // The Service selects the Deployment's pods on the port they serve, and the monitor that Service.
    let base = render("deploy/base");
    let pod = &find(&base, "Deployment", "cloud-controller-manager")["spec"]["template"];
    let labels = pod["metadata"]["labels"].as_object().unwrap();
    for (key, value) in service["spec"]["selector"].as_object().unwrap() {
        assert_eq!(labels.get(key), Some(value), "the Service selects {key}={value}");
    }
    let args: Vec<&str> = pod["spec"]["containers"][0]["args"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    let port = service["spec"]["ports"][0]["port"].as_u64().unwrap();
    assert!(
        args.contains(&format!("--secure-port={port}").as_str()),
        "{args:?}"
    );
    for (key, value) in monitor["spec"]["selector"]["matchLabels"].as_object().unwrap() {
        assert_eq!(&service["metadata"]["labels"][key], value);
    }
    assert_eq!(
        monitor["spec"]["endpoints"][0]["port"],
        service["spec"]["ports"][0]["name"]
    );
    assert_eq!(monitor["spec"]["endpoints"][0]["scheme"], "https");
}

#[test]
fn the_shipped_alerts_load_and_pass_their_unit_tests() {
    if promtool().is_none() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let spec = rule_file();
    let alerts: Vec<&str> = spec["groups"][0]["rules"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|r| r["alert"].as_str())
        .collect();
    std::fs::write(
        dir.path().join("full.yaml"),
        serde_saphyr::to_string(&spec).unwrap(),
    )
    .unwrap();
    let checked = run_promtool(dir.path(), &["check", "rules", "full.yaml"], "");
    assert!(
        checked.contains(&format!("SUCCESS: {} rules found", alerts.len())),
        "{checked}"
    );

    // The unit tests judge the expressions; the annotations' wording is left out (see tests/alerts.yaml).
    let mut bare = spec.clone();
    for rule in bare["groups"][0]["rules"].as_array_mut().unwrap() {
        rule.as_object_mut().unwrap().remove("annotations");
    }
    std::fs::write(
        dir.path().join("rules.yaml"),
        serde_saphyr::to_string(&bare).unwrap(),
    )
    .unwrap();
    let tests = shipped("tests/alerts.yaml");
    std::fs::write(dir.path().join("alerts.yaml"), &tests).unwrap();
    run_promtool(dir.path(), &["test", "rules", "alerts.yaml"], "");
    // Every alert is exercised, firing at least once.
    let tested: Value = serde_saphyr::from_str(&tests).unwrap();
    let fired: BTreeSet<&str> = tested["tests"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|t| t["alert_rule_test"].as_array().unwrap())
        .filter(|case| case["exp_alerts"].as_array().is_some_and(|a| !a.is_empty()))
        .filter_map(|case| case["alertname"].as_str())
        .collect();
    for alert in alerts {
        assert!(fired.contains(alert), "no unit test sees {alert} fire");
    }
}

/// Names a PromQL expression selects: metric names, and the `__name__=~"…"` patterns.
fn selected_names(expr: &str) -> (BTreeSet<String>, Vec<String>) {
    const AGGREGATIONS: [&str; 12] = [
        "sum",
        "min",
        "max",
        "avg",
        "count",
        "stddev",
        "stdvar",
        "topk",
        "bottomk",
        "quantile",
        "count_values",
        "group",
    ];
    const LABEL_LISTS: [&str; 6] = ["by", "without", "on", "ignoring", "group_left", "group_right"];
    const KEYWORDS: [&str; 5] = ["and", "or", "unless", "bool", "offset"];
    let chars: Vec<char> = expr.chars().collect();
    let (mut names, mut patterns) = (BTreeSet::new(), Vec::new());
    let mut i = 0;
    // Skips from an opening bracket to its match, returning what was inside.
    let skip = |i: &mut usize, open: char, close: char| -> String {
        let start = *i + 1;
        let mut depth = 0;
        while *i < chars.len() {
            let c = chars[*i];
            if c == '"' {
                *i += 1;
                while chars[*i] != '"' {
                    *i += if chars[*i] == '\\' { 2 } else { 1 };
                }
            } else if c == open {
                depth += 1;
            } else if c == close {
                depth -= 1;
                if depth == 0 {
                    break;
                }
            }
            *i += 1;
        }
        *i += 1;
        chars[start..*i - 1].iter().collect()
    };
    while i < chars.len() {
        let c = chars[i];
        if c == '{' {
            let matchers = skip(&mut i, '{', '}');
            if let Some((_, rest)) = matchers.split_once("__name__=~\"") {
                patterns.push(rest.split('"').next().unwrap().to_owned());
            }
        } else if c == '[' {
            skip(&mut i, '[', ']');
        } else if c == '"' {
            i += 1;
            while chars[i] != '"' {
                i += 1;
            }
            i += 1;
        } else if c.is_ascii_digit() {
            while i < chars.len() && (chars[i].is_ascii_alphanumeric() || chars[i] == '.') {
                i += 1;
            }
        } else if c.is_ascii_alphabetic() || c == '_' || c == ':' {
            let start = i;
            while i < chars.len() && (chars[i].is_ascii_alphanumeric() || chars[i] == '_' || chars[i] == ':')
            {
                i += 1;
            }
            let word: String = chars[start..i].iter().collect();
            let next = chars[i..].iter().find(|c| !c.is_whitespace()).copied();
            if LABEL_LISTS.contains(&word.as_str()) {
                while chars[i] != '(' {
                    i += 1;
                }
                skip(&mut i, '(', ')');
            } else if !(next == Some('(')
                || AGGREGATIONS.contains(&word.as_str())
                || KEYWORDS.contains(&word.as_str()))
            {
                names.insert(word);
            }
        } else {
            i += 1;
        }
    }
    (names, patterns)
}

/// Whether `name` matches `pattern`, a regular expression whose only metacharacters are `.+` (what the
/// dashboard uses; anything else fails the test rather than being misjudged).
fn matches(pattern: &str, name: &str) -> bool {
    let parts: Vec<&str> = pattern.split(".+").collect();
    assert!(
        parts
            .iter()
            .all(|p| !p.contains(['.', '*', '+', '?', '(', '[', '|', '^', '$', '\\'])),
        "the dashboard's pattern {pattern} uses more than .+; teach this test"
    );
    let (first, last) = (parts[0], parts[parts.len() - 1]);
    name.len() > first.len() + last.len()
        && name.starts_with(first)
        && name.ends_with(last)
        && parts[1..parts.len() - 1]
            .iter()
            .all(|middle| name.contains(middle))
}

/// The sample names an exposition (classic text format) can carry, from its `# TYPE` lines, so that a
/// family without samples yet counts: `_bucket`, `_sum` and `_count` for histograms.
fn exposed(exposition: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for line in exposition.lines() {
        let Some(rest) = line.strip_prefix("# TYPE ") else {
            continue;
        };
        let (name, kind) = rest.split_once(' ').unwrap();
        match kind {
            "histogram" => {
                for suffix in ["_bucket", "_sum", "_count"] {
                    names.insert(format!("{name}{suffix}"));
                }
                true
            }
            _ => names.insert(name.to_owned()),
        };
    }
    names
}

#[test]
fn promql_names_are_found_as_prometheus_reads_them() {
    let (names, patterns) = selected_names(
        r#"histogram_quantile(0.99, sum by (request, le) (rate({__name__=~"cloudprovider_.+_api_request_duration_seconds_bucket",job=~"$job"}[5m]))) / on (job) group_left max without (instance) (up{job="a"}) and bool x_total offset 5m"#,
    );
    assert_eq!(names, BTreeSet::from(["up".to_owned(), "x_total".to_owned()]));
    assert_eq!(patterns, ["cloudprovider_.+_api_request_duration_seconds_bucket"]);
    assert!(matches("cloudprovider_.+_api_x", "cloudprovider_aws_api_x"));
    assert!(!matches("cloudprovider_.+_api_x", "cloudprovider_api_x"));
}

/// `GET /metrics` of the replica serving on `port` (anonymous: the test lets anyone read it).
fn scrape(port: u16) -> String {
    let address: SocketAddr = ([127, 0, 0, 1], port).into();
    match curl(address, None, "/metrics", &[]) {
        Some((200, body)) => body,
        other => panic!("GET /metrics on {port}: {other:?}"),
    }
}

async fn live_managers_expose_what_the_dashboard_and_alerts_read(backend: control_plane::Backend) {
    if promtool().is_none() {
        return;
    }
    let plane = Plane::start(backend).await;
    let (server, environment) = (&plane.server, &plane.environment);
    // Mid-migration: kube-controller-manager (N) holds the migration Lease, cloud-controller-manager (N+1)
    // its own; between them every controller runs.
    let ports = [free_port(), free_port()];
    let serving = |port: u16| {
        [
            format!("--secure-port={port}"),
            "--bind-address=127.0.0.1".to_owned(),
            "--authorization-always-allow-paths=/healthz,/readyz,/livez,/metrics".to_owned(),
            "--authentication-skip-lookup".to_owned(),
        ]
    };
    let kcm_flags = serving(ports[0]);
    let ccm_flags = serving(ports[1]);
    fn as_str(flags: &[String]) -> Vec<&str> {
        flags.iter().map(String::as_str).collect()
    }
    let mut kcm = Replica::start_with(environment, "kcm", Side::Kcm, &as_str(&kcm_flags)).unwrap();
    kcm.identity(WAIT).unwrap();
    let mut ccm = Replica::start_with(environment, "ccm", Side::Ccm, &as_str(&ccm_flags)).unwrap();
    ccm.identity(WAIT).unwrap();
    let workload = Workload::new(server.client(), plane.cloud.url());
    workload.add_node(0).await.unwrap();
    workload.add_service(0).await.unwrap();
    let nodes: Api<Node> = Api::all(server.client());
    let services: Api<Service> = Api::namespaced(server.client(), "default");
    let deadline = Instant::now() + WAIT;
    loop {
        let node_done = nodes
            .list(&Default::default())
            .await
            .unwrap()
            .items
            .iter()
            .all(initialized);
        let service_done = services
            .get_opt("web-0")
            .await
            .unwrap()
            .is_some_and(|s| has_ingress(&s));
        let expositions = [scrape(ports[0]), scrape(ports[1])];
        // The node's initialisation and the load balancer are done, and the node-count gauge has run.
        let led = expositions
            .iter()
            .any(|e| e.contains("leader_election_master_status{name=\"cloud-controller-manager\"} 1"));
        if node_done && service_done && led {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no initialised node and load balancer within {WAIT:?}:\n{}\n{}",
            kcm.log_tail(),
            ccm.log_tail()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    let promtool_dir = tempfile::tempdir().unwrap();
    let mut names = BTreeSet::new();
    for (port, replica) in ports
        .iter()
        .zip(["kube-controller-manager", "cloud-controller-manager"])
    {
        let exposition = scrape(*port);
        // Prometheus's linter: names, suffixes, help, types.
        let linted = run_promtool(promtool_dir.path(), &["check", "metrics"], &exposition);
        assert!(!linted.contains("error"), "{replica}: {linted}");
        for family in [
            "leader_election_master_status{name=\"cloud-provider-extraction-migration\"}",
            "# TYPE leader_election_holder_changes_total counter",
            "# TYPE leader_election_lost_total counter",
            "# TYPE workqueue_depth gauge",
            "# TYPE cloudprovider_fake_api_request_duration_seconds histogram",
            "# TYPE cloudprovider_fake_api_request_errors_total counter",
            "# TYPE node_controller_oldest_uninitialized_node_age_seconds gauge",
            "rest_client_requests_total{",
            "kubernetes_build_info{",
            "kubernetes_feature_enabled{name=\"LoggingAlphaOptions\",stage=\"ALPHA\"} 0",
            "process_resident_memory_bytes ",
        ] {
            assert!(
                exposition.contains(family),
                "{replica}: {family} missing from\n{exposition}"
            );
        }
        names.extend(exposed(&exposition));
    }
    // OpenMetrics to a scraper that asks for it (Prometheus does).
    let address: SocketAddr = ([127, 0, 0, 1], ports[1]).into();
    let open_metrics = curl(
        address,
        None,
        "/metrics",
        &["--header", "Accept: application/openmetrics-text; version=1.0.0"],
    );
    let (_, open_metrics) = open_metrics.unwrap();
    assert!(
        open_metrics.contains("# TYPE leader_election_lost counter") && open_metrics.ends_with("# EOF\n"),
        "{open_metrics}"
    );

    // The dashboard: every query parses (as recording rules, by promtool) and selects exposed metrics only.
    let dashboard: Value = serde_json::from_str(&shipped("dashboard.json")).unwrap();
    let exprs: Vec<String> = dashboard["panels"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|panel| panel["targets"].as_array().cloned().unwrap_or_default())
        .map(|target| target["expr"].as_str().unwrap().to_owned())
        .collect();
    assert!(exprs.len() >= 20, "{} queries", exprs.len());
    let grafana = |expr: &str| expr.replace("$__rate_interval", "5m").replace("$job", ".+");
    let rules = serde_json::json!({"groups": [{"name": "dashboard", "rules": exprs
        .iter()
        .enumerate()
        .map(|(i, expr)| serde_json::json!({"record": format!("dashboard:query_{i}"), "expr": grafana(expr)}))
        .collect::<Vec<_>>()}]});
    std::fs::write(
        promtool_dir.path().join("dashboard.yaml"),
        serde_saphyr::to_string(&rules).unwrap(),
    )
    .unwrap();
    run_promtool(promtool_dir.path(), &["check", "rules", "dashboard.yaml"], "");
    // And the alerts read exposed metrics too (`up` is Prometheus's own).
    let alert_exprs: Vec<String> = rule_file()["groups"][0]["rules"]
        .as_array()
        .unwrap()
        .iter()
        .map(|rule| rule["expr"].as_str().unwrap().to_owned())
        .collect();
    names.insert("up".to_owned());
    for expr in exprs.iter().chain(&alert_exprs) {
        let (selected, patterns) = selected_names(&grafana(expr));
        assert!(
            !selected.is_empty() || !patterns.is_empty(),
            "{expr} selects nothing"
        );
        for name in selected {
            assert!(
                names.contains(&name),
                "{expr}: {name} is not exposed by the managers"
            );
        }
        for pattern in patterns {
            assert!(
                names.iter().any(|name| matches(&pattern, name)),
                "{expr}: nothing exposed matches {pattern}"
            );
        }
    }
    assert!(kcm.terminate().is_ok() && ccm.terminate().is_ok());
}

control_plane::on_both_backends!(live_managers_expose_what_the_dashboard_and_alerts_read);
