//! get and list.

use base64::Engine;
use serde_json::json;

use super::{not_found, object_key};
use crate::request::{ApiRequest, selectors};
use crate::state::State;
use crate::status::ApiError;
use crate::store::Key;
use crate::store::Obj;
use crate::wire::Reply;
use bytes::Bytes;

pub(super) fn get(state: &State, request: &ApiRequest<'_>) -> Result<Reply, ApiError> {
    let target = &request.target;
    let store = state.store.lock();
    let object = store
        .get(target.id, &target.key())
        .ok_or_else(|| not_found(target))?;
    Ok(Reply::bytes(200, object.json.clone()))
}

pub(super) fn list(state: &State, request: &ApiRequest<'_>) -> Result<Reply, ApiError> {
    let target = &request.target;
    let resource = target.resource();
    let (labels, fields) = selectors(resource, request.query)?;
    let limit = request
        .query
        .get("limit")
        .and_then(|l| l.parse::<usize>().ok())
        .filter(|&l| l > 0);
    let continued: Option<(u64, Key)> = match request.query.get("continue").filter(|c| !c.is_empty()) {
        Some(token) => {
            Some(decode_continue(token).ok_or_else(|| ApiError::bad_request("invalid continue token"))?)
        }
        None => None,
    };
    let store = state.store.lock();
    // Every page of a list reports the first page's version. The pages read the current state, not a
    // snapshot, but a watch from that version replays whatever changed while they were read (an object
    // created behind the cursor included), so list and watch together still miss nothing; once the
    // history no longer reaches back that far, the token is refused as upstream refuses a compacted one.
    let (resource_version, start_after) = match continued {
        Some((listed_at, _)) if listed_at < store.compacted(target.id) => {
            return Err(ApiError::gone(
                "The provided continue parameter is too old to display a consistent list result. \
                 You can start a new list without the continue parameter.",
            ));
        }
        Some((listed_at, after)) => (listed_at, Some(after)),
        None => (store.resource_version(), None),
    };
    // The store never lags, so "not older than" is always the latest state; newer versions do not exist yet,
    // and exact reads of past versions are not kept.
    if let Some(requested) = request
        .query
        .get("resourceVersion")
        .filter(|rv| !rv.is_empty() && *rv != "0")
    {
        let requested: u64 = requested
            .parse()
            .map_err(|_| ApiError::bad_request(format!("invalid resourceVersion {requested:?}")))?;
        if requested > resource_version {
            return Err(ApiError::too_large_resource_version(requested, resource_version));
        }
        if request.query.get("resourceVersionMatch") == Some("Exact") && requested != resource_version {
            return Err(ApiError::gone(format!(
                "resourceVersion {requested} is too old: exact reads of past versions are not kept"
            )));
        }
    }
    let unfiltered = labels.is_empty() && fields.is_empty();
    let mut matching = store
        .list_after(target.id, target.namespace.as_deref(), start_after.as_ref())
        .filter(|o| labels.matches(&o.object) && fields.matches(&o.object));
    let mut items: Vec<Obj> = Vec::new();
    let mut more = false;
    for object in matching.by_ref() {
        if limit.is_some_and(|l| items.len() >= l) {
            more = true;
            break;
        }
        items.push(object.clone());
    }
    // As upstream, the count of what is left is given only for an unfiltered list: counting a filtered
    // rest ran the selectors over every later object once per page (a JSON lookup each, quadratic in the
    // list's length); the unfiltered count walks the table's keys only.
    let remaining = (more && unfiltered).then(|| 1 + matching.count());
    drop(store);

    let mut metadata = json!({"resourceVersion": resource_version.to_string()});
    if more && let Some(last) = items.last() {
        metadata["continue"] = json!(encode_continue(resource_version, &object_key(&last.object)));
        if let Some(remaining) = remaining {
            metadata["remainingItemCount"] = json!(remaining);
        }
    }
    let mut body = Vec::with_capacity(64 + items.iter().map(|o| o.json.len() + 1).sum::<usize>());
    body.extend_from_slice(
        format!(
            r#"{{"kind":"{}List","apiVersion":"{}","metadata":{},"items":["#,
            resource.kind,
            resource.api_version(),
            metadata
        )
        .as_bytes(),
    );
    for (index, object) in items.iter().enumerate() {
        if index > 0 {
            body.push(b',');
        }
        body.extend_from_slice(&object.json);
    }
    body.extend_from_slice(b"]}");
    Ok(Reply::bytes(200, Bytes::from(body)))
}

/// A continue token: the version the list's first page was read at, and the key of the last object sent.
pub(super) fn encode_continue(listed_at: u64, key: &Key) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD
        .encode(serde_json::to_vec(&(listed_at, key)).expect("strings serialise"))
}

pub(super) fn decode_continue(token: &str) -> Option<(u64, Key)> {
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(token)
        .ok()?;
    serde_json::from_slice(&bytes).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn continue_tokens_round_trip() {
        let key = ("ns".to_owned(), "name".to_owned());
        assert_eq!(decode_continue(&encode_continue(7, &key)), Some((7, key)));
        assert_eq!(decode_continue("!!"), None);
    }
}
