//! The test mode: each case on the device under test and on the reference, from the same
//! seeded inputs, compared.

use std::sync::Arc;

use tessera_core::{Device, DeviceKind, Registry};

use crate::case::Case;
use crate::cases::cases;
use crate::compare::compare;
use crate::exec::{execute, Stop};
use crate::filter::Filter;
use crate::reference::RefDevice;
use crate::report::{CaseResult, Status, Summary};

/// What the device under test is compared with.
#[derive(Clone)]
pub enum Reference {
    /// The independent f64 implementation in [`crate::reference`].
    F64,
    /// Another device (normally the CPU backend).
    Device(Arc<dyn Device>),
}

impl Reference {
    fn device(&self) -> Arc<dyn Device> {
        match self {
            Reference::F64 => Arc::new(RefDevice),
            Reference::Device(d) => d.clone(),
        }
    }
}

/// How to run the suite.
#[derive(Clone, Debug, PartialEq)]
pub struct Options {
    /// Which cases.
    pub filter: Filter,
    /// Seed of the random inputs (each case mixes in its name, so a filter changes nothing).
    pub seed: u64,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            filter: Filter::all(),
            seed: 42,
        }
    }
}

/// Runs the case table ([`cases()`]) on `device` against `reference`, calling `on_result`
/// after each case (for progress output).
pub fn test(
    device: &Arc<dyn Device>,
    reference: &Reference,
    options: &Options,
    on_result: &mut dyn FnMut(&CaseResult),
) -> Summary {
    test_cases(&cases(), device, reference, options, on_result)
}

/// Runs the given cases (those the filter selects) on `device` against `reference`.
pub fn test_cases(
    cases: &[Case],
    device: &Arc<dyn Device>,
    reference: &Reference,
    options: &Options,
    on_result: &mut dyn FnMut(&CaseResult),
) -> Summary {
    let ref_device = reference.device();
    let mut summary = Summary {
        device: device.name(),
        reference: match reference {
            Reference::F64 => "f64 reference".into(),
            Reference::Device(d) => d.name(),
        },
        results: Vec::new(),
    };
    for case in cases.iter().filter(|c| options.filter.matches(c)) {
        let r = run_case(case, device.as_ref(), ref_device.as_ref(), options.seed);
        on_result(&r);
        summary.results.push(r);
    }
    summary
}

/// Runs the case table on every device of a registry: the CPU (`cpu`) against the f64
/// reference, every other device against the CPU (or the f64 reference when there is no CPU).
/// A backend without devices gives a [`Summary::absent`] naming it. Software devices skip the
/// large cases.
pub fn test_registry(
    registry: &Registry,
    options: &Options,
    on_result: &mut dyn FnMut(&CaseResult),
) -> Vec<Summary> {
    let cpu = registry.find("cpu").ok();
    let mut out = Vec::new();
    for b in registry.backends() {
        let devices = match &b.devices {
            Ok(d) if d.is_empty() => {
                out.push(Summary::absent(b.backend, "the backend found no devices"));
                continue;
            }
            Ok(d) => d,
            Err(why) => {
                out.push(Summary::absent(b.backend, why));
                continue;
            }
        };
        for d in devices {
            let reference = match &cpu {
                Some(c) if c.name() != d.name() => Reference::Device(c.clone()),
                _ => Reference::F64,
            };
            let mut opts = options.clone();
            opts.filter.skip_large |= d.kind() == DeviceKind::Software;
            out.push(test(d, &reference, &opts, on_result));
        }
    }
    out
}

/// FNV-1a of a case name: the per-case part of the seed.
fn name_hash(name: &str) -> u64 {
    name.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ b as u64).wrapping_mul(0x100_0000_01b3)
    })
}

fn run_case(case: &Case, device: &dyn Device, reference: &dyn Device, seed: u64) -> CaseResult {
    let name = case.name();
    let seed = seed ^ name_hash(&name);
    let tol = case.tolerance();
    let mut result = CaseResult {
        name,
        op: case.op().to_string(),
        status: Status::Passed,
        nmse: None,
        threshold: tol.threshold(),
    };
    let out = match execute(device, case, seed) {
        Ok(v) => v,
        Err(stop) => {
            result.status = status(stop, "");
            return result;
        }
    };
    let expected = match execute(reference, case, seed) {
        Ok(v) => v,
        Err(stop) => {
            result.status = status(stop, "reference: ");
            return result;
        }
    };
    let c = compare(&expected, &out, tol);
    result.nmse = Some(c.nmse);
    if let Some(why) = c.failure {
        result.status = Status::Failed(why);
    }
    result
}

fn status(stop: Stop, prefix: &str) -> Status {
    match stop {
        Stop::Skip(why) => Status::Skipped(format!("{prefix}{why}")),
        Stop::Fail(why) => Status::Failed(format!("{prefix}{why}")),
    }
}
