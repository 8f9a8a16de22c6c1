//! `tessera all-reduce`: the all-reduce of a meta device's parts, timed per tensor size, with
//! its bus bandwidth as nccl-tests reports it (bytes x 2(n-1)/n per second). Every size is
//! checked once against a host sum before it is timed.
//!
//! Given one CUDA device instead (`--device cuda:0`), it checks that the CUDA communicators
//! initialise and sum over a single rank: NCCL, then the peer kernel.

use std::sync::Arc;
use std::time::Instant;

use clap::Args;
use rand::{Rng, SeedableRng};
use tessera::core::{Backend, Buffer, Communicator, ReduceType};
use tessera::meta::{MetaBackend, MetaDevice, ReduceBreakdown};
use tessera::{Device, Error, Result};

use crate::load;

/// Arguments of `tessera all-reduce`.
#[derive(Args, Debug)]
pub struct AllReduceArgs {
    /// The meta device whose parts sum (`meta:cuda:0,cuda:1`, `meta:cuda:0,wgpu:0`), or one
    /// CUDA device for the single-rank check of NCCL and the peer kernel.
    #[arg(long)]
    device: String,
    /// Tensor sizes in KiB (f32).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "16,64,1024,16384,65536,262144,1048576"
    )]
    kib: Vec<usize>,
    /// Seconds to spend timing each size (at least 3 calls are timed).
    #[arg(long, default_value_t = 0.5)]
    seconds: f64,
    /// The CUDA peer kernel's scratch per rank in MiB (1 to 4096): the largest tensor it sums;
    /// larger ones go through NCCL. Raise it to time the peer kernel on the large sizes.
    #[cfg(feature = "cuda")]
    #[arg(long)]
    peer_mib: Option<usize>,
    /// Also print, per size, where a host all-reduce's time goes: each part's read start,
    /// wait and write start, and the sum (host time per call).
    #[arg(long)]
    breakdown: bool,
    /// Also time, per size, bare wgpu transfers on each wgpu part, step by step (a readback;
    /// a write through a mapped buffer; a write through the queue): what wgpu itself costs.
    #[arg(long)]
    floor: bool,
    /// wgpu parts wait for staged reads by polling in a loop instead of blocking in the
    /// driver (`WgpuOptions::spin_wait`).
    #[cfg(feature = "wgpu")]
    #[arg(long)]
    spin_wait: bool,
}

/// The environment's options, with this command's flags on top.
fn options(a: &AllReduceArgs) -> Result<tessera::Options> {
    #[allow(unused_mut)] // changed only where CUDA is compiled in
    let mut o = tessera::Options::from_env()?;
    #[cfg(feature = "cuda")]
    if let Some(mib) = a.peer_mib {
        o.cuda = o.cuda.peer_mib(mib);
    }
    #[cfg(feature = "wgpu")]
    if a.spin_wait {
        o.wgpu = o.wgpu.spin_wait(true);
    }
    #[cfg(not(any(feature = "cuda", feature = "wgpu")))]
    let _ = a;
    Ok(o)
}

/// An all-reduce to measure: a meta device's own, or a CUDA communicator with its streams.
trait Reducer {
    fn reduce(&mut self, bufs: &[(Arc<dyn Buffer>, usize)], count: usize) -> Result<()>;
    fn sync(&mut self) -> Result<()>;
    /// Turns the host all-reduce's breakdown on (emptied) or off; nothing where there is none.
    fn set_breakdown(&mut self, _on: bool) {}
    /// The breakdown since it was turned on.
    fn breakdown(&self) -> Option<ReduceBreakdown> {
        None
    }
}

impl Reducer for MetaBackend {
    fn reduce(&mut self, bufs: &[(Arc<dyn Buffer>, usize)], count: usize) -> Result<()> {
        self.all_reduce(bufs, count, ReduceType::F32)
    }

    fn sync(&mut self) -> Result<()> {
        Backend::synchronize(self)
    }

    fn set_breakdown(&mut self, on: bool) {
        self.set_reduce_breakdown(on);
    }

    fn breakdown(&self) -> Option<ReduceBreakdown> {
        self.reduce_breakdown().cloned()
    }
}

/// A communicator and one stream per rank (the single-rank CUDA check's; unused without CUDA).
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
struct Comm {
    comm: Box<dyn Communicator>,
    streams: Vec<Box<dyn Backend>>,
}

impl Reducer for Comm {
    fn reduce(&mut self, bufs: &[(Arc<dyn Buffer>, usize)], count: usize) -> Result<()> {
        self.comm
            .all_reduce(&mut self.streams, bufs, count, ReduceType::F32)
    }

