//! Strict reading of configuration files: YAML or JSON, one `LeaderMigrationConfiguration` per document.
//!
//! Like upstream since Kubernetes 1.32, unknown fields and duplicate keys are errors. Unlike upstream, every
//! problem carries a line and a field path, and the known traps get a hint.

use serde::Deserialize;
use serde::de::IgnoredAny;
use serde_saphyr::Spanned;

use super::errors::Problem;
use super::{ApiVersion, ControllerLeaderConfiguration, GROUP, KIND, LEASES, LeaderMigrationConfiguration};

/// One decoded document, with the lines its fields came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Document {
    /// The version it was written in.
    pub api_version: ApiVersion,
    /// Its content, converted to the internal form.
    pub config: LeaderMigrationConfiguration,
    pub(crate) lines: DocumentLines,
}

/// 1-based file lines of a document's fields, for error messages.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct DocumentLines {
    pub(crate) start: usize,
    pub(crate) leader_name: Option<usize>,
    pub(crate) resource_lock: Option<usize>,
    pub(crate) leaders: Vec<LeaderLines>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct LeaderLines {
    pub(crate) entry: usize,
    pub(crate) name: Option<usize>,
    pub(crate) component: Option<usize>,
}

impl Document {
    /// A document built in code (for defaults and tests), with no line information.
    pub fn from_config(api_version: ApiVersion, config: LeaderMigrationConfiguration) -> Document {
        let leaders = config
            .controller_leaders
            .iter()
            .map(|_| LeaderLines::default())
            .collect();
        Document {
            api_version,
            config,
            lines: DocumentLines {
                leaders,
                ..DocumentLines::default()
            },
        }
    }
}

/// Decodes every document in `bytes`. Problems of all documents are reported together.
pub fn decode(bytes: &[u8]) -> Result<Vec<Document>, Vec<Problem>> {
    let text = match std::str::from_utf8(bytes) {
        Ok(text) => text.strip_prefix('\u{feff}').unwrap_or(text),
        Err(error) => {
            let line = bytes[..error.valid_up_to()]
                .iter()
                .filter(|&&b| b == b'\n')
                .count()
                + 1;
            return Err(vec![Problem::error(
                Some(line),
                None,
                "the file is not UTF-8 text",
            )]);
        }
    };
    let sources = split_documents(text);
    if sources.is_empty() {
        return Err(vec![
            Problem::error(None, None, "no LeaderMigrationConfiguration in the file: it is empty")
                .hint(format!("a minimal file is:\napiVersion: {}\nkind: {KIND}\nleaderName: cloud-provider-extraction-migration\ncontrollerLeaders: []", ApiVersion::V1)),
        ]);
    }
    let mut documents = Vec::new();
    let mut problems = Vec::new();
    for source in sources {
        match decode_document(&source) {
            Ok(document) => documents.push(document),
            Err(document_problems) => problems.extend(document_problems),
        }
    }
    if problems.is_empty() {
        Ok(documents)
    } else {
        Err(problems)
    }
}

/// The text of one YAML document and the file line it starts on.
struct DocumentSource {
    text: String,
    first_line: usize,
}

impl DocumentSource {
    fn file_line(&self, document_line: usize) -> usize {
        self.first_line + document_line.saturating_sub(1)
    }
}

/// Splits a YAML stream on `---` and `...` lines, dropping documents that hold only comments.
fn split_documents(text: &str) -> Vec<DocumentSource> {
    let mut documents = Vec::new();
    let mut current = DocumentSource {
        text: String::new(),
        first_line: 1,
    };
    for (index, line) in text.lines().enumerate() {
        let line_number = index + 1;
        let marker = ["---", "..."].into_iter().find(|m| {
            line.strip_prefix(m)
                .is_some_and(|rest| rest.is_empty() || rest.starts_with([' ', '\t']))
        });
        if let Some(marker) = marker {
            let finished = std::mem::replace(
                &mut current,
                DocumentSource {
                    text: String::new(),
                    first_line: line_number,
                },
            );
            documents.push(finished);
            let rest = &line[marker.len()..];
            if marker == "---" && !is_blank_or_comment(rest) {
                // `--- {…}`: content on the marker line. Keep its columns.
                current.text.push_str(&" ".repeat(marker.len()));
                current.text.push_str(rest);
                current.text.push('\n');
            } else {
                current.first_line = line_number + 1;
            }
            continue;
        }
        current.text.push_str(line);
        current.text.push('\n');
    }
    documents.push(current);
    documents.retain(|d| !d.text.lines().all(is_blank_or_comment));
    documents
}

