//! `cargo xtask new-provider NAME [--path DIR]`: scaffolds a provider crate that compiles, registers
//! itself, has its own `NAME-cloud-controller-manager` binary (so `dist` and `image` ship it), and a
//! passing test against the test API server, and the conformance suite over a fixture of its cloud.
//!
//! Inside this repository (default `crates/providers/NAME`) the crate joins the workspace. Elsewhere it is
//! its own workspace, as a vendor's: it depends on `kube-ccm` by version, with a `[patch.crates-io]`
//! naming this checkout's crates until they are on crates.io, and this repository's `Cargo.lock` so it
//! builds offline with the same versions.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};

use crate::shell::repo_root;

/// Arguments of `cargo xtask new-provider`.
#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// The provider's name (`--cloud-provider=NAME`): lower-case letters, digits and dashes.
    name: String,
    /// Where to create the crate (default: crates/providers/NAME). It must not exist.
    #[arg(long, value_name = "DIR")]
    path: Option<PathBuf>,
}

const LIB: &str = include_str!("../templates/provider/src/lib.rs.tmpl");
const MAIN: &str = include_str!("../templates/provider/src/main.rs.tmpl");
const TEST: &str = include_str!("../templates/provider/tests/manager.rs.tmpl");
const CONFORMANCE: &str = include_str!("../templates/provider/tests/conformance.rs.tmpl");
const README: &str = include_str!("../templates/provider/README.md.tmpl");

/// The workspace dependencies the crate uses: (name, extra features, dev-only).
/// `kube-ccm` alone brings the framework, and the kube and k8s-openapi of its signatures; `earliest` is
/// the Kubernetes API version the binary speaks.
const DEPENDENCIES: &[(&str, &[&str], bool)] = &[
    ("kube-ccm", &["earliest"], false),
    ("kube-ccm-conformance", &[], true),
    ("serde", &[], false),
    ("serde_json", &[], false),
    ("tempfile", &[], true),
    ("tokio", &[], true),
];

pub(crate) fn run(args: &Args) -> Result<()> {
    let name = &args.name;
    check_name(name)?;
    let root = repo_root();
    let dir = match &args.path {
        Some(path) if path.is_absolute() => path.clone(),
        Some(path) => std::env::current_dir()?.join(path),
        None => root.join("crates/providers").join(name),
    };
    if dir.exists() {
        bail!("{} already exists: choose another NAME or --path", dir.display());
    }
    let inside = dir.starts_with(&root);
    let workspace_toml =
        std::fs::read_to_string(root.join("Cargo.toml")).context("cannot read the workspace's Cargo.toml")?;
    let manifest = manifest(name, &workspace_toml, if inside { None } else { Some(&root) })?;
    let files = [
        ("Cargo.toml", manifest),
        ("README.md", fill(README, name)),
        ("src/lib.rs", fill(LIB, name)),
        ("src/main.rs", fill(MAIN, name)),
        ("tests/manager.rs", fill(TEST, name)),
        ("tests/conformance.rs", fill(CONFORMANCE, name)),
    ];
    // Written to a sibling directory and renamed into place: a failure leaves nothing behind.
    let staging = dir.with_extension("partial");
    if staging.exists() {
        std::fs::remove_dir_all(&staging)?;
    }
    for (file, contents) in &files {
        let path = staging.join(file);
        std::fs::create_dir_all(path.parent().context("a file has a directory")?)?;
        std::fs::write(&path, contents).with_context(|| format!("cannot write {}", path.display()))?;
    }
    if !inside {
        // The lock file, so it builds offline with the same versions; the licence its manifest names.
        for file in ["Cargo.lock", "rustfmt.toml", "LICENSE"] {
            std::fs::copy(root.join(file), staging.join(file))
                .with_context(|| format!("cannot copy {file}"))?;
        }
    }
    std::fs::rename(&staging, &dir).with_context(|| format!("cannot create {}", dir.display()))?;
    if inside {
        let member = dir.strip_prefix(&root)?.to_string_lossy().into_owned();
        let updated = add_member(&workspace_toml, &member)?;
        std::fs::write(root.join("Cargo.toml"), updated)
            .context("cannot update the workspace's Cargo.toml")?;
        println!("added {member} to the workspace");
    }
    // The templates are laid out by hand; rustfmt gives them the house style.
    crate::shell::exec(
        std::process::Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()))
            .args(["fmt", "--manifest-path"])
            .arg(dir.join("Cargo.toml")),
    )?;
    println!(
        "created provider-{name} in {}\n  binary: {name}-cloud-controller-manager (cargo xtask dist/image ship it)\n  next:   cargo test {} ; then docs/provider-authoring.md",
        dir.display(),
        if inside {
            format!("-p provider-{name}")
        } else {
            format!("--manifest-path {}", dir.join("Cargo.toml").display())
        }
    );
    Ok(())
}

