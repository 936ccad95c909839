//! `docs/migration-guide.md`, run: every `sh` block of the guide, in its stage of a real migration of this
//! binary's replicas on the test API server (RBAC and TLS on, as kubectl expects), each command's exit code
//! checked (0, or the `# exits N` written after it).
//!
//! Each block is preceded by `<!-- test: STAGE -->`; the test plays the cluster's side between stages
//! (replicas joining and leaving, the managers' mirror pods), runs the blocks of the stage in a working
//! directory holding `examples/` and `deploy/`, with `cloud-controller-manager` and `kubectl` on `PATH`,
//! `KUBECONFIG` an administrator's, and the control-plane node's kubeconfig paths mapped to the managers'
//! identities.

use std::path::Path;
use std::process::Command;

use control_plane::{Backend, UserInfo};
use kube::api::{Api, PostParams};
use serde_json::json;

use crate::deploy::kubeconfig_for;
use crate::migration::Plane;
use crate::migration_status::{Stages, wait_for_holder};
use crate::support::repo_root;

const GUIDE: &str = "docs/migration-guide.md";
const STAGES: [&str; 6] = [
    "before",
    "mid-roll",
    "after",
    "rollback",
    "troubleshooting",
    "done",
];
const CCM: &str = "cloud-controller-manager";
const MIGRATION: &str = "cloud-provider-extraction-migration";

/// One `sh` block: its stage, its first line in the guide, its text.
#[derive(Debug)]
struct Block {
    stage: String,
    line: usize,
    text: String,
}

/// Every `sh` block of the guide; each must name its stage.
fn blocks(guide: &str) -> Vec<Block> {
    let lines: Vec<&str> = guide.lines().collect();
    let mut found = Vec::new();
    let mut index = 0;
    while index < lines.len() {
        if lines[index].trim() != "```sh" {
            index += 1;
            continue;
        }
        let marker = lines[..index]
            .iter()
            .rev()
            .find(|l| !l.trim().is_empty())
            .and_then(|l| l.trim().strip_prefix("<!-- test: "))
            .and_then(|l| l.strip_suffix(" -->"))
            .unwrap_or_else(|| {
                panic!(
                    "{GUIDE}:{}: an sh block without `<!-- test: STAGE -->` before it",
                    index + 1
                )
            });
        assert!(
            STAGES.contains(&marker),
            "{GUIDE}:{}: unknown stage {marker:?}",
            index + 1
        );
        let start = index + 1;
        let end = start
            + lines[start..]
                .iter()
                .position(|l| l.trim() == "```")
                .expect("a closed block");
        found.push(Block {
            stage: marker.to_owned(),
            line: start + 1,
            text: lines[start..end].join("\n"),
        });
        index = end + 1;
    }
    found
}

/// `text` quoted for bash (single quotes).
fn quoted(text: &str) -> String {
    format!("'{}'", text.replace('\'', r"'\''"))
}

/// The block as a bash script: stop at the first unexpected exit code; a command ending in `# exits N`
/// must exit N, and with `# exits N: TEXT` print TEXT too.
fn script(block: &Block) -> String {
    let mut script = String::from("set -euo pipefail\n");
    let mut command = String::new();
    for line in block.text.lines() {
        if let Some(continued) = line.strip_suffix('\\') {
            command.push_str(continued);
            continue;
        }
        command.push_str(line);
        match command.rsplit_once("# exits ") {
            None => {
                script.push_str(&command);
                script.push('\n');
            }
            Some((body, expectation)) => {
                let body = body.trim_end();
                let (code, text) = expectation.split_once(':').unwrap_or((expectation, ""));
                let code: i32 = code.trim().parse().expect("`# exits N`");
                let (shown, text) = (quoted(body), quoted(text.trim()));
                script.push_str(&format!(
                    r#"if out=$({body} 2>&1); then rc=0; else rc=$?; fi; printf '%s\n' "$out"; [ "$rc" -eq {code} ] || {{ echo "expected exit {code}, got $rc: "{shown} >&2; exit 99; }}; grep -qF -- {text} <<<"$out" || {{ echo "expected the output to contain "{text}": "{shown} >&2; exit 98; }}"#
                ));
                script.push('\n');
            }
        }
        command.clear();
    }
    script
}

#[test]
fn every_sh_block_names_a_stage_and_expected_failures_are_checked() {
    let guide = std::fs::read_to_string(repo_root().join(GUIDE)).unwrap();
    let blocks = blocks(&guide);
    for stage in STAGES {
        assert!(
            blocks.iter().any(|b| b.stage == stage),
            "no block for stage {stage}"
        );
    }
    // The expectations are enforced: scripts of commands that meet them, and of commands that do not.
    let run = |text: &str| {
        let block = Block {
            stage: "before".into(),
            line: 1,
            text: text.into(),
        };
        Command::new("bash")
            .arg("-c")
            .arg(script(&block))
            .output()
            .unwrap()
            .status
            .code()
    };
    assert_eq!(
        run("true --x \\\n    --y\nsh -c 'echo no such thing; exit 1'   # exits 1: no such"),
        Some(0)
    );
    assert_eq!(run("false\ntrue"), Some(1), "an unmarked failure stops the block");
    assert_eq!(
        run("true   # exits 1"),
        Some(99),
        "a command that should fail but does not"
    );
    assert_eq!(
        run("sh -c 'echo other; exit 1'   # exits 1: no such"),
        Some(98),
        "the wrong message"
    );
}

