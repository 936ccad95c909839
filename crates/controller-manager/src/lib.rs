//! Controller manager runtime (see issues 4 and 5).
