//! What ships contains no test tooling: the shipped binary links none of the crates under
//! `crates/testing/` (decision 0009), judged from the names in its symbol table (rustc's mangling starts
//! each symbol of a crate's code with the crate's name, length-prefixed: `_ZN7harness…`, or
//! `_ZN…$LT$harness..` for an impl; a module of the same name elsewhere, `tokio::runtime::task::harness`,
//! is deeper in the path) and from the source paths its panic locations carry. This test's own executable,
//! which links them all, is the negative control.

use std::path::Path;

/// The test-tooling crates, by their names in code.
const TOOLING: [&str; 5] = [
    "kube_ccm_test_apiserver",
    "control_plane",
    "harness",
    "compute_double",
    "ccm_audit",
];

/// What of the test tooling `binary` holds: the crates whose mangled names it has, and the tooling's
/// source directory if a path into it is there.
fn tooling_in(binary: &Path) -> Vec<String> {
    let bytes = std::fs::read(binary).unwrap_or_else(|e| panic!("{}: {e}", binary.display()));
    let mut found: Vec<String> = TOOLING
        .iter()
        .filter(|name| {
            [format!("_ZN{}{name}", name.len()), format!("$LT${name}..")]
                .iter()
                .any(|root| memchr::memmem::find(&bytes, root.as_bytes()).is_some())
        })
        .map(|name| (*name).to_owned())
        .collect();
    if memchr::memmem::find(&bytes, b"crates/testing/").is_some() {
        found.push("crates/testing/".to_owned());
    }
    found
}

#[test]
fn the_shipped_binary_links_no_test_tooling() {
    let shipped = tooling_in(Path::new(env!("CARGO_BIN_EXE_cloud-controller-manager")));
    assert!(
        shipped.is_empty(),
        "the shipped binary links test tooling: {shipped:?}"
    );
    // The negative control: the same look finds every one of them in this test's executable.
    let own = tooling_in(&std::env::current_exe().unwrap());
    assert_eq!(
        own.len(),
        TOOLING.len() + 1,
        "the look cannot see test tooling where it is linked: {own:?}"
    );
}
