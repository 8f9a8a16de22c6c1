//! tessera-conformance: the cross-backend conformance suite, modelled on ggml's
//! `test-backend-ops`.
//!
//! - [`cases()`] is the case table: every op of [`tessera_core::Op`] over types and shapes
//!   (views, broadcasting, quantized types included). [`perf_cases()`] adds the perf-only cases
//!   that `BENCHMARKS.md` needs.
//! - [`test()`] runs cases on a device under test and on a [`Reference`] (another device, or the
//!   independent f64 implementation in [`reference`](mod@crate::reference)) from bit-identical random inputs, and
//!   compares the outputs by NMSE ([`Tolerance`]). Every root tensor is bound by the runner in
//!   one buffer with a sentinel after it; computed tensors are poisoned with NaN bytes before the
//!   run; a write outside a tensor, a changed input, a NaN or an infinity in the wrong place fails
//!   the case. A device that cannot run a case reports it skipped, with the reason.
//! - [`test_registry()`] does that for every device of a registry: the CPU against the f64
//!   reference, every other device against the CPU; a backend without devices is reported
//!   skipped by name ([`Summary::absent`]).
//! - [`nmse()`] is the suite's error metric, for the backends' own tests.
//! - [`perf()`] repeats cases for about a second each and reports time, GB/s and GFLOP/s.
//!
//! The CLI's `tessera ops test` and `tessera ops perf` are thin wrappers over these.
#![warn(missing_docs)]

mod case;
pub mod cases;
mod compare;
mod exec;
mod filter;
mod init;
mod perf;
pub mod reference;
mod report;
mod runner;
mod tensor_io;

pub use case::{Case, CaseGraph, Tolerance};
pub use cases::{cases, perf_cases};
pub use compare::nmse;
pub use filter::Filter;
pub use init::Init;
pub use perf::{perf, PerfResult};
pub use reference::RefDevice;
pub use report::{CaseResult, Status, Summary};
pub use runner::{test, test_cases, test_registry, Options, Reference};
