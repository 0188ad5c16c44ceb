//! The command-id table every queue keeps (core).
