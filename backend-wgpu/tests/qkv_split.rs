//! The QKV mat-vec with its K/V workgroups split between K and V rows
//! (`TESSERA_WGPU_QKV_SPLIT=1`, off by default) gives the suite's fused Q/K/V cases the CPU
//! backend's results. The suite's shapes are small enough that the default shape rule gives
//! them 2-row workgroups, which never split: every product is given 16-row workgroups here
//! (`TESSERA_WGPU_MVQ=16,512`). A test binary of its own, since both settings are read once
//! per process.

mod common;

use std::sync::Arc;

use tessera_conformance::{test, Filter, Options, Reference};
use tessera_core::Device;
use tessera_cpu::CpuDevice;

#[test]
fn split_kv_workgroups_match_the_cpu_backend() {
    // The only test of this binary: nothing else reads the environment concurrently.
    std::env::set_var("TESSERA_WGPU_QKV_SPLIT", "1");
    std::env::set_var("TESSERA_WGPU_MVQ", "16,512");
    let Some(dev) = common::device() else { return };
    let cpu: Arc<dyn Device> = Arc::new(CpuDevice::new());
    let options = Options {
        filter: Filter::ops("RMS_NORM_MUL_MAT,QKV_ROPE_KV_ATTN"),
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
