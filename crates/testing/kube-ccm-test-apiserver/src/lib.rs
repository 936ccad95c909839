//! A test double of the Kubernetes API server.
//!
//! It starts in milliseconds in-process and injects faults (latency, errors, partitions, compaction), so
//! integration tests, benchmarks and the demo run against it by default. The end-to-end tests run on a
//! real kube-apiserver 1.37 on etcd as well (`crates/testing/control-plane`, one parameter), which keeps this
//! server honest. It is faithful where leader election and the cloud controllers depend on it, and it is
//! never on a production code path.
//!
//! **Checked against kube-apiserver; what it revealed was fixed here:** new nodes get the `not-ready`
//! taint (`TaintNodesByCondition`); a Lease's `strategy` and `preferredHolder` are dropped, as with
//! `CoordinatedLeaderElection` off (its default); `default/kubernetes` exists; kube-controller-manager's
//! bootstrap Role `system::leader-locking-kube-controller-manager` covers every Lease in `kube-system`.
//! A load balancer with `allocateLoadBalancerNodePorts: false` gets no node ports. **Still different, on
//! purpose:** node ports are handed out in turn and never run out (the real server refuses a service once
//! the 2,768 of 30000–32767 are taken, "failed to allocate a nodePort: range is full"); a pod is deleted at once (a real server waits for its kubelet unless
//! the grace period is 0, as the tests ask); HTTP unless TLS is asked for, tokens rather than client
//! certificates, and no priority and fairness (the fast path for tests and benchmarks); its request log
//! and Lease history are what the real server's audit log gives (`ccm_audit::kube`).
//!
//! **Faithful:** the REST paths, JSON, and `Status` errors with the real reasons and codes; a global
//! resourceVersion; `uid`, `creationTimestamp`, `generation` (objects with a `spec`), `managedFields`;
//! get, list (label selectors with every operator, field selectors on the fields the real server supports,
//! `limit`/`continue`), watch (replay from a resourceVersion, 410 `Expired` as an ERROR event, bookmarks,
//! `sendInitialEvents`, `timeoutSeconds`, ADDED/DELETED as objects enter or leave a selector), create (409
//! `AlreadyExists`, `generateName`, the namespace must exist), update (409 `Conflict` on a stale
//! resourceVersion; no-op writes do not bump it), merge, JSON and strategic-merge patches (list merge keys
//! for the fields controllers touch; node taints are replaced, as on the real server), server-side apply
//! (field managers, conflicts, `force`, removal of fields no longer applied), delete (finalizers set
//! `deletionTimestamp` and the object goes with its last finalizer; uid and resourceVersion
//! preconditions), the status subresource (a status write keeps the spec and takes status and metadata, as
//! the real registries do: the service controller moves its finalizer through it), `dryRun=All`, defaulting
//! (services: cluster IP, node ports, ingress IP mode, fields a new type no longer needs; bindings' API groups), and RBAC authorisation from
//! stored roles and bindings.
//!
//! **Validated as the real server (1.34 messages):** every body is decoded as its kind (`k8s-openapi`'s
//! types): a value of the wrong type is a 400 (`… cannot be handled as a Lease: json: cannot unmarshal number
//! 3000000000 into Go struct field LeaseSpec.spec.leaseDurationSeconds of type int32`; for patches upstream's
//! 422 `patch` error, for apply a 500), and unknown fields follow `fieldValidation` (`Warn` by default: a
//! `Warning` header kubectl prints; `Strict`: refused; `Ignore`: dropped; never stored). Then each kind's
//! rules, as 422 `Invalid` with `details.causes[]` per field: metadata (names per kind, generateName, labels,
//! annotations and their 256 KiB total, finalizers), Node (taints, pod CIDRs, providerID and podCIDRs
//! immutable once set, duplicate addresses; address types are not checked, as upstream), Service (type,
//! ports, selector, load-balancer class and its immutability, `status.loadBalancer` on status writes),
//! ConfigMap and Secret (keys, 1 MiB), Lease spec, Events (core/v1 legacy rules; events.k8s.io/v1 strict
//! ones), RBAC (rules, role references and subjects, `roleRef` immutable). Server-side apply takes an omitted
//! name from the live object, as upstream.
//!
//! **Not validated:** Pod and Deployment specs (metadata only), Service cluster IPs and IP families (this
//! server allocates them), owner references, duplicate JSON keys; Go struct names in type errors are exact
//! for the fields of the stored kinds' usual structs and approximate elsewhere. The project writes none of
//! these.
//!
//! **Simplified:** `continue` pages read the current
//! state, not a snapshot (they report the first page's resourceVersion, so a watch from it replays what
//! changed meanwhile; a token older than the kept history gets 410); core and `events.k8s.io` Events are stored separately; deleting a namespace
//! removes its objects at once; server-side apply takes list semantics from the merge-key table (one key per
//! keyed list) instead of OpenAPI, and keeps empty parent maps after a removal; no protobuf, no HTTP/2, TLS
//! only with a CA made at start (no client certificates), no admission but the `not-ready` taint
//! `TaintNodesByCondition` gives new nodes, no aggregated discovery or OpenAPI documents.
//!
//! Start it in-process with [`TestApiServer::start`] or as the `test-apiserver` binary. Its admin API under
//! `/_admin/` (see `admin.rs`) exposes the request log, the Lease write history,
//! counters, faults and RBAC tokens.

mod admin;
mod apply;
mod auth;
mod defaults;
mod discovery;
mod faults;
mod instance;
mod observe;
mod patch;
mod request;
mod resources;
mod selectors;
mod server;
mod state;
mod status;
mod store;
mod tls;
mod validation;
mod verbs;
mod watch;
mod wire;

pub use auth::UserInfo;
pub use faults::{FaultAction, FaultSpec};
pub use instance::{Config, StartError, TestApiServer};
pub use observe::{LeaseRecord, RequestRecord};
pub use tls::TlsError;
