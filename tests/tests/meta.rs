//! The meta layer on CPU parts: the conformance cases that can be split, on meta devices of 2
//! and 3 CPU devices with uneven ratios, against the CPU; sharded buffers; split errors.

use std::sync::Arc;

use tessera_conformance::{test, Options, Reference, Status, Summary};
use tessera_core::meta::{InputPolicy, MetaDevice, SplitRatios};
use tessera_core::Device;
use tessera_cpu::CpuDevice;

fn cpu() -> Arc<dyn Device> {
    Arc::new(CpuDevice::new().with_threads(1))
}

fn meta(ratios: &[f64]) -> Arc<dyn Device> {
    let parts = ratios.iter().map(|_| cpu()).collect();
    let m = MetaDevice::new(parts, &SplitRatios::Given(ratios.to_vec())).expect("a meta device of CPUs");
    Arc::new(m.with_input_policy(InputPolicy::MostSplit))
}

fn conformance(ratios: &[f64]) -> Summary {
    let dev = meta(ratios);
    let start = std::time::Instant::now();
    let summary = test(&dev, &Reference::Device(cpu()), &Options::default(), &mut |_| {});
    println!("{summary}");
    println!("{} cases in {:.1} s", summary.results.len(), start.elapsed().as_secs_f64());
    for r in &summary.results {
        if let Status::Skipped(_) = r.status {
            println!("{r}");
        }
    }
    for f in summary.failures() {
        eprintln!("{f}");
    }
    summary
}

#[test]
fn splittable_cases_match_the_cpu_on_two_cpu_parts() {
    let s = conformance(&[0.7, 0.3]);
    assert_eq!(s.failed(), 0, "{}", s.totals());
}
