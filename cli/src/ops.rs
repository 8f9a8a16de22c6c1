//! `tessera ops test` and `tessera ops perf`: the conformance suite and op benchmarks.

use std::sync::Arc;

use clap::{Args, Subcommand};
use tessera::cpu::CpuDevice;
use tessera::meta::{InputPolicy, MetaDevice};
use tessera::{Device, Error, Result};
use tessera_conformance::{perf, test, test_registry, Filter, Options, Reference, Summary};

/// The ops subcommands.
#[derive(Subcommand, Debug)]
pub enum OpsCommand {
    /// Run every op case on a backend and compare it with the reference.
    Test(OpsArgs),
    /// Time op cases (each repeated for about a second).
    Perf(OpsArgs),
}

/// Which device and cases.
#[derive(Args, Debug)]
pub struct OpsArgs {
    /// Device or backend to test (cpu, cuda, cuda:0, wgpu:0, meta:cpu,cpu); every device when
    /// absent. The CPU is checked against an independent f64 implementation, every other device
    /// against the CPU.
    #[arg(long)]
    backend: Option<String>,
    /// Only these ops (comma-separated, e.g. MUL_MAT,rope).
    #[arg(long)]
    op: Option<String>,
    /// Only cases involving these types (comma-separated, e.g. q4_0,f16).
    #[arg(long = "type")]
    types: Option<String>,
    /// Only cases whose name contains this.
    #[arg(long)]
    name: Option<String>,
    /// Skip the large cases (automatic on software adapters).
    #[arg(long)]
    skip_large: bool,
    /// A meta backend's split: auto or a share per part (0.6,0.4).
    #[arg(long, default_value = "auto")]
    split: String,
}

impl OpsArgs {
    fn filter(&self) -> Result<Filter> {
        let mut f = match &self.op {
            Some(o) => Filter::ops(o),
            None => Filter::all(),
        };
        if let Some(t) = &self.types {
            f = f.with_types(t)?;
        }
        if let Some(n) = &self.name {
            f.name = n.clone();
        }
        f.skip_large = self.skip_large;
        Ok(f)
    }
}

/// The device under test. A meta device (`meta:cpu,cpu`) splits each case's inputs as far as
/// its ops allow; a case that cannot be split at all is skipped with the reason.
fn device(spec: &str, split: &str) -> Result<Arc<dyn Device>> {
    if spec == "cpu" {
        return Ok(Arc::new(CpuDevice::new()));
    }
    let options = tessera::Options::from_env()?;
    if spec.starts_with("meta:") {
        let dev = crate::load::meta_device(spec, split, &options)?;
        let meta = MetaDevice::from_device(dev.as_ref())
            .ok_or_else(|| Error::Invalid(format!("{spec} is not a meta device")))?;
        return Ok(Arc::new(meta.with_input_policy(InputPolicy::MostSplit)));
    }
    tessera::device(&options, spec)
}

/// Runs an ops subcommand.
pub fn run(cmd: OpsCommand) -> Result<()> {
    match cmd {
        OpsCommand::Test(a) => run_test(a),
        OpsCommand::Perf(a) => run_perf(a),
    }
}

fn print_line(r: &tessera_conformance::CaseResult) {
    println!("{r}");
}

fn run_test(a: OpsArgs) -> Result<()> {
    let options = Options {
        filter: a.filter()?,
        ..Options::default()
    };
    let summaries: Vec<Summary> = match &a.backend {
        None => test_registry(
            &tessera::registry_with(&tessera::Options::from_env()?),
            &options,
            &mut print_line,
        ),
        Some(spec) => {
            let dev = device(spec, &a.split)?;
            let reference = if dev.kind() == tessera::core::DeviceKind::Cpu {
                Reference::F64
            } else {
                Reference::Device(Arc::new(CpuDevice::new()))
            };
            let mut opts = options.clone();
            opts.filter.skip_large |= dev.kind() == tessera::core::DeviceKind::Software;
            println!(
                "device {} vs {}",
                dev.name(),
                if matches!(reference, Reference::F64) {
                    "f64 reference"
                } else {
                    "cpu"
                }
            );
            vec![test(&dev, &reference, &opts, &mut print_line)]
        }
    };
    let (mut p, mut f, mut s) = (0, 0, 0);
    for sm in &summaries {
        if a.backend.is_none() {
            println!("{}: {}", sm.device, sm.totals());
        }
        p += sm.passed();
        f += sm.failed();
        s += sm.skipped();
    }
    println!("{p} passed, {f} failed, {s} skipped");
    if f > 0 {
        return Err(Error::Invalid(format!("{f} op cases failed")));
    }
    if p == 0 {
        return Err(Error::Invalid("no op case ran (check the filters)".into()));
    }
    Ok(())
}

fn run_perf(a: OpsArgs) -> Result<()> {
    let dev = device(a.backend.as_deref().unwrap_or("cpu"), &a.split)?;
    let filter = a.filter()?;
    println!("perf on {}", dev.name());
    #[cfg(feature = "wgpu")]
    tessera::wgpu::set_gpu_timing(true);
    let results = perf(&dev, &filter, &mut |r| println!("{r}{}", gpu_time(r)));
    if results.is_empty() {
        return Err(Error::Invalid("no perf case matched the filters".into()));
    }
    Ok(())
}

/// The GPU time of the case just timed where the device measured it with timestamp queries
/// (wgpu with TIMESTAMP_QUERY): the median over its runs (the warm-up run included) and that
/// as GB/s; empty elsewhere (the wall time stands).
fn gpu_time(r: &tessera_conformance::PerfResult) -> String {
    #[cfg(feature = "wgpu")]
    {
        let mut t = tessera::wgpu::take_gpu_times();
        t.sort_unstable();
        if let Some(median) = t.get(t.len() / 2) {
            let us = median.as_secs_f64() * 1e6;
            if r.skipped.is_none() && us > 0.0 {
                let gb = r.gb_per_s * r.us_per_run / us;
                return format!(" | GPU median {us:.2} us/run, {gb:.2} GB/s");
            }
        }
    }
    let _ = r;
    String::new()
}
