//! The perf mode runs and reports sensible numbers.

use std::sync::Arc;

use tessera_conformance::{perf, Filter};
use tessera_core::Device;
use tessera_cpu::CpuDevice;

#[test]
fn perf_times_a_case() {
    let cpu: Arc<dyn Device> = Arc::new(CpuDevice::new());
    let filter = Filter {
        name: "type_a=f32,type_b=f32,m=16,n=67,k=256,bs=[1,1]".into(),
        ..Filter::ops("MUL_MAT")
    };
    let r = perf(&cpu, &filter, &mut |r| println!("{r}"));
    assert_eq!(r.len(), 1);
    assert!(r[0].skipped.is_none(), "{}", r[0]);
    assert!(r[0].runs >= 1 && r[0].us_per_run > 0.0 && r[0].gb_per_s > 0.0);
    assert!(r[0].gflop_per_s.unwrap_or(0.0) > 0.0);
}
