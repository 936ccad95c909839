//! The Helm chart (`charts/cloud-controller-manager`), with the real `helm` (`cargo xtask kube` builds it
//! from its Go module): it lints strictly with every example, refuses values that cannot work with one
//! error naming the value, and renders exactly what the kustomize configuration of the same name renders
//! (after the differences the two tools make by design: generated names' hash suffixes, Helm's labels and
//! checksum annotations, and flags left at their defaults).

use std::collections::BTreeMap;
use std::process::{Command, Output};

use control_plane::KubeBinaries;
use serde_json::Value;

use crate::deploy::{render, scratch_kustomization};
use crate::support::{repo_root, stderr, stdout};

const CHART: &str = "charts/cloud-controller-manager";

/// `helm` with a scratch home, never the developer's configuration or cluster; `None` (said loudly) where
/// Go is missing outside CI.
fn helm(test: &str, args: &[&str]) -> Option<Output> {
    let binaries = KubeBinaries::for_test(test)?;
    let home = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let output = Command::new(&binaries.helm)
        .args(args)
        .current_dir(repo_root())
        // Nothing of the developer's (`HELM_NAMESPACE`, `HELM_KUBECONTEXT`, a cluster) reaches it.
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("HOME", home.path())
        .env("KUBECONFIG", "/dev/null")
        .env("HELM_CACHE_HOME", home.path().join("cache"))
        .env("HELM_CONFIG_HOME", home.path().join("config"))
        .env("HELM_DATA_HOME", home.path().join("data"))
        .output()
        .expect("helm runs");
    Some(output)
}

/// `helm template` in kube-system with the example values files `examples` and `--set`s.
fn template(test: &str, examples: &[&str], sets: &[&str]) -> Option<Vec<Value>> {
    let mut args = vec!["template", "ccm", CHART, "-n", "kube-system"];
    let files: Vec<String> = examples
        .iter()
        .map(|e| format!("{CHART}/examples/values-{e}.yaml"))
        .collect();
    for file in &files {
        args.extend(["-f", file]);
    }
    for set in sets {
        args.extend(["--set", set]);
    }
    let output = helm(test, &args)?;
    assert!(output.status.success(), "helm {args:?}:\n{}", stderr(&output));
    Some(serde_saphyr::from_multiple::<Value>(&stdout(&output)).expect("helm renders YAML"))
}

/// The container's flags as the manager reads them: each flag's values in order (a list flag such as
/// `--controllers` adds up), except the two Leader Migration flags, which kustomize's done component
/// overrides by appending: their last value, and absent at their defaults (off, no file).
fn effective_flags(args: &Value) -> BTreeMap<String, Vec<String>> {
    let mut flags: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for arg in args.as_array().into_iter().flatten().filter_map(Value::as_str) {
        let (name, value) = arg.split_once('=').unwrap_or((arg, "true"));
        flags.entry(name.to_owned()).or_default().push(value.to_owned());
    }
    for (name, default) in [
        ("--enable-leader-migration", "false"),
        ("--leader-migration-config", ""),
    ] {
        if let Some(values) = flags.get_mut(name) {
            values.drain(..values.len() - 1);
            if values[0] == default {
                flags.remove(name);
            }
        }
    }
    flags
}

/// Drops what the two tools differ in by design; nulls and empty maps and lists go too.
fn pruned(value: Value) -> Option<Value> {
    match value {
        Value::Null => None,
        Value::Object(map) => {
            let map: serde_json::Map<String, Value> = map
                .into_iter()
                .filter_map(|(k, v)| pruned(v).map(|v| (k, v)))
                .collect();
            (!map.is_empty()).then_some(Value::Object(map))
        }
        Value::Array(items) => {
            let items: Vec<Value> = items.into_iter().filter_map(pruned).collect();
            (!items.is_empty()).then_some(Value::Array(items))
        }
        other => Some(other),
    }
}

