//! The NVMe/TCP transport: the host side (tcp).
