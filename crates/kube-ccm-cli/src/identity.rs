//! This process's leader-election identity: `<hostname>_<uuid>`, as upstream.

/// The host's name (from the kernel, then `$HOSTNAME`, then `localhost`).
pub(crate) fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok().filter(|h| !h.is_empty()))
        .unwrap_or_else(|| "localhost".to_owned())
}

/// `<hostname>_<uuid>`.
pub(crate) fn identity() -> String {
    format!("{}_{}", hostname(), uuid::Uuid::new_v4())
}
