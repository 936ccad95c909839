//! Well-known names, in one place.

/// Taint kubelets with `--cloud-provider=external` register nodes with, until the cloud-node controller
/// initialises them.
pub const TAINT_UNINITIALIZED: &str = "node.cloudprovider.kubernetes.io/uninitialized";
/// Taint on nodes whose instance is shut down.
pub const TAINT_SHUTDOWN: &str = "node.cloudprovider.kubernetes.io/shutdown";
/// Taint the cluster autoscaler puts on nodes it is removing; such nodes leave load balancers.
pub const TAINT_TO_BE_DELETED_BY_CLUSTER_AUTOSCALER: &str = "ToBeDeletedByClusterAutoscaler";

/// Zone label, and its deprecated twin.
pub const LABEL_ZONE: &str = "topology.kubernetes.io/zone";
/// Deprecated zone label, still set (upstream treats it as the primary when reconciling).
pub const LABEL_ZONE_BETA: &str = "failure-domain.beta.kubernetes.io/zone";
/// Region label.
pub const LABEL_REGION: &str = "topology.kubernetes.io/region";
/// Deprecated region label.
pub const LABEL_REGION_BETA: &str = "failure-domain.beta.kubernetes.io/region";
/// Instance-type label.
pub const LABEL_INSTANCE_TYPE: &str = "node.kubernetes.io/instance-type";
/// Deprecated instance-type label.
pub const LABEL_INSTANCE_TYPE_BETA: &str = "beta.kubernetes.io/instance-type";
/// Nodes with this label (unless it parses as false) get no traffic from external load balancers.
pub const LABEL_EXCLUDE_FROM_EXTERNAL_LOAD_BALANCERS: &str =
    "node.kubernetes.io/exclude-from-external-load-balancers";

/// The IP a kubelet was told to use (`--node-ip`); the cloud's addresses must contain it.
pub const ANNOTATION_PROVIDED_NODE_IP: &str = "alpha.kubernetes.io/provided-node-ip";

/// Finalizer the service controller puts on LoadBalancer services before creating anything in the cloud.
pub const FINALIZER_LOAD_BALANCER_CLEANUP: &str = "service.kubernetes.io/load-balancer-cleanup";
/// The `spec.loadBalancerClass` a service had when the service controller put
/// [`FINALIZER_LOAD_BALANCER_CLEANUP`] on it, written in the same patch (and removed there when it has
/// none). The API server erases the class when the type changes, and every class's manager uses the one
/// finalizer name: this is how a service that left type LoadBalancer says whose clean-up it is.
pub const ANNOTATION_LOAD_BALANCER_CLASS: &str = "kube-ccm.io/load-balancer-class";

/// The cloud-controller-manager's default secure port.
pub const DEFAULT_SECURE_PORT: u16 = 10258;

/// Label (pairs) the cloud-node controller keeps in step: `(beta, GA)`. As upstream, the beta label is the
/// primary when they differ.
pub const LABEL_PAIRS: [(&str, &str); 3] = [
    (LABEL_ZONE_BETA, LABEL_ZONE),
    (LABEL_REGION_BETA, LABEL_REGION),
    (LABEL_INSTANCE_TYPE_BETA, LABEL_INSTANCE_TYPE),
];