/// A kustomize-generated name without its hash suffix (`cloud-config-6d5g6f42dg` → `cloud-config`).
fn unhashed(name: &str) -> String {
    match name.rsplit_once('-') {
        Some((stem, hash))
            if hash.len() == 10
                && hash.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit())
                && ["cloud-config", "leader-migration"].contains(&stem) =>
        {
            stem.to_owned()
        }
        _ => name.to_owned(),
    }
}

/// Objects by kind, namespace and name, each as comparable: Helm's labels and checksums dropped,
/// generated names unhashed, a workload's args as its effective flags.
fn normalised(objects: Vec<Value>) -> BTreeMap<(String, String, String), Value> {
    let mut out = BTreeMap::new();
    for mut object in objects {
        let metadata = &mut object["metadata"];
        metadata["name"] = unhashed(metadata["name"].as_str().unwrap_or_default()).into();
        if let Some(labels) = metadata["labels"].as_object_mut() {
            for helm in [
                "helm.sh/chart",
                "app.kubernetes.io/instance",
                "app.kubernetes.io/managed-by",
                "app.kubernetes.io/version",
            ] {
                labels.remove(helm);
            }
        }
        if object["kind"] == "Deployment" {
            let template = &mut object["spec"]["template"];
            if let Some(annotations) = template["metadata"]["annotations"].as_object_mut() {
                annotations.retain(|k, _| !k.starts_with("checksum/"));
            }
            for volume in template["spec"]["volumes"].as_array_mut().into_iter().flatten() {
                if let Some(name) = volume["configMap"]["name"].as_str() {
                    volume["configMap"]["name"] = unhashed(name).into();
                }
            }
            let container = &mut template["spec"]["containers"][0];
            container["args"] = serde_json::to_value(effective_flags(&container["args"])).unwrap();
        }
        let key = (
            object["kind"].as_str().unwrap_or_default().to_owned(),
            object["metadata"]["namespace"]
                .as_str()
                .unwrap_or_default()
                .to_owned(),
            object["metadata"]["name"].as_str().unwrap_or_default().to_owned(),
        );
        out.insert(key, pruned(object).unwrap_or(Value::Null));
    }
    out
}

/// Fails naming every object one side lacks or renders differently.
fn assert_same(what: &str, chart: Vec<Value>, kustomize: Vec<Value>) {
    let (mut chart, kustomize) = (normalised(chart), normalised(kustomize));
    // The chart labels every object with app.kubernetes.io/name; kustomize only those that select by it.
    for (key, object) in &mut chart {
        let theirs = kustomize
            .get(key)
            .map(|o| &o["metadata"]["labels"]["app.kubernetes.io/name"]);
        if theirs.is_none_or(Value::is_null)
            && let Some(labels) = object["metadata"]["labels"].as_object_mut()
        {
            labels.remove("app.kubernetes.io/name");
            if labels.is_empty() {
                object["metadata"].as_object_mut().unwrap().remove("labels");
            }
        }
    }
    let mut drift = Vec::new();
    for key in chart
        .keys()
        .chain(kustomize.keys())
        .collect::<std::collections::BTreeSet<_>>()
    {
        match (chart.get(key), kustomize.get(key)) {
            (Some(a), Some(b)) if a == b => {}
            (Some(a), Some(b)) => drift.push(format!("{key:?} differs:\n  chart:     {a}\n  kustomize: {b}")),
            (Some(_), None) => drift.push(format!("{key:?} only in the chart")),
            (None, _) => drift.push(format!("{key:?} only in kustomize")),
        }
    }
    assert!(
        drift.is_empty(),
        "{what}: the chart and kustomize drifted:\n{}",
        drift.join("\n")
    );
}

