//! A CPU profile in the pprof format (`profile.proto`, as `go tool pprof` reads it), from the samples of
//! the `pprof` crate's SIGPROF sampler. The encoding is written here (a few fields of one message) rather
//! than pulling in an older protobuf stack for it.
//!
//! The profile: sample types `samples/count` and `cpu/nanoseconds`, period type `cpu/nanoseconds`, one
//! location and one function per symbol name (the innermost frame first, as pprof expects), and the
//! thread's name as a `thread` label.

use std::collections::HashMap;
use std::time::{Duration, SystemTime};

/// Samples per second (Go's runtime profiler's rate).
pub(crate) const FREQUENCY: i32 = 100;

/// The most one request may ask for, in seconds.
pub(crate) const MAX_SECONDS: u64 = 300;

/// Why no profile could be taken.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ProfileError {
    /// Another profile is being taken (the sampler is process-wide).
    #[error("Could not enable CPU profiling: cpu profiling already in use")]
    InUse,
    /// The sampler failed.
    #[error("cpu profiling failed: {0}")]
    Sampler(String),
}

/// Samples this process's CPU for `duration` (blocking this thread), then encodes the profile.
pub(crate) fn cpu_profile(duration: Duration) -> Result<Vec<u8>, ProfileError> {
    let started = SystemTime::now();
    let guard = pprof::ProfilerGuardBuilder::default()
        .frequency(FREQUENCY)
        .blocklist(&["libc", "libgcc", "pthread", "vdso"])
        .build()
        .map_err(|error| match error {
            pprof::Error::Running => ProfileError::InUse,
            other => ProfileError::Sampler(other.to_string()),
        })?;
    std::thread::sleep(duration);
    let report = guard
        .report()
        .build()
        .map_err(|error| ProfileError::Sampler(error.to_string()))?;
    drop(guard);
    let samples = report.data.iter().map(|(frames, count)| Sample {
        thread: frames.thread_name_or_id(),
        // Innermost first, as pprof expects; each frame may have inlined symbols.
        stack: frames
            .frames
            .iter()
            .flat_map(|frame| frame.iter())
            .map(|symbol| Symbol {
                name: symbol.name(),
                system_name: symbol.sys_name().into_owned(),
                file: symbol.filename().into_owned(),
                line: i64::from(symbol.lineno()),
            })
            .collect(),
        count: i64::try_from(*count).unwrap_or(i64::MAX),
    });
    Ok(encode(samples, started, duration))
}

/// One symbol of a stack.
pub(crate) struct Symbol {
    pub(crate) name: String,
    pub(crate) system_name: String,
    pub(crate) file: String,
    pub(crate) line: i64,
}

/// A stack seen `count` times on `thread`.
pub(crate) struct Sample {
    pub(crate) thread: String,
    pub(crate) stack: Vec<Symbol>,
    pub(crate) count: i64,
}

/// The string table: index 0 is the empty string.
#[derive(Default)]
struct Strings {
    table: Vec<String>,
    index: HashMap<String, i64>,
}

impl Strings {
    fn new() -> Strings {
        let mut strings = Strings::default();
        strings.id("");
        strings
    }

    fn id(&mut self, text: &str) -> i64 {
        if let Some(id) = self.index.get(text) {
            return *id;
        }
        let id = i64::try_from(self.table.len()).unwrap_or(i64::MAX);
        self.table.push(text.to_owned());
        self.index.insert(text.to_owned(), id);
        id
    }
}