fn check_name(name: &str) -> Result<()> {
    let valid = name.starts_with(|c: char| c.is_ascii_lowercase())
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && !name.ends_with('-')
        && !name.contains("--");
    if !valid {
        bail!("NAME {name:?}: use lower-case letters, digits and single dashes, starting with a letter");
    }
    Ok(())
}

/// The template with `{{name}}`, `{{name_}}` (a Rust identifier) and `{{Name}}` (a type name) filled in.
fn fill(template: &str, name: &str) -> String {
    let camel: String = name
        .split('-')
        .map(|word| {
            let mut chars = word.chars();
            chars
                .next()
                .map(|c| c.to_ascii_uppercase().to_string() + chars.as_str())
                .unwrap_or_default()
        })
        .collect();
    template
        .replace("{{name_}}", &name.replace('-', "_"))
        .replace("{{Name}}", &camel)
        .replace("{{name}}", name)
}

/// The crate's Cargo.toml: inheriting from this workspace, or (`standalone` = this repository's root)
/// its own workspace with the same dependency specifications, `kube-ccm` by version and this checkout's
/// crates as its patch.
fn manifest(name: &str, workspace_toml: &str, standalone: Option<&Path>) -> Result<String> {
    let mut out =
        format!("[package]\nname = \"provider-{name}\"\ndescription = \"The {name} cloud provider\"\n");
    match standalone {
        None => out.push_str(
            "version.workspace = true\nedition.workspace = true\nrust-version.workspace = true\nlicense.workspace = true\npublish.workspace = true\n",
        ),
        Some(_) => {
            let package = section(workspace_toml, "workspace.package");
            for key in ["version", "edition", "rust-version", "license", "publish"] {
                let value = value_of(&package, key).with_context(|| format!("[workspace.package] has no {key}"))?;
                out.push_str(&format!("{key} = {value}\n"));
            }
        }
    }
    out.push_str(&format!(
        "\n[[bin]]\nname = \"{name}-cloud-controller-manager\"\npath = \"src/main.rs\"\n"
    ));
    let specs = section(workspace_toml, "workspace.dependencies");
    let root = standalone.map(|r| r.display().to_string());
    for dev in [false, true] {
        out.push_str(if dev {
            "\n[dev-dependencies]\n"
        } else {
            "\n[dependencies]\n"
        });
        for (dependency, features, _) in DEPENDENCIES.iter().filter(|d| d.2 == dev) {
            let spec = match (&root, value_of(&specs, dependency)) {
                (None, Some(_)) if features.is_empty() => "{ workspace = true }".to_owned(),
                (None, Some(_)) => format!("{{ workspace = true, features = {features:?} }}"),
                // The framework as a vendor has it: by version, from crates.io or (below) a patch.
                (Some(_), Some(spec)) if dependency.starts_with("kube-ccm") => {
                    let version = spec_value(&spec, "version")
                        .with_context(|| format!("{dependency} has no version"))?;
                    with_features(&format!("\"{version}\""), features)
                }
                (Some(root), Some(spec)) if spec.contains("path = \"") => {
                    with_features(&spec.replace("path = \"", &format!("path = \"{root}/")), features)
                }
                (Some(_), Some(spec)) => with_features(&spec, features),
                (_, None) => bail!("the workspace has no dependency {dependency}"),
            };
            out.push_str(&format!("{dependency} = {spec}\n"));
        }
    }
    match &root {
        None => out.push_str("\n[lints]\nworkspace = true\n"),
        Some(root) => {
            out.push_str("\n# Its own workspace, outside the framework's.\n[workspace]\n");
            out.push_str(
                "\n# The kube-ccm crates from this checkout of the framework, in place of crates.io's.\n[patch.crates-io]\n",
            );
            for (package, path) in family(&specs) {
                out.push_str(&format!("{package} = {{ path = \"{root}/{path}\" }}\n"));
            }
        }
    }
    Ok(out)
}