#[test]
fn the_chart_renders_what_kustomize_renders() {
    let test = "the_chart_renders_what_kustomize_renders";
    for provider in ["fake", "aws", "gce"] {
        let Some(chart) = template(test, &[provider], &[]) else {
            return;
        };
        assert_same(provider, chart, render(&format!("deploy/overlays/{provider}")));
    }
    let done = template(test, &["fake", "migration-done"], &[]).unwrap();
    let kustomize = scratch_kustomization(|repo| {
        format!(
            "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n  - {repo}/deploy/overlays/fake\ncomponents:\n  - {repo}/deploy/components/leader-migration-done\n"
        )
    });
    assert_same("migration done", done, kustomize);
    let monitoring = template(
        test,
        &["monitoring"],
        &[
            "cloudProvider=fake",
            "rbac.create=false",
            "serviceAccount.create=false",
        ],
    )
    .unwrap()
    .into_iter()
    .filter(|o| {
        !["Deployment", "ConfigMap"].contains(&o["kind"].as_str().unwrap_or_default())
            || o["metadata"]["name"] == "cloud-controller-manager-dashboard"
    })
    .collect();
    assert_same("monitoring", monitoring, render("deploy/monitoring"));
}

/// The comparison itself fails on a drift: a changed value, a missing object, a flag that differs.
#[test]
fn a_drift_is_named() {
    let test = "a_drift_is_named";
    let Some(chart) = template(test, &["fake"], &["args[3]=--node-monitor-period=7s"]) else {
        return;
    };
    let result = std::panic::catch_unwind(|| assert_same("fake", chart, render("deploy/overlays/fake")));
    let message = result.expect_err("an extra flag is a drift");
    let text = message.downcast_ref::<String>().cloned().unwrap_or_default();
    assert!(
        text.contains("Deployment") && text.contains("--node-monitor-period"),
        "{text}"
    );
    // A selecting label the chart lost (the ServiceMonitor would find no Service).
    let mut unlabelled = render("deploy/monitoring");
    for object in &mut unlabelled {
        if let Some(labels) = object["metadata"]["labels"].as_object_mut() {
            labels.remove("app.kubernetes.io/name");
        }
    }
    let result =
        std::panic::catch_unwind(|| assert_same("monitoring", unlabelled, render("deploy/monitoring")));
    let text = result
        .expect_err("a lost label")
        .downcast_ref::<String>()
        .cloned()
        .unwrap_or_default();
    assert!(text.contains("ServiceMonitor"), "{text}");
    // A list flag given twice is not a list flag given once.
    let twice = template(
        test,
        &["fake"],
        &["args[3]=--controllers=*", "args[4]=--controllers=-route"],
    )
    .unwrap();
    let once = template(test, &["fake"], &["args[3]=--controllers=-route"]).unwrap();
    let result = std::panic::catch_unwind(|| assert_same("controllers", twice, once));
    let text = result
        .expect_err("a list flag")
        .downcast_ref::<String>()
        .cloned()
        .unwrap_or_default();
    assert!(text.contains("--controllers"), "{text}");
    let chart = template(test, &["aws"], &[]).unwrap();
    let result = std::panic::catch_unwind(|| assert_same("gce", chart, render("deploy/overlays/gce")));
    let text = result
        .expect_err("another provider")
        .downcast_ref::<String>()
        .cloned()
        .unwrap_or_default();
    assert!(
        text.contains("only in kustomize") && text.contains("gce-cluster-id"),
        "{text}"
    );
}

#[test]
fn the_chart_lints_strictly_with_every_example() {
    let test = "the_chart_lints_strictly_with_every_example";
    let examples: Vec<String> = std::fs::read_dir(repo_root().join(CHART).join("examples"))
        .unwrap()
        .map(|e| e.unwrap().path().display().to_string())
        .collect();
    assert!(examples.len() >= 5, "{examples:?}");
    for example in &examples {
        // The examples that name no provider are laid over one that does.
        let provider = std::fs::read_to_string(example)
            .unwrap()
            .contains("--cloud-provider=");
        let mut args = vec!["lint", "--strict", CHART, "-f", example];
        if !provider {
            args.extend(["--set", "cloudProvider=fake"]);
        }
        let Some(output) = helm(test, &args) else {
            return;
        };
        let text = format!("{}{}", stdout(&output), stderr(&output));
        assert!(
            output.status.success() && !text.contains("[WARNING]") && !text.contains("[ERROR]"),
            "{example}:\n{text}"
        );
    }
}