fn is_blank_or_comment(line: &str) -> bool {
    let trimmed = line.trim();
    trimmed.is_empty() || trimmed.starts_with('#')
}

/// The fields every Kubernetes object has; read leniently first to pick the right strict schema.
#[derive(Deserialize)]
struct TypeMeta {
    #[serde(rename = "apiVersion", default)]
    api_version: Option<Spanned<String>>,
    #[serde(default)]
    kind: Option<Spanned<String>>,
}

/// `v1alpha1` and `v1beta1` have the same shape.
#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct BetaDocument {
    #[allow(dead_code)]
    api_version: IgnoredAny,
    #[allow(dead_code)]
    kind: IgnoredAny,
    #[serde(default)]
    leader_name: Option<Spanned<String>>,
    #[serde(default)]
    resource_lock: Option<Spanned<String>>,
    #[serde(default)]
    controller_leaders: Option<Vec<Spanned<VersionedLeader>>>,
}

/// `v1`: no `resourceLock`; Leases are implied.
#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct V1Document {
    #[allow(dead_code)]
    api_version: IgnoredAny,
    #[allow(dead_code)]
    kind: IgnoredAny,
    #[serde(default)]
    leader_name: Option<Spanned<String>>,
    #[serde(default)]
    controller_leaders: Option<Vec<Spanned<VersionedLeader>>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct VersionedLeader {
    #[serde(default)]
    name: Option<Spanned<String>>,
    #[serde(default)]
    component: Option<Spanned<String>>,
}

fn options() -> serde_saphyr::Options {
    let mut options = serde_saphyr::Options::default();
    options.duplicate_keys = serde_saphyr::DuplicateKeyPolicy::Error;
    options.with_snippet = false;
    options
}

/// Deserializes `T` strictly from a document; a failure becomes a problem with line, field path and hints.
fn deserialize<T: for<'de> Deserialize<'de>>(
    source: &DocumentSource,
    version: Option<ApiVersion>,
) -> Result<T, Problem> {
    let mut path = None;
    serde_saphyr::with_deserializer_from_str_with_options(&source.text, options(), |deserializer| {
        serde_path_to_error::deserialize(deserializer).map_err(|error| {
            path = Some(error.path().to_string());
            error.into_inner()
        })
    })
    .map_err(|error| syntax_problem(source, &error, path, version))
}

fn decode_document(source: &DocumentSource) -> Result<Document, Vec<Problem>> {
    // An unquoted `*` stops the YAML parser. Report it, quote it in a copy, and go on, so that one run
    // reports every problem of the document.
    let mut repaired: Option<DocumentSource> = None;
    let mut problems: Vec<Problem> = Vec::new();
    loop {
        let current = repaired.as_ref().unwrap_or(source);
        match decode_repaired(current) {
            Ok(document) if problems.is_empty() => return Ok(document),
            Ok(_) => {
                problems.sort_by_key(|p| p.line);
                return Err(problems);
            }
            Err(problem) => {
                let line_index = problem.line.map(|l| l - current.first_line);
                let fixable = problem.hints.iter().any(|h| h.contains("unquoted *")) && problems.len() < 16;
                problems.push(problem);
                let Some(text) = line_index
                    .filter(|_| fixable)
                    .and_then(|index| quote_star(&current.text, index))
                else {
                    problems.sort_by_key(|p| p.line);
                    return Err(problems);
                };
                repaired = Some(DocumentSource {
                    text,
                    first_line: source.first_line,
                });
            }
        }
    }
}

/// The text with the unquoted `*` values on line `index` (0-based) quoted, if there were any.
fn quote_star(text: &str, index: usize) -> Option<String> {
    let mut lines: Vec<String> = text.lines().map(str::to_owned).collect();
    let line = lines.get_mut(index)?;
    let fixed = line
        .replace(": *,", ": \"*\",")
        .replace(": *}", ": \"*\"}")
        .replace(": * ", ": \"*\" ");
    let fixed = match fixed.strip_suffix(": *") {
        Some(head) => format!("{head}: \"*\""),
        None => fixed,
    };
    if fixed == *line {
        return None;
    }
    *line = fixed;
    Some(lines.join("\n") + "\n")
}

