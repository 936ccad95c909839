//! Health and readiness, as named checks that parts of the manager add and remove.

use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::sync::Arc;

use kube_ccm_provider::Refused;

type Check = Arc<dyn Fn() -> Result<(), Refused> + Send + Sync>;

/// Named checks for `/healthz` (and `/livez`) and for `/readyz`, and notes for `/readyz?verbose` (why a
/// controller is skipped).
#[derive(Default)]
pub struct Health {
    health: Mutex<BTreeMap<String, Check>>,
    readiness: Mutex<BTreeMap<String, Check>>,
    notes: Mutex<BTreeMap<String, String>>,
}

/// The verdict of a set of checks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    /// Every check passed.
    pub ok: bool,
    /// `(name, Ok | Err(why))` per check, sorted by name.
    pub checks: Vec<(String, Result<(), Refused>)>,
    /// `(name, note)`: facts shown with the verbose output, never failing it.
    pub notes: Vec<(String, String)>,
}

impl Verdict {
    /// The verdict without the checks named in `excluded` (`?exclude=<name>`).
    pub fn excluding(mut self, excluded: &[&str]) -> Verdict {
        self.checks.retain(|(name, _)| !excluded.contains(&name.as_str()));
        self.ok = self.checks.iter().all(|(_, r)| r.is_ok());
        self
    }
}

fn run(checks: &Mutex<BTreeMap<String, Check>>) -> Verdict {
    let checks: Vec<(String, Check)> = checks
        .lock()
        .iter()
        .map(|(n, c)| (n.clone(), c.clone()))
        .collect();
    let results: Vec<(String, Result<(), Refused>)> =
        checks.into_iter().map(|(name, check)| (name, check())).collect();
    Verdict {
        ok: results.iter().all(|(_, r)| r.is_ok()),
        checks: results,
        notes: Vec::new(),
    }
}

impl Health {
    /// A health check (`/healthz/<name>`).
    pub fn add_health_check(
        &self,
        name: &str,
        check: impl Fn() -> Result<(), Refused> + Send + Sync + 'static,
    ) {
        self.health.lock().insert(name.to_owned(), Arc::new(check));
    }

    /// Removes a health check.
    pub fn remove_health_check(&self, name: &str) {
        self.health.lock().remove(name);
    }

    /// A readiness check (`/readyz/<name>`).
    pub fn add_readiness_check(
        &self,
        name: &str,
        check: impl Fn() -> Result<(), Refused> + Send + Sync + 'static,
    ) {
        self.readiness.lock().insert(name.to_owned(), Arc::new(check));
    }

    /// Removes a readiness check.
    pub fn remove_readiness_check(&self, name: &str) {
        self.readiness.lock().remove(name);
    }

    /// Runs every health check.
    pub fn health(&self) -> Verdict {
        run(&self.health)
    }

    /// Runs every readiness check; the notes come along.
    pub fn readiness(&self) -> Verdict {
        let mut verdict = run(&self.readiness);
        verdict.notes = self
            .notes
            .lock()
            .iter()
            .map(|(n, t)| (n.clone(), t.clone()))
            .collect();
        verdict
    }

    /// A note for `/readyz?verbose` (e.g. why a controller is skipped); it never fails readiness.
    pub fn add_readiness_note(&self, name: &str, note: &str) {
        self.notes.lock().insert(name.to_owned(), note.to_owned());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checks_combine_and_can_be_removed() {
        let health = Health::default();
        assert!(health.health().ok, "no checks: healthy");
        health.add_health_check("a", || Ok(()));
        health.add_health_check("b", || Err("broken".into()));
        let verdict = health.health();
        assert!(!verdict.ok);
        assert_eq!(
            verdict.checks,
            [
                ("a".to_owned(), Ok(())),
                ("b".to_owned(), Err(Refused::new("broken")))
            ]
        );
        health.remove_health_check("b");
        assert!(health.health().ok);
        health.add_readiness_check("started", || Err("not yet".into()));
        assert!(!health.readiness().ok);
    }
}
