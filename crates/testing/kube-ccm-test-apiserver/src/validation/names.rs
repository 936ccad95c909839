//! apimachinery's name and label rules (`util/validation`), with its messages (as of Kubernetes 1.34). Each
//! check returns the messages of what is wrong, none when the value is fine.

const DNS1123_LABEL_FORMAT: &str = "[a-z0-9]([-a-z0-9]*[a-z0-9])?";
const DNS1123_SUBDOMAIN_FORMAT: &str = "[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*";
const DNS1035_LABEL_FORMAT: &str = "[a-z]([-a-z0-9]*[a-z0-9])?";
const QUALIFIED_NAME_FORMAT: &str = "([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]";
const LABEL_VALUE_FORMAT: &str = "(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?";
const QUALIFIED_NAME_MESSAGE: &str = "must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character";

/// `RegexError`: the message, examples and the regular expression.
fn regex_error(message: &str, format: &str, examples: &[&str]) -> String {
    if examples.is_empty() {
        return format!("{message} (regex used for validation is '{format}')");
    }
    let examples: Vec<String> = examples.iter().map(|e| format!("'{e}'")).collect();
    format!(
        "{message} (e.g. {}, regex used for validation is '{format}')",
        examples.join(",  or ")
    )
}

fn max_length(max: usize) -> String {
    format!("must be no more than {max} characters")
}

fn is_alphanumeric_lower(b: u8) -> bool {
    b.is_ascii_lowercase() || b.is_ascii_digit()
}

/// `[a-z0-9]([-a-z0-9]*[a-z0-9])?`
fn matches_dns_label(value: &str) -> bool {
    let bytes = value.as_bytes();
    !bytes.is_empty()
        && is_alphanumeric_lower(bytes[0])
        && is_alphanumeric_lower(bytes[bytes.len() - 1])
        && bytes.iter().all(|&b| is_alphanumeric_lower(b) || b == b'-')
}

/// A lowercase RFC 1123 subdomain (most object names).
pub(crate) fn dns1123_subdomain(value: &str) -> Vec<String> {
    let mut errors = Vec::new();
    if value.len() > 253 {
        errors.push(max_length(253));
    }
    if !value.split('.').all(matches_dns_label) {
        errors.push(regex_error(
            "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character",
            DNS1123_SUBDOMAIN_FORMAT,
            &["example.com"],
        ));
    }
    errors
}

/// A lowercase RFC 1123 label (namespace names).
pub(crate) fn dns1123_label(value: &str) -> Vec<String> {
    let mut errors = Vec::new();
    if value.len() > 63 {
        errors.push(max_length(63));
    }
    if !matches_dns_label(value) {
        if dns1123_subdomain(value).is_empty() {
            errors.push("must not contain dots".to_owned());
        } else {
            errors.push(regex_error(
                "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character",
                DNS1123_LABEL_FORMAT,
                &["my-name", "123-abc"],
            ));
        }
    }
    errors
}

/// An RFC 1035 label (service names).
pub(crate) fn dns1035_label(value: &str) -> Vec<String> {
    let mut errors = Vec::new();
    if value.len() > 63 {
        errors.push(max_length(63));
    }
    if !(matches_dns_label(value) && value.as_bytes()[0].is_ascii_lowercase()) {
        errors.push(regex_error(
            "a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an alphabetic character, and end with an alphanumeric character",
            DNS1035_LABEL_FORMAT,
            &["my-name", "abc-123"],
        ));
    }
    errors
}

/// A name usable as a path segment (RBAC objects, core/v1 Events).
pub(crate) fn path_segment(value: &str) -> Vec<String> {
    if value == "." || value == ".." {
        return vec![format!("may not be '{value}'")];
    }
    ["/", "%"]
        .iter()
        .filter(|bad| value.contains(*bad))
        .map(|bad| format!("may not contain '{bad}'"))
        .collect()
}

