//! The resource types the server stores. Objects are stored as JSON, so adding a type is a table entry.

/// How a list field merges in strategic-merge patches and server-side apply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ListKind {
    /// Items are maps identified by this key (`patchMergeKey`, `listType=map`).
    Map(&'static str),
    /// Items are scalars merged as a set (`patchStrategy=merge` on primitives, `listType=set`).
    Set,
}

/// One merge rule: a dotted path (with `[]` for "every item of a list") and how that list merges.
/// Lists without a rule are atomic: a patch replaces them, as the real server does.
pub(crate) type ListRule = (&'static str, ListKind);

const METADATA_LISTS: &[ListRule] = &[
    ("metadata.finalizers", ListKind::Set),
    ("metadata.ownerReferences", ListKind::Map("uid")),
];

const POD_SPEC_LISTS: &[ListRule] = &[
    ("spec.containers", ListKind::Map("name")),
    ("spec.initContainers", ListKind::Map("name")),
    ("spec.containers[].env", ListKind::Map("name")),
    ("spec.containers[].ports", ListKind::Map("containerPort")),
    ("spec.containers[].volumeMounts", ListKind::Map("mountPath")),
    ("spec.volumes", ListKind::Map("name")),
    ("status.conditions", ListKind::Map("type")),
];

const DEPLOYMENT_LISTS: &[ListRule] = &[
    ("spec.template.spec.containers", ListKind::Map("name")),
    ("spec.template.spec.initContainers", ListKind::Map("name")),
    ("spec.template.spec.containers[].env", ListKind::Map("name")),
    (
        "spec.template.spec.containers[].ports",
        ListKind::Map("containerPort"),
    ),
    (
        "spec.template.spec.containers[].volumeMounts",
        ListKind::Map("mountPath"),
    ),
    ("spec.template.spec.volumes", ListKind::Map("name")),
    ("status.conditions", ListKind::Map("type")),
];

/// A resource type: its REST coordinates and how it behaves.
#[derive(Debug)]
pub(crate) struct ResourceType {
    pub(crate) group: &'static str,
    pub(crate) version: &'static str,
    pub(crate) plural: &'static str,
    pub(crate) singular: &'static str,
    pub(crate) kind: &'static str,
    pub(crate) namespaced: bool,
    pub(crate) short_names: &'static [&'static str],
    /// Has a `/status` subresource: the main resource ignores `.status`, `/status` changes only it.
    pub(crate) status: bool,
    /// List merge rules besides the metadata ones every type has.
    pub(crate) lists: &'static [ListRule],
}

impl ResourceType {
    /// `v1` or `group/version`.
    pub(crate) fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.to_owned()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    /// `leases.coordination.k8s.io`, as used in error messages.
    pub(crate) fn qualified(&self) -> String {
        if self.group.is_empty() {
            self.plural.to_owned()
        } else {
            format!("{}.{}", self.plural, self.group)
        }
    }

    /// The merge rule for the list at `path` (items written as `[]`).
    pub(crate) fn list_kind(&self, path: &str) -> Option<ListKind> {
        METADATA_LISTS
            .iter()
            .chain(self.lists)
            .find(|(p, _)| *p == path)
            .map(|(_, kind)| *kind)
    }
}

macro_rules! resource {
    ($group:expr, $version:expr, $plural:expr, $singular:expr, $kind:expr, namespaced: $ns:expr, short: $short:expr, status: $status:expr, lists: $lists:expr) => {
        ResourceType {
            group: $group,
            version: $version,
            plural: $plural,
            singular: $singular,
            kind: $kind,
            namespaced: $ns,
            short_names: $short,
            status: $status,
            lists: $lists,
        }
    };
}

/// Every stored type.
pub(crate) static RESOURCES: &[ResourceType] = &[
    resource!("", "v1", "namespaces", "namespace", "Namespace", namespaced: false, short: &["ns"], status: true, lists: &[]),
    resource!("", "v1", "nodes", "node", "Node", namespaced: false, short: &["no"], status: true, lists: &[
        ("spec.podCIDRs", ListKind::Set),
        ("status.conditions", ListKind::Map("type")),
        ("status.addresses", ListKind::Map("type")),
        ("status.volumesAttached", ListKind::Map("name")),
    ]),
    resource!("", "v1", "services", "service", "Service", namespaced: true, short: &["svc"], status: true, lists: &[
        ("spec.ports", ListKind::Map("port")),
        ("status.conditions", ListKind::Map("type")),
    ]),
    resource!("", "v1", "pods", "pod", "Pod", namespaced: true, short: &["po"], status: true, lists: POD_SPEC_LISTS),
    resource!("", "v1", "configmaps", "configmap", "ConfigMap", namespaced: true, short: &["cm"], status: false, lists: &[]),
    resource!("", "v1", "secrets", "secret", "Secret", namespaced: true, short: &[], status: false, lists: &[]),
    resource!("", "v1", "serviceaccounts", "serviceaccount", "ServiceAccount", namespaced: true, short: &["sa"], status: false, lists: &[]),
    resource!("", "v1", "events", "event", "Event", namespaced: true, short: &["ev"], status: false, lists: &[]),
    resource!("events.k8s.io", "v1", "events", "event", "Event", namespaced: true, short: &["ev"], status: false, lists: &[]),
    resource!("coordination.k8s.io", "v1", "leases", "lease", "Lease", namespaced: true, short: &[], status: false, lists: &[]),
    resource!("apps", "v1", "deployments", "deployment", "Deployment", namespaced: true, short: &["deploy"], status: true, lists: DEPLOYMENT_LISTS),
    resource!("rbac.authorization.k8s.io", "v1", "roles", "role", "Role", namespaced: true, short: &[], status: false, lists: &[]),
    resource!("rbac.authorization.k8s.io", "v1", "rolebindings", "rolebinding", "RoleBinding", namespaced: true, short: &[], status: false, lists: &[]),
    resource!("rbac.authorization.k8s.io", "v1", "clusterroles", "clusterrole", "ClusterRole", namespaced: false, short: &[], status: false, lists: &[]),
    resource!("rbac.authorization.k8s.io", "v1", "clusterrolebindings", "clusterrolebinding", "ClusterRoleBinding", namespaced: false, short: &[], status: false, lists: &[]),
];

/// Index of a type in [`RESOURCES`].
pub(crate) type ResourceId = usize;

/// Finds a type by group, version and plural name.
pub(crate) fn find(group: &str, version: &str, plural: &str) -> Option<ResourceId> {
    RESOURCES
        .iter()
        .position(|r| r.group == group && r.version == version && r.plural == plural)
}

/// Finds a type by `apiVersion` and `kind`.
pub(crate) fn find_kind(api_version: &str, kind: &str) -> Option<ResourceId> {
    RESOURCES
        .iter()
        .position(|r| r.api_version() == api_version && r.kind == kind)
}

/// The type with this group and plural (any version), for RBAC and lease bookkeeping.
pub(crate) fn id_of(group: &str, plural: &str) -> ResourceId {
    RESOURCES
        .iter()
        .position(|r| r.group == group && r.plural == plural)
        .expect("a known resource")
}

/// The API groups with their versions, in discovery order (core first).
pub(crate) fn groups() -> Vec<(&'static str, &'static str)> {
    let mut groups: Vec<(&str, &str)> = Vec::new();
    for r in RESOURCES {
        if !groups.contains(&(r.group, r.version)) {
            groups.push((r.group, r.version));
        }
    }
    groups
}
