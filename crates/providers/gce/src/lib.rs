//! GCE cloud provider: not implemented yet.
