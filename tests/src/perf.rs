//! The perf mode: each case repeated for about a second of work.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tessera_core::Device;

use crate::cases::perf_cases;
use crate::exec::{backend, bytes_moved, prepare, run, Stop};
use crate::filter::Filter;

/// How long each case is repeated for.
const TARGET: Duration = Duration::from_secs(1);

/// The timing of one case.
#[derive(Clone, Debug, PartialEq)]
pub struct PerfResult {
    /// The case's name.
    pub name: String,
    /// Runs timed (0 when skipped or failed).
    pub runs: usize,
    /// Microseconds per run.
    pub us_per_run: f64,
    /// Gigabytes read and written per second.
    pub gb_per_s: f64,
    /// GFLOP/s, for the cases where flops are the measure (mul_mat, flash_attn_ext).
    pub gflop_per_s: Option<f64>,
    /// Why the case was not timed, if it was not.
    pub skipped: Option<String>,
}

impl std::fmt::Display for PerfResult {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if let Some(why) = &self.skipped {
            return write!(f, "  {}: skipped ({why})", self.name);
        }
        write!(
            f,
            "  {}: {} runs, {:.2} us/run, {:.2} GB/s",
            self.name, self.runs, self.us_per_run, self.gb_per_s
        )?;
        if let Some(g) = self.gflop_per_s {
            write!(f, ", {g:.2} GFLOP/s")?;
        }
        Ok(())
    }
}

/// Times the perf table ([`perf_cases()`]) cases that `filter` selects on `device`, calling
/// `on_result` after each.
pub fn perf(
    device: &Arc<dyn Device>,
    filter: &Filter,
    on_result: &mut dyn FnMut(&PerfResult),
) -> Vec<PerfResult> {
    let mut out = Vec::new();
    for case in perf_cases().iter().filter(|c| filter.matches(c)) {
        let mut r = PerfResult {
            name: case.name(),
            runs: 0,
            us_per_run: 0.0,
            gb_per_s: 0.0,
            gflop_per_s: None,
            skipped: None,
        };
        match time_case(device.as_ref(), case) {
            Ok((runs, per_run, bytes)) => {
                let secs = per_run.as_secs_f64().max(1e-12);
                r.runs = runs;
                r.us_per_run = secs * 1e6;
                r.gb_per_s = bytes as f64 / secs / 1e9;
                r.gflop_per_s = (case.flops() > 0.0).then(|| case.flops() / secs / 1e9);
            }
            Err(Stop::Skip(why)) => r.skipped = Some(why),
            Err(Stop::Fail(why)) => r.skipped = Some(format!("failed: {why}")),
        }
        on_result(&r);
        out.push(r);
    }
    out
}

/// Runs a case repeatedly; returns the runs, the time per run and the bytes of one run.
fn time_case(device: &dyn Device, case: &crate::Case) -> Result<(usize, Duration, usize), Stop> {
    let p = prepare(device, case, 42)?;
    let mut b = backend(device)?;
    let start = Instant::now();
    run(b.as_mut(), &p)?; // warm-up, and the first estimate
    let first = start.elapsed().max(Duration::from_micros(1));
    let runs = (TARGET.as_secs_f64() / first.as_secs_f64())
        .ceil()
        .clamp(1.0, 1e6) as usize;
    let start = Instant::now();
    for _ in 0..runs {
        b.compute(&p.graph, &p.nodes)
            .map_err(|e| Stop::Fail(e.to_string()))?;
    }
    b.synchronize().map_err(|e| Stop::Fail(e.to_string()))?;
    Ok((runs, start.elapsed() / runs as u32, bytes_moved(&p.graph)))
}
