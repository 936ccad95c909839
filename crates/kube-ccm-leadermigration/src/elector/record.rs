//! The leader-election record in a Lease's spec, as client-go's `LeaseLock` reads and writes it.
//!
//! Only the five fields of the record are touched; everything else in the Lease (labels, annotations,
//! `preferredHolder`, `strategy`, fields this code does not know) is kept as it was.

use serde_json::{Value, json};

/// client-go's `LeaderElectionRecord`, as stored in `coordination.k8s.io/v1` Lease fields.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LeaderRecord {
    /// `spec.holderIdentity`; empty when nobody holds the lease (after a release).
    pub holder_identity: String,
    /// `spec.leaseDurationSeconds`, set by the holder: how long others wait after its last change.
    pub lease_duration_seconds: i64,
    /// `spec.acquireTime`, RFC 3339 with microseconds.
    pub acquire_time: Option<String>,
    /// `spec.renewTime`, RFC 3339 with microseconds.
    pub renew_time: Option<String>,
    /// `spec.leaseTransitions`: incremented each time the holder changes.
    pub lease_transitions: i64,
}

impl LeaderRecord {
    /// Reads the record from a Lease object (missing fields read as client-go's zero values).
    pub fn from_lease(lease: &Value) -> LeaderRecord {
        let spec = lease.get("spec").cloned().unwrap_or(Value::Null);
        let text = |field: &str| spec.get(field).and_then(Value::as_str).map(str::to_owned);
        let number = |field: &str| spec.get(field).and_then(Value::as_i64).unwrap_or(0);
        LeaderRecord {
            holder_identity: text("holderIdentity").unwrap_or_default(),
            lease_duration_seconds: number("leaseDurationSeconds"),
            acquire_time: text("acquireTime"),
            renew_time: text("renewTime"),
            lease_transitions: number("leaseTransitions"),
        }
    }

    /// Writes the record into a copy of `lease`, keeping every other field.
    pub fn write_into(&self, lease: &Value) -> Value {
        let mut lease = lease.clone();
        if !lease.get("spec").is_some_and(Value::is_object) {
            lease["spec"] = json!({});
        }
        let spec = lease["spec"].as_object_mut().expect("made an object above");
        spec.insert("holderIdentity".to_owned(), json!(self.holder_identity));
        spec.insert(
            "leaseDurationSeconds".to_owned(),
            json!(self.lease_duration_seconds),
        );
        spec.insert("leaseTransitions".to_owned(), json!(self.lease_transitions));
        for (field, value) in [
            ("acquireTime", &self.acquire_time),
            ("renewTime", &self.renew_time),
        ] {
            match value {
                Some(time) => spec.insert(field.to_owned(), json!(time)),
                None => spec.remove(field),
            };
        }
        lease
    }

    /// The record with which `identity` takes (or keeps) the lease at `now`, given the current one.
    ///
    /// As client-go: acquiring counts a transition unless we already hold it; renewing keeps the acquire
    /// time and the transition count.
    pub fn acquired_by(
        current: &LeaderRecord,
        identity: &str,
        lease_duration_seconds: i64,
        now: &str,
    ) -> LeaderRecord {
        let already_ours = current.holder_identity == identity;
        LeaderRecord {
            holder_identity: identity.to_owned(),
            lease_duration_seconds,
            acquire_time: if already_ours {
                current.acquire_time.clone()
            } else {
                Some(now.to_owned())
            },
            renew_time: Some(now.to_owned()),
            lease_transitions: if already_ours {
                current.lease_transitions
            } else {
                current.lease_transitions + 1
            },
        }
    }

    /// The record a first holder creates the Lease with.
    pub fn created_by(identity: &str, lease_duration_seconds: i64, now: &str) -> LeaderRecord {
        LeaderRecord {
            holder_identity: identity.to_owned(),
            lease_duration_seconds,
            acquire_time: Some(now.to_owned()),
            renew_time: Some(now.to_owned()),
            lease_transitions: 0,
        }
    }

    /// The record client-go's `ReleaseOnCancel` writes: no holder, a one-second duration, times set to now.
    pub fn released(current: &LeaderRecord, now: &str) -> LeaderRecord {
        LeaderRecord {
            holder_identity: String::new(),
            lease_duration_seconds: 1,
            acquire_time: Some(now.to_owned()),
            renew_time: Some(now.to_owned()),
            lease_transitions: current.lease_transitions,
        }
    }
}

/// `metav1.MicroTime` for now: RFC 3339 in UTC with six fractional digits.
pub fn micro_time_now() -> String {
    format!("{:.6}", jiff::Timestamp::now())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reading_missing_fields_gives_zero_values() {
        assert_eq!(
            LeaderRecord::from_lease(&json!({"metadata": {"name": "l"}})),
            LeaderRecord::default()
        );
        let lease = json!({"spec": {"holderIdentity": "a", "leaseDurationSeconds": 15, "leaseTransitions": 3, "renewTime": "t"}});
        let record = LeaderRecord::from_lease(&lease);
        assert_eq!(
            (
                record.holder_identity.as_str(),
                record.lease_duration_seconds,
                record.lease_transitions
            ),
            ("a", 15, 3)
        );
    }

    #[test]
    fn writing_keeps_fields_it_does_not_own() {
        let lease = json!({
            "metadata": {"name": "l", "labels": {"x": "y"}, "resourceVersion": "7"},
            "spec": {"holderIdentity": "a", "preferredHolder": "b", "strategy": "OldestEmulationVersion", "futureField": 1},
        });
        let written = LeaderRecord::created_by("me", 15, "now").write_into(&lease);
        assert_eq!(written["spec"]["preferredHolder"], "b");
        assert_eq!(written["spec"]["strategy"], "OldestEmulationVersion");
        assert_eq!(written["spec"]["futureField"], 1);
        assert_eq!(written["metadata"]["labels"]["x"], "y");
        assert_eq!(
            written["metadata"]["resourceVersion"], "7",
            "the write is conditional on the version read"
        );
        assert_eq!(written["spec"]["holderIdentity"], "me");
    }

    #[test]
    fn transitions_count_changes_of_holder_only() {
        let held = LeaderRecord::created_by("a", 15, "t0");
        let renewed = LeaderRecord::acquired_by(&held, "a", 15, "t1");
        assert_eq!(
            (
                renewed.lease_transitions,
                renewed.acquire_time.as_deref(),
                renewed.renew_time.as_deref()
            ),
            (0, Some("t0"), Some("t1"))
        );
        let taken = LeaderRecord::acquired_by(&renewed, "b", 15, "t2");
        assert_eq!(
            (taken.lease_transitions, taken.acquire_time.as_deref()),
            (1, Some("t2"))
        );
        let released = LeaderRecord::released(&taken, "t3");
        assert_eq!(
            (
                released.holder_identity.as_str(),
                released.lease_duration_seconds,
                released.lease_transitions
            ),
            ("", 1, 1)
        );
        let retaken = LeaderRecord::acquired_by(&released, "b", 15, "t4");
        assert_eq!(
            retaken.lease_transitions, 2,
            "client-go counts a transition after a release too"
        );
    }

    #[test]
    fn micro_time_has_six_digits() {
        let now = micro_time_now();
        assert!(
            now.ends_with('Z') && now.len() == "2026-11-22T10:00:00.123456Z".len(),
            "{now}"
        );
    }
}
