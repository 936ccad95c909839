//! What the server shares between requests.

use parking_lot::Mutex;
use std::net::SocketAddr;
use std::time::Duration;

use crate::auth::Auth;
use crate::faults::Faults;
use crate::observe::{Clock, Logs};
use crate::store::Store;

/// Asks open watches to end: all of them, or those of clients whose `User-Agent` contains a pattern.
#[derive(Debug, Clone, Default)]
pub(crate) struct CloseWatches {
    pub(crate) generation: u64,
    pub(crate) user_agent: Option<String>,
}

/// Tunables.
#[derive(Debug, Clone)]
pub(crate) struct Settings {
    pub(crate) bookmark_interval: Duration,
    /// The admin API is served (to loopback callers).
    pub(crate) admin: bool,
}

/// Everything the server shares between requests.
pub(crate) struct State {
    pub(crate) store: Mutex<Store>,
    pub(crate) logs: Mutex<Logs>,
    pub(crate) faults: Mutex<Faults>,
    pub(crate) auth: Mutex<Auth>,
    pub(crate) clock: Clock,
    pub(crate) address: SocketAddr,
    pub(crate) close_watches: tokio::sync::watch::Sender<CloseWatches>,
    pub(crate) settings: Settings,
}

impl State {
    /// Ends open watches of clients whose user agent contains `pattern` (all when None).
    pub(crate) fn end_watches(&self, pattern: Option<String>) {
        self.close_watches.send_modify(|close| {
            close.generation += 1;
            close.user_agent = pattern;
        });
    }
}
