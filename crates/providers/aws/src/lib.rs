//! AWS cloud provider: not implemented yet.
//!
//! The crate exists so the workspace layout is final; the AWS SDK is added here, and only here, when the
//! provider is implemented, so that no other crate rebuilds it.
