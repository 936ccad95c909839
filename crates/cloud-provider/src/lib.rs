//! The CloudProvider trait (see issue 5).