/// The crates of the `kube-ccm` family that `kube-ccm` without features depends on (the bundled
/// providers are optional), as (package, path) from the workspace's dependency specifications.
fn family(specs: &str) -> Vec<(String, String)> {
    specs
        .lines()
        .filter_map(|line| {
            let (key, spec) = line.split_once('=')?;
            let package = spec_value(spec, "package").unwrap_or_else(|| key.trim().to_owned());
            let path = spec_value(spec, "path")?;
            let bundled = ["kube-ccm-aws", "kube-ccm-gce", "kube-ccm-fake"].contains(&package.as_str());
            (package.starts_with("kube-ccm") && !bundled).then_some((package, path))
        })
        .collect()
}

/// The string value of `key` in an inline table `{ key = "value", … }`.
fn spec_value(spec: &str, key: &str) -> Option<String> {
    let at = spec.find(&format!("{key} = \""))? + key.len() + 4;
    let end = spec[at..].find('"')?;
    Some(spec[at..at + end].to_owned())
}

/// A dependency specification with `features` added.
fn with_features(spec: &str, features: &[&str]) -> String {
    if features.is_empty() {
        return spec.to_owned();
    }
    let list = features
        .iter()
        .map(|f| format!("\"{f}\""))
        .collect::<Vec<_>>()
        .join(", ");
    if spec.starts_with('"') {
        format!("{{ version = {spec}, features = [{list}] }}")
    } else if let Some(at) = spec.find("features = [") {
        let at = at + "features = [".len();
        format!("{}{list}, {}", &spec[..at], &spec[at..])
    } else {
        format!(
            "{}, features = [{list}] }}",
            spec.trim_end().trim_end_matches('}').trim_end()
        )
    }
}