fn decode_repaired(source: &DocumentSource) -> Result<Document, Problem> {
    let type_meta: TypeMeta = deserialize(source, None)?;
    let api_version = check_type_meta(source, &type_meta)?;
    let line = |spanned: &Spanned<String>| source.file_line(spanned.referenced.line() as usize);
    let (leader_name, resource_lock, leaders) = match api_version {
        ApiVersion::V1Alpha1 | ApiVersion::V1Beta1 => {
            let document: BetaDocument = deserialize(source, Some(api_version))?;
            (
                document.leader_name,
                document.resource_lock,
                document.controller_leaders,
            )
        }
        ApiVersion::V1 => {
            let document: V1Document = deserialize(source, Some(api_version))?;
            (document.leader_name, None, document.controller_leaders)
        }
    };
    let leaders = leaders.unwrap_or_default();
    let lines = DocumentLines {
        start: source.first_line,
        leader_name: leader_name.as_ref().map(line),
        resource_lock: resource_lock.as_ref().map(line),
        leaders: leaders
            .iter()
            .map(|leader| LeaderLines {
                entry: source.file_line(leader.referenced.line() as usize),
                name: leader.value.name.as_ref().map(line),
                component: leader.value.component.as_ref().map(line),
            })
            .collect(),
    };
    let text = |field: Option<Spanned<String>>| field.map(|s| s.value).unwrap_or_default();
    let config = LeaderMigrationConfiguration {
        leader_name: text(leader_name),
        resource_lock: match api_version {
            // Upstream's v1 → internal conversion always sets Leases.
            ApiVersion::V1 => LEASES.to_owned(),
            ApiVersion::V1Alpha1 | ApiVersion::V1Beta1 => text(resource_lock),
        },
        controller_leaders: leaders
            .into_iter()
            .map(|leader| ControllerLeaderConfiguration {
                name: text(leader.value.name),
                component: text(leader.value.component),
            })
            .collect(),
    };
    Ok(Document {
        api_version,
        config,
        lines,
    })
}

const SUPPORTED_VERSIONS: &str = "v1alpha1, v1beta1 and v1";

fn header_hint() -> String {
    format!(
        "a leader-migration file starts with:\napiVersion: {}\nkind: {KIND}",
        ApiVersion::V1
    )
}

fn check_type_meta(source: &DocumentSource, type_meta: &TypeMeta) -> Result<ApiVersion, Problem> {
    let line_of = |s: &Spanned<String>| Some(source.file_line(s.referenced.line() as usize));
    let (api_version, kind) = match (&type_meta.api_version, &type_meta.kind) {
        (Some(api_version), Some(kind)) if !api_version.value.is_empty() && !kind.value.is_empty() => {
            (api_version, kind)
        }
        (api_version, kind) => {
            let missing = match (
                api_version.as_ref().is_some_and(|a| !a.value.is_empty()),
                kind.as_ref().is_some_and(|k| !k.value.is_empty()),
            ) {
                (false, false) => "apiVersion and kind",
                (false, true) => "apiVersion",
                _ => "kind",
            };
            let field = if missing == "kind" { "kind" } else { "apiVersion" };
            return Err(Problem::error(
                Some(source.first_line),
                Some(field.to_owned()),
                format!("Required value: {missing} must be set"),
            )
            .hint(header_hint()));
        }
    };
    let (group, version) = api_version
        .value
        .rsplit_once('/')
        .unwrap_or(("", api_version.value.as_str()));
    if group != GROUP || kind.value != KIND {
        let mut problem = Problem::error(
            line_of(kind),
            Some("kind".to_owned()),
            format!(
                "this is a {} ({}), not a {KIND} ({GROUP})",
                quoted_if_odd(&kind.value),
                quoted_if_odd(&api_version.value)
            ),
        );
        problem = match kind.value.as_str() {
            "KubeControllerManagerConfiguration" | "CloudControllerManagerConfiguration" | "KubeletConfiguration" => problem
                .hint("that is a component's own configuration; the leader-migration configuration is a separate file passed with --leader-migration-config")
                .hint(header_hint()),
            _ if group == GROUP => problem.hint(format!("the only kind in {GROUP} is {KIND}")),
            _ => problem.hint(header_hint()),
        };
        return Err(problem);
    }
    ApiVersion::parse(&api_version.value).ok_or_else(|| {
        Problem::error(
            line_of(api_version),
            Some("apiVersion".to_owned()),
            format!(
                "Unsupported value: {:?}: supported versions of {GROUP} are {SUPPORTED_VERSIONS}",
                api_version.value
            ),
        )
        .hint(format!(
            "version {version:?} does not exist; new files should use {}",
            ApiVersion::V1
        ))
    })
}

