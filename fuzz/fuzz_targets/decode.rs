//! Any bytes: the decoder and validator return a result and never panic; errors always name the file.
#![no_main]

use kube_ccm_leadermigration::{ControllerCatalog, MigrationConfig};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Err(error) = MigrationConfig::load("fuzz.yaml", data, &ControllerCatalog::kubernetes()) {
        assert!(!error.problems.is_empty());
        assert!(error.to_string().starts_with("fuzz.yaml"));
    }
});
