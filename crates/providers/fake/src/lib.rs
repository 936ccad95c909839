//! The fake cloud provider (see issue 5).
