//! The compiler's version, for `--version=raw` and `kubernetes_build_info` (upstream reports its Go
//! version there). Nothing else: the build stays reproducible and is not re-run for every commit.

fn main() {
    println!("cargo:rerun-if-env-changed=RUSTC");
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".to_owned());
    let version = std::process::Command::new(rustc)
        .arg("--version")
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_default();
    println!("cargo:rustc-env=BUILD_RUSTC_VERSION={version}");
}