/// The profile of `samples`, taken from `started` for `duration`, as `profile.proto` bytes.
pub(crate) fn encode(
    samples: impl Iterator<Item = Sample>,
    started: SystemTime,
    duration: Duration,
) -> Vec<u8> {
    let period = 1_000_000_000 / i64::from(FREQUENCY);
    let mut strings = Strings::new();
    let mut out = Vec::new();
    let value_type = |strings: &mut Strings, kind: &str, unit: &str| {
        let mut message = Vec::new();
        int_field(&mut message, 1, strings.id(kind));
        int_field(&mut message, 2, strings.id(unit));
        message
    };
    // sample_type (1): samples/count, cpu/nanoseconds.
    let types = [
        value_type(&mut strings, "samples", "count"),
        value_type(&mut strings, "cpu", "nanoseconds"),
    ];
    for message in &types {
        bytes_field(&mut out, 1, message);
    }
    // Functions and locations, one per symbol name.
    let mut locations: HashMap<String, u64> = HashMap::new();
    let mut functions_out = Vec::new();
    let mut locations_out = Vec::new();
    let thread_key = strings.id("thread");
    for sample in samples {
        let mut ids = Vec::with_capacity(sample.stack.len());
        for symbol in &sample.stack {
            let next = u64::try_from(locations.len()).unwrap_or(u64::MAX) + 1;
            let id = *locations.entry(symbol.name.clone()).or_insert_with(|| {
                let mut function = Vec::new();
                uint_field(&mut function, 1, next);
                int_field(&mut function, 2, strings.id(&symbol.name));
                int_field(&mut function, 3, strings.id(&symbol.system_name));
                int_field(&mut function, 4, strings.id(&symbol.file));
                functions_out.push(function);
                let mut line = Vec::new();
                uint_field(&mut line, 1, next);
                int_field(&mut line, 2, symbol.line);
                let mut location = Vec::new();
                uint_field(&mut location, 1, next);
                bytes_field(&mut location, 4, &line);
                locations_out.push(location);
                next
            });
            ids.push(id);
        }
        // sample (2): location ids, values (count, nanoseconds), the thread label.
        let mut message = Vec::new();
        let mut packed = Vec::new();
        for id in ids {
            varint(&mut packed, id);
        }
        bytes_field(&mut message, 1, &packed);
        let mut values = Vec::new();
        varint(&mut values, sample.count.cast_unsigned());
        varint(&mut values, sample.count.saturating_mul(period).cast_unsigned());
        bytes_field(&mut message, 2, &values);
        let mut label = Vec::new();
        int_field(&mut label, 1, thread_key);
        int_field(&mut label, 2, strings.id(&sample.thread));
        bytes_field(&mut message, 3, &label);
        bytes_field(&mut out, 2, &message);
    }
    for location in &locations_out {
        bytes_field(&mut out, 4, location);
    }
    for function in &functions_out {
        bytes_field(&mut out, 5, function);
    }
    let period_type = value_type(&mut strings, "cpu", "nanoseconds");
    for text in &strings.table {
        bytes_field(&mut out, 6, text.as_bytes());
    }
    let since_epoch = started.duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default();
    int_field(
        &mut out,
        9,
        i64::try_from(since_epoch.as_nanos()).unwrap_or(i64::MAX),
    );
    int_field(
        &mut out,
        10,
        i64::try_from(duration.as_nanos()).unwrap_or(i64::MAX),
    );
    bytes_field(&mut out, 11, &period_type);
    int_field(&mut out, 12, period);
    out
}

fn varint(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        out.push(u8::try_from(value & 0x7f).expect("seven bits") | 0x80);
        value >>= 7;
    }
    out.push(u8::try_from(value).expect("below 0x80"));
}

/// A varint field (wire type 0); zero is left out, as protobuf's default.
fn uint_field(out: &mut Vec<u8>, field: u64, value: u64) {
    if value != 0 {
        varint(out, field << 3);
        varint(out, value);
    }
}

fn int_field(out: &mut Vec<u8>, field: u64, value: i64) {
    uint_field(out, field, value.cast_unsigned());
}

/// A length-delimited field (wire type 2).
fn bytes_field(out: &mut Vec<u8>, field: u64, bytes: &[u8]) {
    varint(out, (field << 3) | 2);
    varint(out, u64::try_from(bytes.len()).unwrap_or(u64::MAX));
    out.extend_from_slice(bytes);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn varints_as_protobuf_writes_them() {
        let check = |value: u64, bytes: &[u8]| {
            let mut out = Vec::new();
            varint(&mut out, value);
            assert_eq!(out, bytes, "{value}");
        };
        check(0, &[0]);
        check(1, &[1]);
        check(127, &[0x7f]);
        check(128, &[0x80, 0x01]);
        check(300, &[0xac, 0x02]);
        check(
            u64::MAX,
            &[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01],
        );
    }

    #[test]
    fn the_string_table_starts_empty_and_holds_each_string_once() {
        let sample = || Sample {
            thread: "tokio-runtime-worker".into(),
            stack: vec![Symbol {
                name: "reconcile".into(),
                system_name: "_ZN9reconcile".into(),
                file: "node.rs".into(),
                line: 10,
            }],
            count: 3,
        };
        let bytes = encode(
            [sample(), sample()].into_iter(),
            SystemTime::UNIX_EPOCH,
            Duration::from_secs(1),
        );
        // Field 6 (the string table) first holds the empty string: key 0x32, length 0.
        let first = bytes.windows(2).position(|w| w == [0x32, 0x00]);
        assert!(first.is_some());
        let text = String::from_utf8_lossy(&bytes);
        assert_eq!(
            text.matches("reconcile").count(),
            2,
            "name and system name, once each"
        );
    }
}
