//! Operations: a write is checked when it is asked for and applied when its operation is done, after a
//! set number of polls; an armed operation fault makes it finish with an error instead.

use google_cloud_compute_v1::model;
use serde_json::{Value, json};

use super::{ApiError, Key, State};

/// A write waiting for its operation to finish.
#[derive(Debug)]
pub(super) enum Effect {
    Put(Key, Value),
    Remove(Key),
}

#[derive(Debug)]
pub(super) struct Operation {
    /// The operation as last reported (model-shaped).
    value: Value,
    polls_left: u32,
    effect: Option<Effect>,
    failure: Option<(u16, String)>,
}

/// An operation failure to inject.
#[derive(Debug, Clone)]
pub(crate) struct OperationFault {
    pub(crate) path_contains: String,
    pub(crate) http_status: u16,
    pub(crate) code: String,
    pub(crate) times: u32,
}

impl State {
    pub(super) fn operation(
        &mut self,
        project: &str,
        scope: &str,
        kind: &str,
        target: &str,
        effect: Effect,
        path: &str,
    ) -> Value {
        let id = self.id();
        let name = format!("operation-{id}");
        let failure = self
            .operation_faults
            .iter_mut()
            .find(|f| f.times > 0 && path.contains(&f.path_contains))
            .map(|f| {
                f.times -= 1;
                (f.http_status, f.code.clone())
            });
        let mut value = json!({
            "kind": "compute#operation",
            "id": id.to_string(),
            "name": name,
            "operationType": kind,
            "targetLink": target,
            "status": "PENDING",
            "progress": 0,
            "insertTime": "2026-01-01T00:00:00.000-08:00",
            "selfLink": self.self_link(project, scope, "operations", &name),
        });
        match scope.split_once('/') {
            Some(("zones", _)) => value["zone"] = self.scope_link(project, scope).into(),
            Some(("regions", _)) => value["region"] = self.scope_link(project, scope).into(),
            _ => {}
        }
        let mut operation = Operation {
            value,
            polls_left: self.operation_polls,
            effect: Some(effect),
            failure,
        };
        if operation.polls_left == 0 {
            self.complete(&mut operation);
        }
        let answer = operation_value(&operation.value);
        self.operations
            .insert((project.to_owned(), scope.to_owned(), name), operation);
        answer
    }

    fn complete(&mut self, operation: &mut Operation) {
        operation.value["status"] = "DONE".into();
        operation.value["progress"] = 100.into();
        operation.value["endTime"] = "2026-01-01T00:00:01.000-08:00".into();
        let effect = operation.effect.take();
        if let Some((status, code)) = &operation.failure {
            operation.value["httpErrorStatusCode"] = (*status).into();
            operation.value["httpErrorMessage"] = "injected operation failure".into();
            operation.value["error"] =
                json!({"errors": [{"code": code, "message": format!("injected {code}")}]});
            return;
        }
        match effect {
            Some(Effect::Put(key, value)) => {
                self.resources.insert(key, value);
            }
            Some(Effect::Remove(key)) => {
                self.resources.remove(&key);
            }
            None => {}
        }
    }

    /// An operation's state; each `get` (or `wait`) is one poll.
    pub(crate) fn poll(&mut self, project: &str, scope: &str, name: &str) -> Result<Value, ApiError> {
        let key = (project.to_owned(), scope.to_owned(), name.to_owned());
        let Some(mut operation) = self.operations.remove(&key) else {
            return Err(ApiError::not_found(&format!(
                "projects/{project}/{scope}/operations/{name}"
            )));
        };
        if operation.effect.is_some() {
            if operation.polls_left <= 1 {
                self.complete(&mut operation);
            } else {
                operation.polls_left -= 1;
                operation.value["status"] = "RUNNING".into();
                operation.value["progress"] = 50.into();
            }
        }
        let answer = operation_value(&operation.value);
        self.operations.insert(key, operation);
        Ok(answer)
    }
}

/// An operation, through the model type.
fn operation_value(value: &Value) -> Value {
    let typed: model::Operation =
        serde_json::from_value(value.clone()).expect("an operation is model-shaped");
    serde_json::to_value(typed).expect("it serialises")
}
