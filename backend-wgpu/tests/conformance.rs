//! The conformance suite's whole case table on the first wgpu adapter against the f64
//! reference. `TESSERA_OPS=add,mul_mat` limits it to some ops.

mod common;

use tessera_conformance::{test, Filter, Options, Reference};

#[test]
fn wgpu_matches_the_f64_reference() {
    let Some(dev) = common::device() else { return };
    let filter = match std::env::var("TESSERA_OPS") {
        Ok(list) => Filter::ops(&list),
        Err(_) => Filter::all(),
    };
    let options = Options { filter, ..Options::default() };
    let start = std::time::Instant::now();
    let summary = test(&dev, &Reference::F64, &options, &mut |_| {});
    println!("{summary}");
    println!("{} cases in {:.1} s", summary.results.len(), start.elapsed().as_secs_f64());
    for f in summary.failures() {
        eprintln!("{f}");
    }
    assert_eq!(summary.failed(), 0, "{}", summary.totals());
}
