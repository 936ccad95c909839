//! Go-style durations (`15s`, `5m0s`, `1h30m`, `100ms`, `1.5s`), as upstream's flags take them.

use std::fmt;
use std::time::Duration;

/// The longest Go duration, in seconds (`math.MaxInt64` nanoseconds).
const GO_MAX_SECONDS: f64 = 9_223_372_036.854_775;

/// A duration written as Go writes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct GoDuration(pub Duration);

/// Not a Go duration.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid duration {0:?} (use a number with a unit: ns, us, ms, s, m, h; e.g. 15s, 5m0s, 1h30m)")]
pub struct DurationError(pub String);

impl std::str::FromStr for GoDuration {
    type Err = DurationError;

    fn from_str(text: &str) -> Result<GoDuration, DurationError> {
        let invalid = || DurationError(text.to_owned());
        let trimmed = text.trim();
        if trimmed == "0" {
            return Ok(GoDuration(Duration::ZERO));
        }
        if trimmed.is_empty() || trimmed.starts_with('-') {
            return Err(invalid());
        }
        let mut total = 0f64;
        let mut rest = trimmed.strip_prefix('+').unwrap_or(trimmed);
        while !rest.is_empty() {
            let number_end = rest
                .find(|c: char| !(c.is_ascii_digit() || c == '.'))
                .ok_or_else(invalid)?;
            let number: f64 = rest[..number_end].parse().map_err(|_| invalid())?;
            rest = &rest[number_end..];
            let unit_end = rest
                .find(|c: char| c.is_ascii_digit() || c == '.')
                .unwrap_or(rest.len());
            let seconds = match &rest[..unit_end] {
                "ns" => 1e-9,
                "us" | "µs" | "μs" => 1e-6,
                "ms" => 1e-3,
                "s" => 1.0,
                "m" => 60.0,
                "h" => 3600.0,
                _ => return Err(invalid()),
            };
            total += number * seconds;
            rest = &rest[unit_end..];
        }
        // Go's durations are int64 nanoseconds (about 292 years); anything longer is invalid there too.
        if total > GO_MAX_SECONDS {
            return Err(invalid());
        }
        Duration::try_from_secs_f64(total)
            .map(GoDuration)
            .map_err(|_| invalid())
    }
}

impl serde::Serialize for GoDuration {
    /// As text, as the flag takes it.
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl fmt::Display for GoDuration {
    /// As Go prints it: `15s`, `5m0s`, `1h0m0s`, `100ms`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let duration = self.0;
        if duration.is_zero() {
            return f.write_str("0s");
        }
        if duration < Duration::from_secs(1) {
            let nanos = duration.as_nanos();
            return if nanos.is_multiple_of(1_000_000) {
                write!(f, "{}ms", nanos / 1_000_000)
            } else if nanos.is_multiple_of(1_000) {
                write!(f, "{}µs", nanos / 1_000)
            } else {
                write!(f, "{nanos}ns")
            };
        }
        let seconds = duration.as_secs_f64();
        let hours = (seconds / 3600.0).floor();
        let minutes = ((seconds - hours * 3600.0) / 60.0).floor();
        let rest = seconds - hours * 3600.0 - minutes * 60.0;
        let rest = format!("{}", (rest * 1e9).round() / 1e9);
        match (hours > 0.0, minutes > 0.0 || hours > 0.0) {
            (true, _) => write!(f, "{hours}h{minutes}m{rest}s"),
            (false, true) => write!(f, "{minutes}m{rest}s"),
            (false, false) => write!(f, "{rest}s"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Any flag value is parsed or refused with the value named; never a panic or an overflow.
        #[test]
        fn any_text_is_parsed_or_refused(text in prop_oneof![
            "\\PC{0,40}",
            "[0-9.+-]{0,24}(ns|us|µs|ms|s|m|h|d|x){0,3}([0-9.]{0,8}(s|m|h)){0,3}",
        ]) {
            match text.parse::<GoDuration>() {
                Ok(parsed) => prop_assert!(parsed.0.as_secs_f64() <= GO_MAX_SECONDS),
                Err(error) => prop_assert_eq!(error.0, text),
            }
        }

        /// What is printed parses back to the same duration (to the nanosecond Go keeps).
        #[test]
        fn printed_durations_parse_back(nanos in 0u64..9_223_372_036_854_775_807) {
            let duration = GoDuration(Duration::from_nanos(nanos));
            let back: GoDuration = duration.to_string().parse().unwrap();
            let error = (back.0.as_secs_f64() - duration.0.as_secs_f64()).abs();
            prop_assert!(error <= duration.0.as_secs_f64() * 1e-12 + 1e-9, "{} -> {:?}", duration, back);
        }
    }

    #[track_caller]
    fn check(text: &str, millis: u64, printed: &str) {
        let parsed: GoDuration = text.parse().unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(parsed.0, Duration::from_millis(millis), "{text}");
        assert_eq!(parsed.to_string(), printed, "{text}");
    }

    #[test]
    fn go_durations() {
        check("15s", 15_000, "15s");
        check("5m0s", 300_000, "5m0s");
        check("5m", 300_000, "5m0s");
        check("12h0m0s", 43_200_000, "12h0m0s");
        check("1h30m", 5_400_000, "1h30m0s");
        check("100ms", 100, "100ms");
        check("1.5s", 1_500, "1.5s");
        check("0s", 0, "0s");
        check("0", 0, "0s");
        check("2562047h", 9_223_369_200_000, "2562047h0m0s");
        for bad in [
            "",
            "15",
            "s",
            "-1s",
            "1d",
            "1.2.3s",
            "ten seconds",
            // Longer than Go's int64 nanoseconds: upstream refuses these too.
            "9300000000000000000s",
            "2562048h",
        ] {
            assert!(bad.parse::<GoDuration>().is_err(), "{bad}");
        }
    }
}