/// Runs the guide's blocks of `stage` in `work`, each bounded (five minutes).
async fn run_stage(
    blocks: &[Block],
    stage: &str,
    work: &Path,
    env: &[(&str, String)],
    replacements: &[(&str, String)],
) {
    for block in blocks.iter().filter(|b| b.stage == stage) {
        let mut text = script(block);
        for (from, to) in replacements {
            text = text.replace(from, to);
        }
        let mut command = Command::new("timeout");
        command
            .args(["300", "bash", "-c", &text])
            .current_dir(work)
            .env_remove("KUBERNETES_SERVICE_HOST");
        for (key, value) in env {
            command.env(key, value);
        }
        let output = tokio::task::spawn_blocking(move || command.output().expect("run bash"))
            .await
            .unwrap();
        assert!(
            output.status.success(),
            "{GUIDE}:{} ({stage}) failed with {}:\n{}\n--- stdout\n{}\n--- stderr\n{}",
            block.line,
            output.status,
            block.text,
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
    }
}

async fn the_migration_guide_runs_as_written(backend: Backend) {
    let guide = std::fs::read_to_string(repo_root().join(GUIDE)).unwrap();
    let blocks = blocks(&guide);
    let plane = Plane::start_secure(backend).await;
    let work = tempfile::tempdir().unwrap();
    for shared in ["examples", "deploy"] {
        std::os::unix::fs::symlink(repo_root().join(shared), work.path().join(shared)).unwrap();
    }
    let bin = work.path().join("bin");
    std::fs::create_dir(&bin).unwrap();
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_cloud-controller-manager"), bin.join(CCM)).unwrap();
    let ccm_kubeconfig = kubeconfig_for(
        &plane.server,
        work.path(),
        "ccm.kubeconfig",
        UserInfo {
            name: "system:cloud-controller-manager".into(),
            groups: vec!["system:authenticated".into()],
        },
    )
    .await;
    let env = [
        (
            "PATH",
            format!("{}:{}", bin.display(), std::env::var("PATH").unwrap_or_default()),
        ),
        ("KUBECONFIG", plane.server.kubeconfig_path().display().to_string()),
    ];
    // The node's kubeconfig path, and the guide's generous waits shortened for a test.
    let replacements = [
        (
            "/etc/kubernetes/cloud-controller-manager.conf",
            ccm_kubeconfig.display().to_string(),
        ),
        ("--timeout 10m", "--timeout 60s".to_owned()),
        ("--timeout 2m", "--timeout 60s".to_owned()),
    ];
    let run = |stage: &'static str| run_stage(&blocks, stage, work.path(), &env, &replacements);

    // Version N: kube-controller-manager with its in-tree provider and Leader Migration, and a node.
    let mut stages = Stages::before(&plane).await;
    run("before").await;

    // An N+1 node: cloud-controller-manager joins.
    stages.mid_roll().await;
    run("mid-roll").await;

    // The last N node goes; kube-controller-manager N+1 runs with an external provider.
    stages.after().await;
    run("after").await;
    let svg = std::fs::read_to_string(work.path().join("migration.svg")).unwrap();
    assert!(
        svg.contains(r#"class="tenure""#) && svg.contains("Completed=True"),
        "{svg}"
    );
    let status: serde_json::Value =
        serde_json::from_slice(&std::fs::read(work.path().join("status.json")).unwrap()).unwrap();
    assert!(
        status["conditions"]
            .as_array()
            .unwrap()
            .iter()
            .any(|c| c["type"] == "Completed" && c["status"] == "True"),
        "{status:#}"
    );

    // Rollback: an N node comes back, the N+1 one goes.
    stages.rollback().await;
    run("rollback").await;
    wait_for_holder(
        &plane,
        MIGRATION,
        &stages.back_id,
        "kcm-2 to hold the migration lock",
    )
    .await;

    run("troubleshooting").await;
    assert!(work.path().join("stale.yaml").exists());

    run("done").await;
    // The migration RBAC is gone: cloud-controller-manager may no longer touch the migration Lease
    // (kube-controller-manager's bootstrap Role still covers every Lease in kube-system).
    let review: k8s_openapi::api::authorization::v1::SubjectAccessReview = serde_json::from_value(json!({
        "spec": {
            "user": "system:cloud-controller-manager",
            "resourceAttributes": {"namespace": "kube-system", "verb": "update", "group": "coordination.k8s.io", "resource": "leases", "name": MIGRATION},
        },
    }))
    .unwrap();
    let decided = Api::all(plane.server.client())
        .create(&PostParams::default(), &review)
        .await
        .unwrap();
    assert_eq!(decided.status.map(|s| s.allowed), Some(false));
    stages.stop();
}

control_plane::on_both_backends!(the_migration_guide_runs_as_written);