/// The lines of `[name]` in a TOML file (up to the next table header).
fn section(toml: &str, name: &str) -> String {
    toml.lines()
        .skip_while(|l| l.trim() != format!("[{name}]"))
        .skip(1)
        .take_while(|l| !l.starts_with('['))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The value written after `key =` on its line of `section`.
fn value_of(section: &str, key: &str) -> Option<String> {
    section.lines().find_map(|l| {
        let (k, v) = l.split_once('=')?;
        (k.trim() == key).then(|| v.trim().to_owned())
    })
}

/// The workspace Cargo.toml with `member` added to `members`, after the last provider crate.
fn add_member(workspace_toml: &str, member: &str) -> Result<String> {
    let lines: Vec<&str> = workspace_toml.lines().collect();
    let start = lines
        .iter()
        .position(|l| l.trim_start().starts_with("members = ["))
        .context("no members list")?;
    let end = start
        + lines[start..]
            .iter()
            .position(|l| l.trim() == "]")
            .context("the members list is not closed")?;
    let entry = format!("    \"{member}\",");
    if lines[start..end].iter().any(|l| l.trim() == entry.trim()) {
        bail!("{member} is already a workspace member");
    }
    let after = (start..end)
        .rev()
        .find(|&i| lines[i].contains("crates/providers/"))
        .unwrap_or(end - 1);
    let mut out: Vec<String> = lines.iter().map(|l| (*l).to_owned()).collect();
    out.insert(after + 1, entry);
    Ok(out.join("\n") + "\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    const WORKSPACE: &str = "[workspace]\nmembers = [\n    \"crates/kube-ccm-cli\",\n    \"crates/providers/kube-ccm-fake\",\n    \"crates/providers/kube-ccm-aws\",\n    \"xtask\",\n]\n\n[workspace.package]\nversion = \"0.1.0\"\nedition = \"2024\"\nrust-version = \"1.89\"\nlicense = \"Apache-2.0\"\npublish = false\n\n[workspace.dependencies]\nkube-ccm = { path = \"crates/kube-ccm\", version = \"0.1.0\" }\ncontroller-manager = { package = \"kube-ccm-runtime\", path = \"crates/kube-ccm-runtime\", version = \"0.1.0\" }\nkube-ccm-conformance = { path = \"crates/kube-ccm-conformance\", version = \"0.1.0\" }\nprovider-aws = { package = \"kube-ccm-aws\", path = \"crates/providers/kube-ccm-aws\", version = \"0.1.0\" }\ntest-apiserver = { path = \"crates/testing/kube-ccm-test-apiserver\" }\nasync-trait = \"0.1\"\nk8s-openapi = { version = \"0.29\" }\nserde = { version = \"1\", features = [\"derive\"] }\nserde_json = \"1\"\nkube = { version = \"5\", default-features = false, features = [\"client\"] }\ntempfile = \"3\"\ntokio = { version = \"1\", features = [\"macros\"] }\n";

    #[test]
    fn names_are_checked_and_filled_in_three_forms() {
        for bad in ["Acme", "1cloud", "my_cloud", "a--b", "acme-", ""] {
            assert!(check_name(bad).is_err(), "{bad}");
        }
        check_name("my-cloud2").unwrap();
        assert_eq!(
            fill("{{name}} {{name_}} {{Name}}Cloud", "my-cloud"),
            "my-cloud my_cloud MyCloudCloud"
        );
    }

    #[test]
    fn a_member_is_added_after_the_last_provider_once() {
        let updated = add_member(WORKSPACE, "crates/providers/acme").unwrap();
        assert!(
            updated.contains(
                "    \"crates/providers/kube-ccm-aws\",\n    \"crates/providers/acme\",\n    \"xtask\","
            ),
            "{updated}"
        );
        assert!(add_member(&updated, "crates/providers/acme").is_err());
    }

    #[test]
    fn a_standalone_manifest_has_the_workspaces_specifications_and_paths() {
        let standalone = manifest("acme", WORKSPACE, Some(Path::new("/repo"))).unwrap();
        for line in [
            "edition = \"2024\"",
            "kube-ccm = { version = \"0.1.0\", features = [\"earliest\"] }",
            "[patch.crates-io]",
            "kube-ccm = { path = \"/repo/crates/kube-ccm\" }",
            "kube-ccm-runtime = { path = \"/repo/crates/kube-ccm-runtime\" }",
            // The conformance kit, a dev-dependency, by version as the framework is.
            "kube-ccm-conformance = \"0.1.0\"",
            "kube-ccm-conformance = { path = \"/repo/crates/kube-ccm-conformance\" }",
            "[workspace]",
        ] {
            assert!(standalone.lines().any(|l| l == line), "{line} in:\n{standalone}");
        }
        let member = manifest("acme", WORKSPACE, None).unwrap();
        assert!(
            member.contains("kube-ccm = { workspace = true, features = [\"earliest\"] }"),
            "{member}"
        );
        assert!(!member.contains("cloud-provider"), "{member}");
        assert!(!standalone.contains("kube-ccm-aws"), "{standalone}");
        assert_eq!(
            with_features("{ version = \"1\", features = [\"a\"] }", &["b"]),
            "{ version = \"1\", features = [\"b\", \"a\"] }"
        );
    }
}
