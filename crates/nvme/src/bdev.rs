//! Namespaces as block devices (core).