#[test]
fn values_that_cannot_work_are_one_error_naming_the_value() {
    let test = "values_that_cannot_work_are_one_error_naming_the_value";
    for (sets, named) in [
        (
            &["cloudProvider=fake", "namespace=other"][..],
            "namespace: \"other\" differs",
        ),
        (
            &["cloudProvider=fake", "kind=StatefulSet"][..],
            "kind: \"StatefulSet\"",
        ),
        (
            &["cloudProvider=fake", "cloudConfig.kind=File"][..],
            "cloudConfig.kind: \"File\"",
        ),
        (&[][..], "cloudProvider: empty"),
        (
            &[
                "cloudProvider=fake",
                "prometheusRule.enabled=true",
                "nameOverride=ccm",
            ][..],
            "nameOverride: \"ccm\" with prometheusRule.enabled",
        ),
        (
            &["cloudProvider=fake", "leaderMigration.configuration=a: ["][..],
            "leaderMigration.configuration: not a LeaderMigrationConfiguration",
        ),
    ] {
        let mut args = vec!["template", "ccm", CHART, "-n", "kube-system"];
        for set in sets {
            args.extend(["--set", set]);
        }
        let Some(output) = helm(test, &args) else {
            return;
        };
        assert!(!output.status.success(), "{sets:?} rendered");
        assert!(stderr(&output).contains(named), "{sets:?}: {}", stderr(&output));
    }
}

#[test]
fn the_charts_files_are_deploys() {
    for (chart, deploy) in [
        ("files/leader-migration.yaml", "deploy/base/leader-migration.yaml"),
        (
            "files/prometheusrule.yaml",
            "deploy/monitoring/prometheusrule.yaml",
        ),
        ("files/dashboard.json", "deploy/monitoring/dashboard.json"),
    ] {
        let root = repo_root();
        let a = std::fs::read(root.join(CHART).join(chart)).unwrap();
        let b = std::fs::read(root.join(deploy)).unwrap();
        assert!(a == b, "{CHART}/{chart} is not a copy of {deploy}: copy it again");
    }
}

/// In another namespace: the workload, its account and configuration move; the Lease Roles, the
/// authentication reader's binding and the GCE provider's Role stay in kube-system, where what they
/// grant lives; every binding names the account where it is.
#[test]
fn another_namespace_moves_the_workload_not_what_lives_in_kube_system() {
    let test = "another_namespace_moves_the_workload_not_what_lives_in_kube_system";
    let gce = format!("{CHART}/examples/values-gce.yaml");
    let Some(output) = helm(test, &["template", "ccm", CHART, "-n", "ccm-system", "-f", &gce]) else {
        return;
    };
    assert!(output.status.success(), "{}", stderr(&output));
    let objects = serde_saphyr::from_multiple::<Value>(&stdout(&output)).unwrap();
    assert!(objects.len() >= 15, "{}", objects.len());
    for object in &objects {
        let (kind, name) = (
            object["kind"].as_str().unwrap(),
            object["metadata"]["name"].as_str().unwrap(),
        );
        let expected = match kind {
            "ClusterRole" | "ClusterRoleBinding" => None,
            "Role" | "RoleBinding" => Some("kube-system"),
            _ => Some("ccm-system"),
        };
        assert_eq!(
            object["metadata"]["namespace"].as_str(),
            expected,
            "{kind} {name}"
        );
        for subject in object["subjects"].as_array().into_iter().flatten() {
            if subject["kind"] == "ServiceAccount" && subject["name"] == "cloud-controller-manager" {
                assert_eq!(subject["namespace"], "ccm-system", "{kind} {name}");
            }
        }
    }
}
