//! Test API server (see issue 3).
