//! The shaders of the `read_peak` and `coop_peak` benches, shared with the test that validates
//! them (`tests/bench_shaders.rs`).
#![allow(dead_code)]

pub mod coop;
pub mod read;
