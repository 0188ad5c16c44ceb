//! A controller's life on its control-plane thread (core).