    fn sync(&mut self) -> Result<()> {
        self.streams.iter_mut().try_for_each(|s| s.synchronize())
    }
}

/// Runs `tessera all-reduce`.
pub fn run(a: AllReduceArgs) -> Result<()> {
    if !a.device.trim().starts_with("meta:") {
        return single_rank(&a);
    }
    let dev = load::meta_device(&a.device, "auto", &options(&a)?)?;
    let meta = MetaDevice::from_device(dev.as_ref())
        .ok_or_else(|| Error::Invalid(format!("{} is not a meta device", a.device)))?;
    let parts = dev.parts();
    if parts.len() < 2 {
        return Err(Error::Invalid(
            "an all-reduce needs a meta device of at least two parts".into(),
        ));
    }
    let mut backend = meta.meta_backend()?;
    let label = format!(
        "{}: {} parts, all-reduce through {}",
        a.device,
        parts.len(),
        backend.all_reduce_path()
    );
    measure(&label, &parts, &mut backend, &a)
}

/// The single-rank check of the CUDA communicators.
#[cfg(feature = "cuda")]
fn single_rank(a: &AllReduceArgs) -> Result<()> {
    use tessera::cuda::{comm::nccl, CudaComm, CudaDevice};
    let dev = tessera::device(&options(a)?, a.device.trim())?;
    let cuda = dev
        .as_any()
        .downcast_ref::<CudaDevice>()
        .ok_or_else(|| Error::Invalid(format!("{} is not a meta or CUDA device", a.device)))?;
    let parts = vec![dev.clone()];
    let id = nccl::unique_id()?;
    let comm = CudaComm::join(&[cuda], &id, 0, 1)?;
    let version = comm.nccl_version().unwrap_or(0);
    let mut r = Comm {
        comm: Box::new(comm),
        streams: vec![dev.new_backend()?],
    };
    let label = format!("{}: one NCCL rank (NCCL {version})", a.device);
    measure(&label, &parts, &mut r, a)?;
    let most = a.kib.iter().max().copied().unwrap_or(1) << 10;
    let mut r = Comm {
        comm: Box::new(CudaComm::peer_only(&[cuda], most)?),
        streams: vec![dev.new_backend()?],
    };
    let label = format!("{}: one rank of the peer kernel", a.device);
    measure(&label, &parts, &mut r, a)
}

/// Without CUDA only meta devices have an all-reduce.
#[cfg(not(feature = "cuda"))]
fn single_rank(a: &AllReduceArgs) -> Result<()> {
    Err(Error::Invalid(format!(
        "{} is not a meta device (a single device needs the cuda feature)",
        a.device
    )))
}

/// Checks and times `r` over `parts` for every size of `a`, printing a table.
fn measure(
    label: &str,
    parts: &[Arc<dyn Device>],
    r: &mut dyn Reducer,
    a: &AllReduceArgs,
) -> Result<()> {
    let n = parts.len();
    println!("{label}");
    println!("| size | µs per call | algbw GB/s | busbw GB/s | calls |");
    println!("|---|---|---|---|---|");
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let mut breakdowns: Vec<(usize, ReduceBreakdown)> = Vec::new();
    for &kib in &a.kib {
        let count = kib * 256;
        let bytes = count * 4;
        let inputs: Vec<Vec<f32>> = (0..n)
            .map(|_| (0..count).map(|_| rng.gen_range(-1.0f32..1.0)).collect())
            .collect();
        let bufs = parts
            .iter()
            .map(|p| p.buffer_type().alloc(bytes).map(|b| (b, 0usize)))
            .collect::<Result<Vec<(Arc<dyn Buffer>, usize)>>>()?;
        for ((b, _), x) in bufs.iter().zip(&inputs) {
            b.set(0, bytemuck::cast_slice(x))?;
        }
        r.reduce(&bufs, count)?;
        r.sync()?;
        check(&bufs, &inputs, count)?;
        // Timed calls: the values keep growing (x n per call), which costs nothing here.
        r.set_breakdown(a.breakdown);
        let mut calls = 0usize;
        let start = Instant::now();
        while calls < 3 || start.elapsed().as_secs_f64() < a.seconds {
            r.reduce(&bufs, count)?;
            calls += 1;
            if calls.is_multiple_of(16) {
                r.sync()?;
            }
        }
        r.sync()?;
        let secs = start.elapsed().as_secs_f64() / calls as f64;
        let alg = bytes as f64 / secs / 1e9;
        let bus = alg * 2.0 * (n.max(2) - 1) as f64 / n.max(2) as f64;
        println!(
            "| {} | {:.1} | {:.1} | {:.1} | {} |",
            size_label(bytes),
            secs * 1e6,
            alg,
            bus,
            calls
        );
        if let Some(b) = r.breakdown() {
            breakdowns.push((bytes, b));
        }
        r.set_breakdown(false);
    }
    if !breakdowns.is_empty() {
        println!();
        println!("Host time per call by phase (µs):");
        for (bytes, b) in &breakdowns {
            let calls = b.calls.max(1) as f64;
            let phases: Vec<String> = b
                .phases
                .iter()
                .map(|(p, t)| format!("{p} {:.1}", t.as_secs_f64() * 1e6 / calls))
                .collect();
            println!("| {} | {} |", size_label(*bytes), phases.join(" · "));
        }
    }
    if a.floor {
        floor(parts, a)?;
    }
    Ok(())
}

