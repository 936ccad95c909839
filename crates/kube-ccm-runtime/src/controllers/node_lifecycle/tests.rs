use super::*;

/// A provider with the trait's defaults: it owns `fake://…` IDs, and cannot interpret `fake://`.
struct Fake;

impl CloudProvider for Fake {
    fn provider_name(&self) -> &str {
        "fake"
    }
}

/// A node: `ready` is its Ready condition's status (it has none when `None`).
fn node(name: &str, ready: Option<&str>, provider_id: Option<&str>, tainted: bool) -> Arc<CachedNode> {
    let conditions: Vec<serde_json::Value> = ready
        .map(|status| json!({"type": "Ready", "status": status}))
        .into_iter()
        .collect();
    let taints: Vec<serde_json::Value> = if tainted {
        vec![json!({"key": TAINT_SHUTDOWN, "effect": "NoSchedule"})]
    } else {
        Vec::new()
    };
    let node = json!({
        "metadata": {"name": name, "uid": format!("uid-{name}")},
        "spec": {"providerID": provider_id, "taints": taints},
        "status": {"conditions": conditions},
    });
    Arc::new(serde_json::from_value(node).expect("a node"))
}

/// What a round does with `node` alone, given the cloud's answers (each read only when it is asked).
fn outcome(
    node: Arc<CachedNode>,
    exists: Result<bool, CloudError>,
    shutdown: Result<bool, CloudError>,
) -> &'static str {
    let selection = select(vec![node], &Fake, 0);
    if !selection.untaint.is_empty() {
        return "untaint";
    }
    if !selection.uninterpretable.is_empty() {
        return "uninterpretable";
    }
    let Some(node) = selection.check.first() else {
        return "not looked up";
    };
    match on_exists(exists) {
        OnExists::Gone => "gone",
        OnExists::Unknown(_) => "no answer",
        OnExists::AskShutdown => match on_shutdown(node, shutdown) {
            OnShutdown::Taint => "taint",
            OnShutdown::Leave => "nothing",
            OnShutdown::Unknown(_) => "no answer",
        },
    }
}

/// `(case, the node, the answer to "does it exist?", to "is it shut down?", what the round does)`.
type Case = (
    &'static str,
    Arc<CachedNode>,
    Result<bool, CloudError>,
    Result<bool, CloudError>,
    &'static str,
);

#[test]
fn each_answer_deletes_taints_untaints_or_leaves_the_node() {
    let id = Some("fake://zone/a");
    let down = || -> Result<bool, CloudError> { Err(CloudError::provider("the cloud is down")) };
    let cases: Vec<Case> = vec![
        (
            "a ready node is not looked up",
            node("a", Some("True"), id, false),
            Ok(false),
            Ok(true),
            "not looked up",
        ),
        (
            "a node running again loses the shutdown taint",
            node("a", Some("True"), id, true),
            Ok(true),
            Ok(false),
            "untaint",
        ),
        (
            "an instance gone: the node goes once that is certain",
            node("a", Some("False"), id, false),
            Ok(false),
            down(),
            "gone",
        ),
        (
            "Unknown is not ready",
            node("a", Some("Unknown"), id, false),
            Ok(false),
            down(),
            "gone",
        ),
        (
            "no Ready condition is not ready",
            node("a", None, id, false),
            Ok(false),
            down(),
            "gone",
        ),
        (
            "without a provider ID, the node is still looked up",
            node("a", Some("False"), None, false),
            Ok(false),
            down(),
            "gone",
        ),
        (
            "shut down: tainted",
            node("a", Some("False"), id, false),
            Ok(true),
            Ok(true),
            "taint",
        ),
        (
            "shut down and tainted already",
            node("a", Some("False"), id, true),
            Ok(true),
            Ok(true),
            "nothing",
        ),
        (
            "running but not ready",
            node("a", Some("False"), id, false),
            Ok(true),
            Ok(false),
            "nothing",
        ),
        (
            "running but not ready keeps its taint, as upstream",
            node("a", Some("False"), id, true),
            Ok(true),
            Ok(false),
            "nothing",
        ),
        (
            "an outage leaves the node alone",
            node("a", Some("False"), id, false),
            down(),
            Ok(true),
            "no answer",
        ),
        (
            "a time-out leaves the node alone",
            node("a", Some("False"), id, false),
            Err(CloudError::Timeout),
            Ok(true),
            "no answer",
        ),
        (
            "InstanceNotFound is no answer to exists",
            node("a", Some("False"), id, false),
            Err(CloudError::InstanceNotFound),
            Ok(true),
            "no answer",
        ),
        (
            "a failed shutdown look-up leaves the node alone",
            node("a", Some("False"), id, false),
            Ok(true),
            down(),
            "no answer",
        ),
        (
            "NotImplemented means not shut down",
            node("a", Some("False"), id, false),
            Ok(true),
            Err(CloudError::NotImplemented),
            "nothing",
        ),
        (
            "InstanceNotFound means not shut down",
            node("a", Some("False"), id, false),
            Ok(true),
            Err(CloudError::InstanceNotFound),
            "nothing",
        ),
        (
            "another provider's node is never looked up",
            node("a", Some("False"), Some("other://a"), false),
            Ok(false),
            Ok(true),
            "not looked up",
        ),
        (
            "nor untainted",
            node("a", Some("True"), Some("other://a"), true),
            Ok(true),
            Ok(false),
            "not looked up",
        ),
        (
            "an ID the provider cannot interpret is reported",
            node("a", Some("False"), Some("fake://"), false),
            Ok(false),
            Ok(true),
            "uninterpretable",
        ),
        (
            "an uninterpretable ID on a ready node is no matter",
            node("a", Some("True"), Some("fake://"), false),
            Ok(false),
            Ok(true),
            "not looked up",
        ),
    ];
    for (case, node, exists, shutdown, expected) in cases {
        assert_eq!(outcome(node, exists, shutdown), expected, "{case}");
    }
}