/// Turns a parser or schema error into a problem with a line, a field path and hints.
fn syntax_problem(
    source: &DocumentSource,
    error: &serde_saphyr::Error,
    path: Option<String>,
    version: Option<ApiVersion>,
) -> Problem {
    let document_line = error.location().map(|l| l.line() as usize);
    let line = document_line.map(|l| source.file_line(l));
    let mut message = error.without_snippet().to_string();
    if let Some(at) = message.rfind(" at line ") {
        message.truncate(at);
    }
    let field = path.map(|p| clean_path(&p)).filter(|p| !p.is_empty());
    let mut problem = Problem::error(line, field, message.clone());

    let line_text = document_line
        .and_then(|l| source.text.lines().nth(l.saturating_sub(1)))
        .unwrap_or("");
    if looks_like_unquoted_star(line_text) || (message.contains("alias") && line_text.contains('*')) {
        problem.message = format!("unquoted * is read as a YAML alias, not as the wildcard ({message})");
        problem = problem.hint(
            "an unquoted * starts a YAML alias; the wildcard component must be quoted: component: \"*\"",
        );
    }
    if version == Some(ApiVersion::V1) && message.contains("unknown field `resourceLock`") {
        problem = problem.hint(format!(
            "{} has no resourceLock: Leases are implied. Delete the line (or keep it and use {})",
            ApiVersion::V1,
            ApiVersion::V1Beta1
        ));
    }
    if message.contains("duplicate mapping key") {
        problem.message = message.replace(", set DuplicateKeyPolicy in Options if acceptable", "");
        problem = problem.hint(
            "each key may appear once per mapping (strict decoding, as upstream since Kubernetes 1.32)",
        );
    }
    problem
}

/// A value from the file, quoted when printing it bare could be misread (spaces, newlines, nothing).
fn quoted_if_odd(value: &str) -> String {
    if !value.is_empty() && value.bytes().all(|b| b.is_ascii_graphic()) {
        value.to_owned()
    } else {
        format!("{value:?}")
    }
}

/// serde_path_to_error reports `controllerLeaders[0].name.value` for a `Spanned` field, and `?` where it
/// could not tell: drop both.
fn clean_path(path: &str) -> String {
    path.split('.')
        .filter(|segment| !matches!(*segment, "value" | "?" | ""))
        .collect::<Vec<_>>()
        .join(".")
}

fn looks_like_unquoted_star(line: &str) -> bool {
    let code = line.split(" #").next().unwrap_or(line).trim_end();
    code.ends_with(": *")
        || code.ends_with("- *")
        || code.contains(": * ")
        || code.contains(": *,")
        || code.contains(": *}")
}

#[cfg(test)]
mod tests {
    use super::*;

    const V1ALPHA1: &str =
        "apiVersion: controllermanager.config.k8s.io/v1alpha1\nkind: LeaderMigrationConfiguration\n";
    const V1: &str = "apiVersion: controllermanager.config.k8s.io/v1\nkind: LeaderMigrationConfiguration\n";

    fn config(
        leader_name: &str,
        resource_lock: &str,
        leaders: &[(&str, &str)],
    ) -> LeaderMigrationConfiguration {
        LeaderMigrationConfiguration {
            leader_name: leader_name.to_owned(),
            resource_lock: resource_lock.to_owned(),
            controller_leaders: leaders
                .iter()
                .map(|(n, c)| ControllerLeaderConfiguration::new(n, c))
                .collect(),
        }
    }

    #[track_caller]
    fn check_ok(input: &str, expected: &[LeaderMigrationConfiguration]) {
        let documents = decode(input.as_bytes()).unwrap_or_else(|p| panic!("expected success, got {p:#?}"));
        let configs: Vec<_> = documents.into_iter().map(|d| d.config).collect();
        assert_eq!(configs, expected);
    }

