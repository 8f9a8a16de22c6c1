//! The whole case table on the CPU backend against the independent f64 reference, and every
//! other device the facade finds (with the features this crate is built with) against the CPU.

use std::sync::Arc;

use tessera_conformance::{test, test_registry, Filter, Options, Reference, Status};
use tessera_core::Device;
use tessera_cpu::CpuDevice;

#[test]
fn cpu_matches_the_f64_reference() {
    let cpu: Arc<dyn Device> = Arc::new(CpuDevice::new());
    let start = std::time::Instant::now();
    let summary = test(&cpu, &Reference::F64, &Options::default(), &mut |_| {});
    println!("{summary}");
    println!(
        "{} cases in {:.1} s",
        summary.results.len(),
        start.elapsed().as_secs_f64()
    );
    for f in summary.failures() {
        eprintln!("{f}");
    }
    assert_eq!(summary.failed(), 0, "{}", summary.totals());
    assert_eq!(summary.skipped(), 0, "{}", summary.totals());
}

/// The default CPU mul_mat quantizes activations, the reference does not: the difference is
/// within mul_mat's threshold (above). In precise mode it must all but vanish.
#[test]
fn precise_cpu_mul_mat_matches_the_reference_closely() {
    let cpu: Arc<dyn Device> = Arc::new(CpuDevice::new().with_precise(true));
    let options = Options {
        filter: Filter::ops("MUL_MAT"),
        ..Options::default()
    };
    let summary = test(&cpu, &Reference::F64, &options, &mut |_| {});
    for r in &summary.results {
        assert_eq!(r.status, Status::Passed, "{r}");
        assert!(
            r.nmse.unwrap_or(1.0) < 1e-9,
            "precise mode is not precise: {r}"
        );
    }
}

#[test]
fn every_other_device_matches_the_cpu() {
    let registry = tessera::registry();
    for summary in test_registry(&registry, &Options::default(), &mut |_| {}) {
        if summary.device == "cpu" {
            continue; // the test above
        }
        println!("{summary}");
        assert_eq!(
            summary.failed(),
            0,
            "{}: {}",
            summary.device,
            summary.totals()
        );
    }
}

/// Every GPU device (a software Vulkan adapter included) against the f64 reference too, where
/// one is present: the CPU comparison
/// above cannot see an error the two backends share. A device that is absent is reported as
/// skipped by name.
#[test]
fn every_gpu_matches_the_f64_reference() {
    let registry = tessera::registry();
    let gpus: Vec<_> = registry
        .devices()
        .into_iter()
        .filter(|d| {
            use tessera_core::DeviceKind::{Gpu, IGpu, Software};
            matches!(d.kind(), Gpu | IGpu | Software)
        })
        .collect();
    if gpus.is_empty() {
        println!("skipped: no GPU device (cuda or wgpu) in this build or on this machine");
    }
    for dev in gpus {
        let summary = test(&dev, &Reference::F64, &Options::default(), &mut |_| {});
        println!("{summary}");
        for f in summary.failures() {
            eprintln!("{f}");
        }
        assert_eq!(
            summary.failed(),
            0,
            "{}: {}",
            summary.device,
            summary.totals()
        );
    }
}
