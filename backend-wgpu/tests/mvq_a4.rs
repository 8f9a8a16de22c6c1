//! The integer-dot mat-vec with every weight type read as 16-byte words where its rows are
//! 16-byte aligned (`TESSERA_WGPU_MVQ_A4=all`; by default only Q4_K is) gives the suite's
//! quantized mat-vec cases, plain and fused, the CPU backend's results. A test binary of its
//! own, since the setting is read once per process.

mod common;

use std::sync::Arc;

use tessera_conformance::{test, Filter, Options, Reference};
use tessera_core::Device;
use tessera_cpu::CpuDevice;

#[test]
fn sixteen_byte_weight_loads_match_the_cpu_backend() {
    // The only test of this binary: nothing else reads the environment concurrently.
    std::env::set_var("TESSERA_WGPU_MVQ_A4", "all");
    let Some(dev) = common::device() else { return };
    let cpu: Arc<dyn Device> = Arc::new(CpuDevice::new());
    let filter =
        Filter::ops("MUL_MAT,MUL_MAT_ADD_NORM,SWIGLU_MUL_MAT,RMS_NORM_MUL_MAT,QKV_ROPE_KV_ATTN")
            .with_types("q4_0,q4_1,q8_0,q6_K")
            .expect("known types");
    let options = Options {
        filter: Filter {
            skip_large: true,
            ..filter
        },
        ..Options::default()
    };
    let summary = test(&dev, &Reference::Device(cpu), &options, &mut |_| {});
    println!("{summary}");
    for f in summary.failures() {
        eprintln!("{f}");
    }
    assert!(summary.results.len() >= 10, "{}", summary.totals());
    assert_eq!(summary.failed(), 0, "{}", summary.totals());
}
