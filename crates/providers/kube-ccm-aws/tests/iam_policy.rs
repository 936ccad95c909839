//! `deploy/overlays/aws/iam-policy.json` grants exactly the AWS actions this crate's code calls: every
//! `self.ec2.<operation>()` and `self.elb.<operation>()` in `src/` (and below) is an action of the policy, and every
//! action of the policy is called. (With `RoleARN`, the instance role also needs `sts:AssumeRole` on that role: see the README.)

use std::collections::BTreeSet;
use std::path::Path;

/// `describe_instances` → `DescribeInstances`.
fn camel(snake: &str) -> String {
    snake
        .split('_')
        .map(|w| {
            let mut chars = w.chars();
            chars
                .next()
                .map(|c| c.to_ascii_uppercase().to_string() + chars.as_str())
                .unwrap_or_default()
        })
        .collect()
}

/// Every call on an `ec2`, `elb` or `elbv2` client in `source`, as IAM actions (`ec2:…`,
/// `elasticloadbalancing:…`), however rustfmt broke the chain across lines.
fn operations(source: &str) -> Vec<String> {
    // Whitespace before a `.` goes: `self\n    .ec2\n    .describe_instances()` → `self.ec2.describe_instances()`.
    let mut compact = String::with_capacity(source.len());
    let mut pending = String::new();
    for c in source.chars() {
        if c.is_whitespace() {
            pending.push(c);
            continue;
        }
        if c != '.' {
            compact.push_str(&pending);
        }
        pending.clear();
        compact.push(c);
    }
    let source = compact.as_str();
    let mut found = Vec::new();
    // A client is `ec2`, `elb` or `elbv2` as a whole word before a `.` (`self.ec2.x(`, `ec2.x(`);
    // ELBv2 shares the `elasticloadbalancing` prefix with classic ELB in IAM.
    for (client, service) in [
        ("ec2", "ec2"),
        ("elb", "elasticloadbalancing"),
        ("elbv2", "elasticloadbalancing"),
    ] {
        let pattern = format!("{client}.");
        for (at, _) in source.match_indices(&pattern) {
            let before = source[..at].chars().next_back();
            if before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_') {
                continue;
            }
            let rest = &source[at + pattern.len()..];
            let name: String = rest
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            if name != "clone" && rest[name.len()..].starts_with('(') {
                found.push(format!("{service}:{}", camel(&name)));
            }
        }
    }
    found
}

/// Permissions a call needs besides its own action: tagging on create needs the tagging action too.
const IMPLIED: &[(&str, &str)] = &[
    // `CreateSecurityGroup` with `TagSpecifications`.
    (".tag_specifications(", "ec2:CreateTags"),
    // `CreateLoadBalancer` with `Tags`.
    ("self.elb.create_load_balancer()", "elasticloadbalancing:AddTags"),
];

#[test]
fn the_shipped_policy_grants_exactly_what_the_code_calls() {
    let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut called = BTreeSet::new();
    let mut dirs = vec![crate_dir.join("src")];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
                continue;
            }
            if path.extension().is_none_or(|e| e != "rs") {
                continue;
            }
            let source = std::fs::read_to_string(&path).unwrap();
            called.extend(operations(&source));
            let compact: String = source.split_whitespace().collect();
            for (pattern, action) in IMPLIED {
                if compact.contains(&pattern.replace(' ', "")) {
                    called.insert((*action).to_owned());
                }
            }
        }
    }
    let policy_path = crate_dir.join("../../../deploy/overlays/aws/iam-policy.json");
    let policy: serde_json::Value = serde_json::from_slice(&std::fs::read(&policy_path).unwrap()).unwrap();
    let granted: BTreeSet<String> = policy["Statement"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|s| {
            s["Action"]
                .as_array()
                .unwrap()
                .iter()
                .map(|a| a.as_str().unwrap().to_owned())
        })
        .collect();
    assert!(
        called.contains("ec2:DescribeInstances"),
        "the scan found {called:?}"
    );
    let missing: Vec<_> = called.difference(&granted).collect();
    let unused: Vec<_> = granted.difference(&called).collect();
    assert!(
        missing.is_empty() && unused.is_empty(),
        "not granted: {missing:?}; granted, never called: {unused:?}"
    );
}

#[test]
fn calls_split_across_lines_are_found() {
    let source = "self.ec2.describe_instances()\nlet x = self\n.ec2; self\n    .ec2\n    .create_route()\n    .send(); self.ec2_other.x(); my_ec2.y(); ec2.clone(); ec2\n.delete_route()";
    assert_eq!(
        operations(source),
        ["ec2:DescribeInstances", "ec2:CreateRoute", "ec2:DeleteRoute"]
    );
    assert_eq!(
        operations("self.elb\n  .create_load_balancer()"),
        ["elasticloadbalancing:CreateLoadBalancer"]
    );
}
