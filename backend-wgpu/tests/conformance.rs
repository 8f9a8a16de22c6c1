//! The conformance suite's whole case table on the first wgpu adapter, against the f64
//! reference and against the CPU backend (what `tessera ops test --backend wgpu` does).
//! `TESSERA_OPS=add,mul_mat` limits it to some ops.

mod common;

use std::sync::Arc;

use tessera_conformance::{test, Filter, Options, Reference};
use tessera_core::Device;
use tessera_cpu::CpuDevice;

/// Runs the suite on the wgpu device against `reference`; fails on any failed case.
fn run(reference: Reference, what: &str) {
    let Some(dev) = common::device() else { return };
    let filter = match std::env::var("TESSERA_OPS") {
        Ok(list) => Filter::ops(&list),
        Err(_) => Filter::all(),
    };
    let options = Options {
        filter,
        ..Options::default()
    };
    let start = std::time::Instant::now();
    let summary = test(&dev, &reference, &options, &mut |_| {});
    println!("{summary}");
    println!(
        "{} cases against {what} in {:.1} s",
        summary.results.len(),
        start.elapsed().as_secs_f64()
    );
    for f in summary.failures() {
        eprintln!("{f}");
    }
    assert_eq!(summary.failed(), 0, "{}", summary.totals());
}

#[test]
fn wgpu_matches_the_f64_reference() {
    run(Reference::F64, "the f64 reference");
}

#[test]
fn wgpu_matches_the_cpu_backend() {
    let cpu: Arc<dyn Device> = Arc::new(CpuDevice::new());
    run(Reference::Device(cpu), "the CPU backend");
}
