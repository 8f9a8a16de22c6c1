//! Aggregate decode speed of many sequences decoded together, as llama.cpp's
//! `llama-batched-bench` measures it: for each batch size B, B sequences of `n_prompt` random
//! tokens are evaluated in one step, then `n_gen` steps of one token per sequence.
//!
//! ```text
//! cargo run --release [--features cuda|wgpu] --example batched_bench -- \
//!     MODEL.gguf [DEVICE=auto] [N_PROMPT=128] [N_GEN=128] [BATCHES=1,4,16,64] [GROUPS=1] \
//!     [SPLIT] [--wgpu-old-mat-vec] [--wgpu-mat-vec-n=N] [--cuda-few-columns=KERNELS]
//! ```
//!
//! With a meta device and SPLIT (ratios such as `0.5,0.5`), the model is split by layers in
//! those ratios. With GROUPS=2 each decode step carries the sequences as two groups in flight
//! at once (`BatchContext::decode_groups`: on a layer split, one part runs a group's layers
//! while another runs the other group's).
//!
//! `--wgpu-old-mat-vec` (anywhere among the arguments; with the wgpu feature) turns
//! `WgpuOptions::mat_vec_quantize_once` off: the integer-dot mat-vec of several columns has
//! every workgroup quantize its columns itself, as before the columns were quantized once (an
//! A/B of the two routes in one run of the GPU). `--wgpu-mat-vec-n=N` sets
//! `WgpuOptions::mat_vec_n`: the integer-dot mat-vec takes up to N columns (past it, the
//! mat-mat). `--cuda-few-columns=direct16|direct32|staged` (with the cuda feature) sets
//! `CudaOptions::few_columns`: which kernels multiply quantized weights by 2 to 32 columns.
//!
//! Prints one `RESULT` line per batch size: prompt and decode tokens per second over all
//! sequences, and the decode time per step.

use std::sync::Arc;
use std::time::Instant;

use rand::{Rng, SeedableRng};
use tessera::cpu::CpuDevice;
use tessera::meta::{SplitMode, SplitRatios};
use tessera::{Device, Options};
use tessera_llm::batch::{BatchContext, BatchParams, Output, SeqTokens};
use tessera_llm::Model;

fn arg<T: std::str::FromStr>(args: &[String], i: usize, default: T) -> T {
    args.get(i).and_then(|a| a.parse().ok()).unwrap_or(default)
}

