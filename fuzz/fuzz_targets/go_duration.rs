//! Any text as a duration flag: parsed (within Go's int64 nanoseconds, and printed back to itself) or
//! refused naming the value.
#![no_main]

use kube_ccm_cli::GoDuration;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    match text.parse::<GoDuration>() {
        Ok(parsed) => {
            assert!(parsed.0.as_secs() <= 9_223_372_037);
            let again: GoDuration = parsed.to_string().parse().expect("what is printed parses");
            let error = (again.0.as_secs_f64() - parsed.0.as_secs_f64()).abs();
            assert!(error <= parsed.0.as_secs_f64() * 1e-12 + 1e-9);
        }
        Err(error) => assert_eq!(error.0, text),
    }
});
