//! `tessera bench`: prompt processing and generation speed, measured as llama-bench does
//! (pp: one batch of N prompt tokens from an empty cache; tg: N single-token steps after one
//! token), with a warm-up run first, then the median and spread of the repeats.

use std::time::Instant;

use clap::Args;
use rand::{Rng, SeedableRng};
use tessera::{Error, Result};
use tessera_llm::{Context, ContextParams};

use crate::load::{self, ModelArgs};

/// Arguments of `tessera bench`.
#[derive(Args, Debug)]
pub struct BenchArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// Prompt tokens (0: skip the prompt test).
    #[arg(short = 'p', default_value_t = 512)]
    prompt: usize,
    /// Generated tokens (0: skip the generation test).
    #[arg(short = 'n', default_value_t = 128)]
    gen: usize,
    /// Repeats.
    #[arg(short = 'r', default_value_t = 3)]
    repeats: usize,
    /// Batch size for prompt processing.
    #[arg(long, default_value_t = 512)]
    ubatch: usize,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

fn stats(v: &mut [f64]) -> (f64, f64) {
    v.sort_by(|a, b| a.total_cmp(b));
    let median = v[v.len() / 2];
    let mean = v.iter().sum::<f64>() / v.len() as f64;
    let sd = (v.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / v.len() as f64).sqrt();
    (median, sd)
}

/// Runs `tessera bench`.
pub fn run(a: BenchArgs) -> Result<()> {
    if a.repeats == 0 {
        return Err(Error::Invalid("-r must be at least 1".into()));
    }
    let n_ctx = (a.prompt.max(a.gen + 1)).max(1);
    let params = ContextParams {
        n_ctx,
        n_ubatch: a.ubatch,
        ..ContextParams::default()
    };
    let model = load::load(&a.model, &params)?;
    let mut ctx = Context::new(model.clone(), params)?;
    let mut rng = rand::rngs::StdRng::seed_from_u64(1);
    let n_vocab = model.config.n_vocab as u32;
    let mut rows = Vec::new();
    if a.prompt > 0 {
        let toks: Vec<u32> = (0..a.prompt).map(|_| rng.gen_range(0..n_vocab)).collect();
        let mut tps = Vec::new();
        for r in 0..=a.repeats {
            ctx.clear();
            let t = Instant::now();
            ctx.eval(&toks, false)?;
            if r > 0 {
                tps.push(a.prompt as f64 / t.elapsed().as_secs_f64());
            }
        }
        rows.push((format!("pp{}", a.prompt), stats(&mut tps)));
    }
    if a.gen > 0 {
        let mut tps = Vec::new();
        for r in 0..=a.repeats {
            ctx.clear();
            ctx.eval(&[rng.gen_range(0..n_vocab)], false)?;
            let t = Instant::now();
            for _ in 0..a.gen {
                ctx.eval(&[rng.gen_range(0..n_vocab)], false)?;
            }
            if r > 0 {
                tps.push(a.gen as f64 / t.elapsed().as_secs_f64());
            }
        }
        rows.push((format!("tg{}", a.gen), stats(&mut tps)));
    }
    let dev = model.device().name();
    if a.json {
        let v: Vec<_> = rows
            .iter()
            .map(|(test, (m, sd))| serde_json::json!({"device": dev, "test": test, "tokens_per_sec": m, "stddev": sd}))
            .collect();
        println!("{}", serde_json::Value::Array(v));
    } else {
        println!("| model | device | test | t/s |");
        println!("|---|---|---|---|");
        let name = model
            .file()
            .path()
            .rsplit('/')
            .next()
            .unwrap_or("")
            .to_string();
        for (test, (m, sd)) in rows {
            println!("| {name} | {dev} | {test} | {m:.2} ± {sd:.2} |");
        }
    }
    Ok(())
}