/// The nodes' names, in order.
fn names(nodes: &[Arc<CachedNode>]) -> Vec<&str> {
    nodes.iter().map(|n| n.name()).collect()
}

#[test]
fn the_selection_keeps_the_caches_order() {
    let nodes = vec![
        node("a", Some("True"), Some("fake://zone/a"), true),
        node("b", Some("False"), Some("fake://zone/b"), false),
        node("c", Some("False"), Some("other://c"), false),
        node("d", Some("False"), Some("fake://"), false),
        node("e", Some("True"), Some("fake://zone/e"), false),
        node("f", None, Some("fake://zone/f"), true),
        node("g", Some("True"), None, true),
    ];
    let selection = select(nodes, &Fake, 0);
    assert_eq!(names(&selection.untaint), ["a", "g"]);
    assert_eq!(names(&selection.check), ["b", "f"]);
    assert_eq!(
        names(&selection.cross_check),
        ["a", "e"],
        "as many ready nodes with interpretable IDs as not-ready ones"
    );
    let refused: Vec<(&str, String)> = selection
        .uninterpretable
        .iter()
        .map(|(n, why)| (n.name(), why.to_string()))
        .collect();
    assert_eq!(refused, [("d", "not of the form fake://<instance>".to_owned())]);
}

#[test]
fn the_ready_nodes_cross_checked_rotate_and_are_as_many_as_the_not_ready() {
    let id = |n: &str| format!("fake://zone/{n}");
    let mut nodes: Vec<Arc<CachedNode>> = ["r0", "r1", "r2"]
        .iter()
        .map(|n| node(n, Some("True"), Some(&id(n)), false))
        .collect();
    let cross = |nodes: &[Arc<CachedNode>], rotation| {
        let selection = select(nodes.to_vec(), &Fake, rotation);
        names(&selection.cross_check)
            .into_iter()
            .map(str::to_owned)
            .collect::<Vec<_>>()
    };
    assert!(cross(&nodes, 0).is_empty(), "no not-ready node: nothing asked");
    nodes.push(node("down", Some("False"), Some(&id("down")), false));
    assert_eq!(cross(&nodes, 0), ["r0"]);
    assert_eq!(cross(&nodes, 1), ["r1"]);
    assert_eq!(cross(&nodes, 5), ["r2"]);
    for n in ["d1", "d2", "d3"] {
        nodes.push(node(n, None, Some(&id(n)), false));
    }
    assert_eq!(cross(&nodes, 2), ["r2", "r0", "r1"], "at most every ready node");
}
