//! The process families every Go component exposes (client_golang's process collector), under its names:
//! CPU time, resident and virtual memory, open and maximum descriptors, start time. Read from `/proc` at
//! each scrape; where there is no `/proc`, none are exposed.

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;

/// What `/proc/self` says of this process.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ProcessStats {
    pub(crate) cpu_seconds: f64,
    pub(crate) resident_bytes: f64,
    pub(crate) virtual_bytes: f64,
    pub(crate) start_time_seconds: f64,
    pub(crate) open_fds: f64,
    pub(crate) max_fds: f64,
}

impl ProcessStats {
    /// This process now; `None` without `/proc`.
    pub(crate) fn read() -> Option<ProcessStats> {
        let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
        let boot_time = std::fs::read_to_string("/proc/stat")
            .ok()?
            .lines()
            .find_map(|line| line.strip_prefix("btime "))
            .and_then(|value| value.trim().parse::<f64>().ok())?;
        let open_fds = std::fs::read_dir("/proc/self/fd").ok()?.count();
        let max_fds = rustix::process::getrlimit(rustix::process::Resource::Nofile)
            .current
            .map_or(f64::INFINITY, |limit| limit as f64);
        parse_stat(
            &stat,
            rustix::param::clock_ticks_per_second() as f64,
            rustix::param::page_size() as f64,
            boot_time,
        )
        .map(
            |(cpu_seconds, resident_bytes, virtual_bytes, start_time_seconds)| ProcessStats {
                cpu_seconds,
                resident_bytes,
                virtual_bytes,
                start_time_seconds,
                // The directory listing's own descriptor is open while it is read.
                open_fds: open_fds.saturating_sub(1) as f64,
                max_fds,
            },
        )
    }
}

/// From `/proc/self/stat`: CPU seconds (user + system), resident and virtual bytes, and the start time in
/// seconds since the epoch.
fn parse_stat(
    stat: &str,
    ticks_per_second: f64,
    page_size: f64,
    boot_time: f64,
) -> Option<(f64, f64, f64, f64)> {
    // The command name is in parentheses and may hold spaces; the fields after it start with the state
    // (field 3 of proc(5)), so field N is at index N - 3.
    let (_, after) = stat.rsplit_once(')')?;
    let fields: Vec<&str> = after.split_whitespace().collect();
    let number = |field: usize| fields.get(field - 3)?.parse::<f64>().ok();
    let cpu_seconds = (number(14)? + number(15)?) / ticks_per_second;
    let start_time_seconds = boot_time + number(22)? / ticks_per_second;
    Some((
        cpu_seconds,
        number(24)? * page_size,
        number(23)?,
        start_time_seconds,
    ))
}

/// Encodes [`ProcessStats::read`] at each scrape.
#[derive(Debug, Default)]
pub(crate) struct ProcessCollector;

impl Collector for ProcessCollector {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let Some(stats) = ProcessStats::read() else {
            return Ok(());
        };
        let counter = ConstCounter::new(stats.cpu_seconds);
        counter.encode(encoder.encode_descriptor(
            "process_cpu_seconds",
            "Total user and system CPU time spent in seconds",
            None,
            counter.metric_type(),
        )?)?;
        for (name, help, value) in [
            (
                "process_resident_memory_bytes",
                "Resident memory size in bytes",
                stats.resident_bytes,
            ),
            (
                "process_virtual_memory_bytes",
                "Virtual memory size in bytes",
                stats.virtual_bytes,
            ),
            (
                "process_start_time_seconds",
                "Start time of the process since unix epoch in seconds",
                stats.start_time_seconds,
            ),
            (
                "process_open_fds",
                "Number of open file descriptors",
                stats.open_fds,
            ),
            (
                "process_max_fds",
                "Maximum number of open file descriptors",
                stats.max_fds,
            ),
        ] {
            let gauge = ConstGauge::new(value);
            gauge.encode(encoder.encode_descriptor(name, help, None, gauge.metric_type())?)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_stat_fields_by_their_proc5_numbers() {
        // pid (comm with spaces) state ppid ... utime=14 stime=15 ... starttime=22 vsize=23 rss=24
        let stat = "42 (a (b) c) S 1 2 3 4 5 6 7 8 9 10 300 100 0 0 20 0 1 0 5000 1048576 256 rest";
        assert_eq!(
            parse_stat(stat, 100.0, 4096.0, 1_700_000_000.0),
            Some((4.0, 256.0 * 4096.0, 1_048_576.0, 1_700_000_050.0))
        );
        assert_eq!(parse_stat("42 (x) S 1", 100.0, 4096.0, 0.0), None);
    }

    #[test]
    fn this_process_reads_plausibly() {
        let Some(stats) = ProcessStats::read() else {
            return; // No /proc here: nothing is exposed, nothing to check.
        };
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs_f64();
        assert!(stats.start_time_seconds <= now + 1.0 && stats.start_time_seconds > now - 86_400.0 * 365.0);
        assert!(stats.resident_bytes > 1_000_000.0, "{stats:?}");
        assert!(stats.virtual_bytes >= stats.resident_bytes, "{stats:?}");
        assert!(
            stats.open_fds >= 3.0 && stats.open_fds <= stats.max_fds,
            "{stats:?}"
        );
        assert!(stats.cpu_seconds >= 0.0);
    }
}