/// Times bare wgpu transfers of every size on each wgpu part ([`tessera::wgpu::TransferFloor`]).
#[cfg(feature = "wgpu")]
fn floor(parts: &[Arc<dyn Device>], a: &AllReduceArgs) -> Result<()> {
    use tessera::wgpu::WgpuDevice;
    for p in parts {
        let Some(w) = p.as_any().downcast_ref::<WgpuDevice>() else {
            continue;
        };
        println!();
        println!(
            "{}: bare wgpu transfers, host time per call by step (µs)",
            p.name()
        );
        println!("| size | path | steps | total µs | GB/s |");
        println!("|---|---|---|---|---|");
        for &kib in &a.kib {
            let bytes = kib << 10;
            let calls = ((64usize << 20) / bytes.max(1)).clamp(3, 200);
            let f = w.transfer_floor(bytes, calls)?;
            for (path, steps) in [
                ("readback", &f.read),
                ("mapped write", &f.write_mapped),
                ("queue write", &f.write_queued),
            ] {
                let total = steps
                    .iter()
                    .find(|(s, _)| *s == "total")
                    .map_or(0.0, |(_, t)| t.as_secs_f64());
                let list: Vec<String> = steps
                    .iter()
                    .filter(|(s, _)| *s != "total")
                    .map(|(s, t)| format!("{s} {:.1}", t.as_secs_f64() * 1e6))
                    .collect();
                println!(
                    "| {} | {path} | {} | {:.1} | {:.1} |",
                    size_label(f.bytes),
                    list.join(" · "),
                    total * 1e6,
                    f.bytes as f64 / total.max(1e-12) / 1e9
                );
            }
        }
    }
    Ok(())
}

/// Without wgpu there is no wgpu part to time.
#[cfg(not(feature = "wgpu"))]
fn floor(_parts: &[Arc<dyn Device>], _a: &AllReduceArgs) -> Result<()> {
    println!("skipped the wgpu transfer floor: built without the wgpu feature");
    Ok(())
}

/// Checks every part holds the sum of the inputs, to within the rounding of each term to f16
/// (what the peer kernel sends with `CudaOptions::peer_f16`), and that every part holds the
/// same values.
fn check(bufs: &[(Arc<dyn Buffer>, usize)], inputs: &[Vec<f32>], count: usize) -> Result<()> {
    let want: Vec<(f64, f64)> = (0..count)
        .map(|i| {
            let sum = inputs.iter().map(|x| f64::from(x[i])).sum();
            let tol = 1e-5 + inputs.iter().map(|x| f64::from(x[i].abs())).sum::<f64>() / 2048.0;
            (sum, tol)
        })
        .collect();
    let mut first: Option<Vec<f32>> = None;
    for (j, (b, _)) in bufs.iter().enumerate() {
        let mut got = vec![0f32; count];
        b.get(0, bytemuck::cast_slice_mut(&mut got))?;
        if let Some(i) = (0..count).find(|&i| (f64::from(got[i]) - want[i].0).abs() > want[i].1) {
            return Err(Error::Invalid(format!(
                "all-reduce wrong on part {j} at element {i}: {} instead of {}",
                got[i], want[i].0
            )));
        }
        match &first {
            Some(f) if f != &got => {
                return Err(Error::Invalid(format!("all-reduce parts 0 and {j} differ")))
            }
            Some(_) => {}
            None => first = Some(got),
        }
    }
    Ok(())
}

fn size_label(bytes: usize) -> String {
    if bytes >= 1 << 30 {
        format!("{} GiB", bytes >> 30)
    } else if bytes >= 1 << 20 {
        format!("{} MiB", bytes >> 20)
    } else {
        format!("{} KiB", bytes >> 10)
    }
}
