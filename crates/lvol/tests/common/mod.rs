//! Helpers shared by fp-lvol's integration tests. Each test binary uses part of them.
#![allow(dead_code)]

pub mod recording_bdev;