    /// Checks the single problem's rendering (`FILE:LINE: field: message` plus hints) contains each needle.
    #[track_caller]
    fn check_err(input: &str, needles: &[&str]) -> Vec<Problem> {
        let problems = decode(input.as_bytes()).expect_err("expected a decode error");
        let rendered: Vec<String> = problems.iter().map(|p| p.render("f.yaml")).collect();
        let all = rendered.join("\n");
        for needle in needles {
            assert!(all.contains(needle), "{needle:?} not in:\n{all}");
        }
        problems
    }

    // Upstream TestReadLeaderMigrationConfiguration (reference §8.1).

    #[test]
    fn r1_empty() {
        check_err(
            "",
            &["f.yaml: no LeaderMigrationConfiguration in the file: it is empty"],
        );
    }

    #[test]
    fn r2_wrong_type() {
        check_err(
            "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n",
            &[
                "f.yaml:2: kind: this is a KubeletConfiguration (kubelet.config.k8s.io/v1beta1), not a LeaderMigrationConfiguration",
                "hint: that is a component's own configuration",
            ],
        );
    }

    #[test]
    fn r3_basic() {
        check_ok(
            &format!(
                "{V1ALPHA1}leaderName: migration-120-to-121\nresourceLock: leases\ncontrollerLeaders: []\n"
            ),
            &[config("migration-120-to-121", "leases", &[])],
        );
    }

    #[test]
    fn r4_endpoints() {
        check_ok(
            &format!(
                "{V1ALPHA1}leaderName: migration-120-to-121\nresourceLock: endpoints\ncontrollerLeaders: []\n"
            ),
            &[config("migration-120-to-121", "endpoints", &[])],
        );
    }

    #[test]
    fn r5_unknown_field_is_an_error() {
        check_err(
            &format!(
                "{V1ALPHA1}leaderName: migration-120-to-121\nresourceLock: endpoints\nfoo: bar\ncontrollerLeaders: []\n"
            ),
            &["f.yaml:5: foo: unknown field `foo`"],
        );
    }

    #[test]
    fn r6_duplicate_field_is_an_error() {
        check_err(
            &format!(
                "{V1ALPHA1}leaderName: migration-120-to-121\nresourceLock: endpoints\nresourceLock: endpoints1\ncontrollerLeaders: []\n"
            ),
            &[
                "f.yaml:5: duplicate mapping key: resourceLock",
                "hint: each key may appear once",
            ],
        );
    }

    #[test]
    fn r7_with_leaders() {
        check_ok(
            &format!(
                "{V1ALPHA1}leaderName: migration-120-to-121\nresourceLock: endpoints\ncontrollerLeaders:\n  - name: route-controller\n    component: kube-controller-manager\n  - name: service-controller\n    component: kube-controller-manager\n"
            ),
            &[config(
                "migration-120-to-121",
                "endpoints",
                &[
                    ("route-controller", "kube-controller-manager"),
                    ("service-controller", "kube-controller-manager"),
                ],
            )],
        );
    }

    // Derived cases (reference §8.8).

    #[test]
    fn d1_v1_with_resource_lock_is_an_error_with_a_hint() {
        check_err(
            &format!("{V1}leaderName: x\nresourceLock: leases\ncontrollerLeaders: []\n"),
            &[
                "f.yaml:4: resourceLock: unknown field `resourceLock`",
                "hint: controllermanager.config.k8s.io/v1 has no resourceLock",
            ],
        );
    }

    #[test]
    fn d2_beta_without_resource_lock_reads_as_empty() {
        check_ok(
            &format!("{V1ALPHA1}leaderName: x\ncontrollerLeaders: []\n"),
            &[config("x", "", &[])],
        );
    }

    #[test]
    fn d9_missing_api_version_or_kind() {
        check_err(
            "kind: LeaderMigrationConfiguration\nleaderName: x\n",
            &[
                "f.yaml:1: apiVersion: Required value: apiVersion must be set",
                "hint: a leader-migration file starts with",
            ],
        );
        check_err(
            "apiVersion: controllermanager.config.k8s.io/v1\nleaderName: x\n",
            &["kind: Required value: kind must be set"],
        );
        check_err("leaderName: x\n", &["apiVersion and kind must be set"]);
    }

    #[test]
    fn d10_json_document() {
        check_ok(
            r#"{"apiVersion":"controllermanager.config.k8s.io/v1","kind":"LeaderMigrationConfiguration","leaderName":"x","controllerLeaders":[]}"#,
            &[config("x", "leases", &[])],
        );
    }