/// `[A-Za-z0-9]` then `[-A-Za-z0-9_.]*` then `[A-Za-z0-9]`, or one alphanumeric character.
fn matches_qualified_name(value: &str) -> bool {
    let bytes = value.as_bytes();
    !bytes.is_empty()
        && bytes[0].is_ascii_alphanumeric()
        && bytes[bytes.len() - 1].is_ascii_alphanumeric()
        && bytes
            .iter()
            .all(|&b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

/// A qualified name: label and annotation keys, taint keys, finalizers.
pub(crate) fn qualified_name(value: &str) -> Vec<String> {
    let mut errors = Vec::new();
    let parts: Vec<&str> = value.split('/').collect();
    let name = match parts.as_slice() {
        [name] => *name,
        [prefix, name] => {
            if prefix.is_empty() {
                errors.push("prefix part must be non-empty".to_owned());
            } else {
                errors.extend(
                    dns1123_subdomain(prefix)
                        .into_iter()
                        .map(|m| format!("prefix part {m}")),
                );
            }
            name
        }
        _ => {
            return vec![format!(
                "a qualified name {} with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')",
                regex_error(
                    QUALIFIED_NAME_MESSAGE,
                    QUALIFIED_NAME_FORMAT,
                    &["MyName", "my.name", "123-abc"]
                )
            )];
        }
    };
    if name.is_empty() {
        errors.push("name part must be non-empty".to_owned());
    } else if name.len() > 63 {
        errors.push(format!("name part {}", max_length(63)));
    }
    if !matches_qualified_name(name) {
        errors.push(format!(
            "name part {}",
            regex_error(
                QUALIFIED_NAME_MESSAGE,
                QUALIFIED_NAME_FORMAT,
                &["MyName", "my.name", "123-abc"]
            )
        ));
    }
    errors
}

/// A label value (also taint values).
pub(crate) fn label_value(value: &str) -> Vec<String> {
    let mut errors = Vec::new();
    if value.len() > 63 {
        errors.push(max_length(63));
    }
    if !(value.is_empty() || matches_qualified_name(value)) {
        errors.push(regex_error(
            "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character",
            LABEL_VALUE_FORMAT,
            &["MyValue", "my_value", "12345"],
        ));
    }
    errors
}

/// A ConfigMap or Secret key.
pub(crate) fn config_key(value: &str) -> Vec<String> {
    let mut errors = Vec::new();
    if value.len() > 253 {
        errors.push(max_length(253));
    }
    if value.is_empty()
        || !value
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
    {
        errors.push(regex_error(
            "a valid config key must consist of alphanumeric characters, '-', '_' or '.'",
            "[-._a-zA-Z0-9]+",
            &["key.name", "KEY_NAME", "key-name"],
        ));
    }
    match value {
        "." => errors.push("must not be '.'".to_owned()),
        ".." => errors.push("must not be '..'".to_owned()),
        _ if value.starts_with("..") => errors.push("must not start with '..'".to_owned()),
        _ => {}
    }
    errors
}

#[cfg(test)]
mod tests {
    use super::*;

    #[track_caller]
    fn check(rule: fn(&str) -> Vec<String>, value: &str, expected: &[&str]) {
        assert_eq!(rule(value), expected, "{value:?}");
    }

    const SUBDOMAIN: &str = "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')";
    const NAME_PART: &str = "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')";

    #[test]
    fn names() {
        check(dns1123_subdomain, "node-1.example.com", &[]);
        check(dns1123_subdomain, "Node_1", &[SUBDOMAIN]);
        check(
            dns1123_subdomain,
            &"a".repeat(254),
            &["must be no more than 253 characters"],
        );
        check(dns1123_label, "kube-system", &[]);
        check(dns1123_label, "a.b", &["must not contain dots"]);
        check(
            dns1123_label,
            "A",
            &[
                "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')",
            ],
        );
        check(dns1035_label, "web-1", &[]);
        check(
            dns1035_label,
            "1web",
            &[
                "a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an alphabetic character, and end with an alphanumeric character (e.g. 'my-name',  or 'abc-123', regex used for validation is '[a-z]([-a-z0-9]*[a-z0-9])?')",
            ],
        );
        check(path_segment, "system::leader", &[]);
        check(path_segment, "..", &["may not be '..'"]);
        check(
            path_segment,
            "a/b%c",
            &["may not contain '/'", "may not contain '%'"],
        );
    }

    #[test]
    fn qualified_names_and_label_values() {
        check(
            qualified_name,
            "node.kubernetes.io/exclude-from-external-load-balancers",
            &[],
        );
        check(qualified_name, "ToBeDeletedByClusterAutoscaler", &[]);
        check(qualified_name, "", &["name part must be non-empty", NAME_PART]);
        check(qualified_name, "/x", &["prefix part must be non-empty"]);
        check(
            qualified_name,
            "Example.com/x",
            &[&format!("prefix part {SUBDOMAIN}")],
        );
        check(
            qualified_name,
            &"k".repeat(64),
            &["name part must be no more than 63 characters"],
        );
        check(
            qualified_name,
            "a/b/c",
            &[
                "a qualified name must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]') with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')",
            ],
        );
        check(label_value, "", &[]);
        check(label_value, "true", &[]);
        check(
            label_value,
            &"v".repeat(100),
            &["must be no more than 63 characters"],
        );
        check(
            label_value,
            "-x",
            &[
                "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or '12345', regex used for validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')",
            ],
        );
        check(config_key, "leader-migration.yaml", &[]);
        check(config_key, "..x", &["must not start with '..'"]);
    }
}
