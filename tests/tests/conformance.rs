//! The whole case table on the CPU backend against the independent f64 reference.

use std::sync::Arc;

use tessera_conformance::{test, Options, Reference};
use tessera_core::Device;
use tessera_cpu::CpuDevice;

#[test]
fn cpu_matches_the_f64_reference() {
    let cpu: Arc<dyn Device> = Arc::new(CpuDevice::new());
    let start = std::time::Instant::now();
    let summary = test(&cpu, &Reference::F64, &Options::default(), &mut |_| {});
    println!("{summary}");
    println!("{} cases in {:.1} s", summary.results.len(), start.elapsed().as_secs_f64());
    for f in summary.failures() {
        eprintln!("{f}");
    }
    assert_eq!(summary.failed(), 0, "{}", summary.totals());
    assert_eq!(summary.skipped(), 0, "{}", summary.totals());
}