fn main() -> tessera::Result<()> {
    // RUST_LOG=tessera_cuda=debug with TESSERA_CUDA_PROFILE=1 logs the GPU time per kernel.
    env_logger::init();
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let old_mat_vec = args.iter().any(|a| a == "--wgpu-old-mat-vec");
    let mat_vec_n = args
        .iter()
        .find_map(|a| a.strip_prefix("--wgpu-mat-vec-n="))
        .map(|n| n.parse::<usize>().unwrap_or(0));
    let few_columns = args
        .iter()
        .find_map(|a| a.strip_prefix("--cuda-few-columns="))
        .map(str::to_string);
    args.retain(|a| {
        a != "--wgpu-old-mat-vec"
            && !a.starts_with("--wgpu-mat-vec-n=")
            && !a.starts_with("--cuda-few-columns=")
    });
    if few_columns.is_some() && !cfg!(feature = "cuda") {
        eprintln!("--cuda-few-columns needs the cuda feature");
        std::process::exit(2);
    }
    if mat_vec_n == Some(0) || ((old_mat_vec || mat_vec_n.is_some()) && !cfg!(feature = "wgpu")) {
        eprintln!("--wgpu-mat-vec-n takes a column count; both --wgpu flags need the wgpu feature");
        std::process::exit(2);
    }
    let Some(path) = args.first() else {
        eprintln!("usage: batched_bench MODEL.gguf [DEVICE] [N_PROMPT] [N_GEN] [B,B,...]");
        std::process::exit(2);
    };
    let spec = args.get(1).map_or("auto", String::as_str);
    let (n_prompt, n_gen) = (arg(&args, 2, 128usize), arg(&args, 3, 128usize));
    let batches: Vec<usize> = args
        .get(4)
        .map_or("1,4,16,64", String::as_str)
        .split(',')
        .filter_map(|b| b.trim().parse().ok())
        .collect();
    let max_b = batches.iter().copied().max().unwrap_or(1);
    let groups = arg(&args, 5, 1usize).clamp(1, 2);

    let mut options = Options::from_env()?;
    #[cfg(feature = "wgpu")]
    {
        options.wgpu.mat_vec_quantize_once = !old_mat_vec;
        if let Some(n) = mat_vec_n {
            options.wgpu.mat_vec_n = n;
        }
    }
    #[cfg(feature = "cuda")]
    if let Some(k) = &few_columns {
        use tessera::cuda::FewColumns;
        let kernels = match k.as_str() {
            "direct16" => FewColumns::Direct16,
            "direct32" => FewColumns::Direct32,
            "staged" => FewColumns::Staged,
            other => {
                eprintln!("--cuda-few-columns takes direct16, direct32 or staged, not {other}");
                std::process::exit(2);
            }
        };
        options.cuda = options.cuda.clone().few_columns(kernels);
    }
    let cpu: Arc<dyn Device> = Arc::new(CpuDevice::with_options(&options.cpu));
    let device = match args.get(6) {
        _ if spec == "cpu" => cpu.clone(),
        Some(split) if spec.starts_with("meta:") => {
            options.meta.split_mode = SplitMode::Layer;
            tessera::meta_device(&options, spec, &SplitRatios::parse(split)?)?
        }
        _ => tessera::device(&options, spec)?,
    };
    let model = Arc::new(Model::load(path, device.clone(), cpu, &mut |_, _| {})?);
    let params = BatchParams {
        n_ctx: n_prompt + n_gen,
        n_seq: max_b,
        // One step holds every prompt of the largest batch.
        n_ubatch: (n_prompt * max_b).max(1),
        ..BatchParams::default()
    };
    let mut ctx = BatchContext::new(model.clone(), params)?;
    // The settings the flags changed, after the device's name.
    let mut label = String::new();
    if old_mat_vec {
        label.push_str(" route=old");
    }
    if let Some(n) = mat_vec_n {
        label.push_str(&format!(" mat_vec_n={n}"));
    }
    if let Some(k) = &few_columns {
        label.push_str(&format!(" few_columns={k}"));
    }
    let mut rng = rand::rngs::StdRng::seed_from_u64(1);
    let n_vocab = model.config.n_vocab as u32;
    for &b in &batches {
        // A first, short round builds the step graphs of this batch size (and compiles what the
        // device compiles on first use), so that the timed round measures the steady state.
        run(&mut ctx, &mut rng, n_vocab, b, n_prompt, 2, groups)?;
        let (pp, tg) = run(&mut ctx, &mut rng, n_vocab, b, n_prompt, n_gen, groups)?;
        println!(
            "RESULT device={}{} B={b} groups={groups} n_prompt={n_prompt} n_gen={n_gen} pp_tps={:.1} tg_tps={:.1} step_ms={:.2}",
            device.name(),
            label,
            (b * n_prompt) as f64 / pp,
            (b * n_gen) as f64 / tg,
            tg * 1e3 / n_gen as f64
        );
    }
    Ok(())
}

/// `b` sequences of `n_prompt` random tokens evaluated in one step, then `n_gen` greedy steps
/// over all of them (as `groups` groups in flight): the seconds of the prompt step and of the
/// generation steps.
fn run(
    ctx: &mut BatchContext,
    rng: &mut rand::rngs::StdRng,
    n_vocab: u32,
    b: usize,
    n_prompt: usize,
    n_gen: usize,
    groups: usize,
) -> tessera::Result<(f64, f64)> {
    let seqs: Vec<u32> = (0..b).map(|_| ctx.add_seq()).collect();
    let prompts: Vec<Vec<u32>> = (0..b)
        .map(|_| (0..n_prompt).map(|_| rng.gen_range(0..n_vocab)).collect())
        .collect();
    fn step<'a>(seqs: &[u32], tokens: &'a [Vec<u32>]) -> Vec<SeqTokens<'a>> {
        seqs.iter()
            .zip(tokens)
            .map(|(&seq, t)| SeqTokens {
                seq,
                tokens: t,
                output: Output::Last,
            })
            .collect()
    }
    let t0 = Instant::now();
    let mut logits = ctx.decode(&step(&seqs, &prompts))?;
    let pp = t0.elapsed().as_secs_f64();
    let t1 = Instant::now();
    for _ in 0..n_gen {
        // Greedy: each sequence's next token is its argmax.
        let next: Vec<Vec<u32>> = logits
            .iter()
            .map(|l| {
                let best = l
                    .iter()
                    .enumerate()
                    .fold(
                        (0, f32::NEG_INFINITY),
                        |a, (i, &x)| if x > a.1 { (i, x) } else { a },
                    );
                vec![best.0 as u32]
            })
            .collect();
        let all = step(&seqs, &next);
        logits = if groups > 1 && b > 1 {
            let halves: Vec<&[SeqTokens]> = vec![&all[..b / 2], &all[b / 2..]];
            ctx.decode_groups(&halves)?.into_iter().flatten().collect()
        } else {
            ctx.decode(&all)?
        };
    }
    let tg = t1.elapsed().as_secs_f64();
    for s in seqs {
        ctx.remove_seq(s)?;
    }
    Ok((pp, tg))
}