    #[test]
    fn json_duplicate_keys_and_unknown_fields_are_errors() {
        check_err(
            r#"{"apiVersion":"controllermanager.config.k8s.io/v1","kind":"LeaderMigrationConfiguration","leaderName":"x","leaderName":"y"}"#,
            &["duplicate mapping key: leaderName"],
        );
        check_err(
            r#"{"apiVersion":"controllermanager.config.k8s.io/v1","kind":"LeaderMigrationConfiguration","leaderNme":"x"}"#,
            &["leaderNme: unknown field `leaderNme`"],
        );
    }

    // Traps with specific hints.

    #[test]
    fn unquoted_wildcard_gets_a_hint() {
        check_err(
            &format!("{V1}leaderName: x\ncontrollerLeaders:\n  - name: route\n    component: *\n"),
            &["f.yaml:6:", "hint: an unquoted * starts a YAML alias"],
        );
    }

    #[test]
    fn problems_after_an_unquoted_wildcard_are_reported_too() {
        let problems = check_err(
            &format!(
                "{V1}leaderName: x\nresourceLock: leases\ncontrollerLeaders:\n  - name: route\n    component: *\n  - {{name: service, component: *}}\n"
            ),
            &[
                "f.yaml:7:",
                "f.yaml:8:",
                "f.yaml:4: resourceLock: unknown field `resourceLock`",
            ],
        );
        assert_eq!(problems.len(), 3);
    }

    #[test]
    fn unknown_version_lists_the_supported_ones() {
        check_err(
            "apiVersion: controllermanager.config.k8s.io/v2\nkind: LeaderMigrationConfiguration\n",
            &[
                "f.yaml:1: apiVersion: Unsupported value: \"controllermanager.config.k8s.io/v2\": supported versions",
                "v1alpha1, v1beta1 and v1",
            ],
        );
    }

    #[test]
    fn other_kinds_are_named() {
        check_err(
            "apiVersion: v1\nkind: ConfigMap\n",
            &["this is a ConfigMap (v1), not a LeaderMigrationConfiguration"],
        );
        check_err(
            "apiVersion: controllermanager.config.k8s.io/v1\nkind: Lease\n",
            &["hint: the only kind in controllermanager.config.k8s.io is LeaderMigrationConfiguration"],
        );
    }

    #[test]
    fn nested_unknown_fields_name_the_entry() {
        check_err(
            &format!("{V1}leaderName: x\ncontrollerLeaders:\n  - name: route\n    components: k\n"),
            &["f.yaml:6: controllerLeaders[0].components: unknown field `components`"],
        );
    }

    #[test]
    fn wrong_types_name_the_field() {
        check_err(&format!("{V1}leaderName: [a]\n"), &["f.yaml:3: leaderName:"]);
        check_err("- a\n- b\n", &["f.yaml:1:"]);
    }

    #[test]
    fn several_documents_are_read_with_file_lines() {
        let input = format!(
            "# two locks\n{V1}leaderName: a\ncontrollerLeaders:\n  - name: route\n    component: \"*\"\n---\n{V1}leaderName: b\ncontrollerLeaders:\n  - name: service\n    component: \"*\"\n---\n# trailing comment only\n"
        );
        let documents = decode(input.as_bytes()).unwrap();
        assert_eq!(documents.len(), 2);
        assert_eq!(documents[1].config.leader_name, "b");
        assert_eq!(documents[1].lines.start, 9);
        assert_eq!(documents[1].lines.leader_name, Some(11));
        assert_eq!(documents[1].lines.leaders[0].name, Some(13));
    }

    #[test]
    fn problems_of_every_document_are_reported() {
        let input = format!("{V1}leaderName: a\nfoo: 1\n---\n{V1}leaderName: b\nbar: 2\n");
        let problems = check_err(&input, &["f.yaml:4: foo:", "f.yaml:9: bar:"]);
        assert_eq!(problems.len(), 2);
    }

    #[test]
    fn not_utf8() {
        let problems = decode(b"apiVersion: x\n\xff\n").unwrap_err();
        assert_eq!(problems[0].render("f"), "f:2: the file is not UTF-8 text");
    }

    #[test]
    fn star_detection() {
        assert!(looks_like_unquoted_star("    component: *"));
        assert!(looks_like_unquoted_star("  - {name: a, component: *}"));
        assert!(!looks_like_unquoted_star("    component: \"*\""));
        assert!(!looks_like_unquoted_star("    component: '*'"));
    }
}
