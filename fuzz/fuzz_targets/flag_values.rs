//! Any text as `--cluster-cidr` and as `--controllers`: parsed or refused, never a panic.
#![no_main]

use kube_ccm_leadermigration::{ControllerCatalog, ControllerSelection};
use kube_ccm_runtime::Cidr;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(cidrs) = Cidr::parse_list(text) {
        for cidr in cidrs {
            assert_eq!(Cidr::parse_list(&cidr.to_string()).unwrap(), vec![cidr]);
        }
    }
    let items: Vec<&str> = text.split(',').collect();
    if let Err(error) = ControllerSelection::parse(&items, &ControllerCatalog::kubernetes()) {
        assert!(error.to_string().contains("--controllers"));
    }
});
