//! Any bytes as a kube-apiserver audit log: read into the audit's records or refused with one error naming
//! the line, and whatever is read is judged without a panic (a hostile log cannot take the judge down).
#![no_main]

use ccm_audit::{Governance, audit, kube};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    match kube::parse(text) {
        Ok(records) => {
            let report = audit(&records.leases, &records.requests, &Governance::default());
            assert!(report.writes_checked <= records.requests.len());
        }
        Err(error) => assert!(error.to_string().starts_with("audit log line"), "{error}"),
    }
});
