//! `tessera perplexity`: a model's perplexity on a text, as llama.cpp's perplexity tool
//! computes it.

use std::io::Write;
use std::path::PathBuf;
use std::time::Instant;

use clap::Args;
use tessera::{Error, Result};
use tessera_llm::perplexity::{self, PerplexityParams};
use tessera_llm::{Context, ContextParams};

use crate::load::{self, ModelArgs};

/// Arguments of `tessera perplexity`.
#[derive(Args, Debug)]
pub struct PerplexityArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// The text (UTF-8; one trailing newline is dropped, as llama.cpp's -f does).
    #[arg(long)]
    file: PathBuf,
    /// Tokens per chunk; the second half of each chunk is scored.
    #[arg(long, default_value_t = 512)]
    ctx: usize,
    /// Most tokens evaluated in one graph (default: the chunk's length).
    #[arg(long)]
    batch: Option<usize>,
    /// Score only the first N chunks (llama.cpp's --chunks).
    #[arg(long)]
    chunks: Option<usize>,
    /// Print one JSON object (running values, final PPL and error, token counts).
    #[arg(long)]
    json: bool,
}

/// Runs `tessera perplexity`.
pub fn run(a: PerplexityArgs) -> Result<()> {
    let text = perplexity::read_text(&a.file)?;
    if a.batch == Some(0) {
        return Err(Error::Invalid("--batch must be at least 1".into()));
    }
    let n_batch = a.batch.unwrap_or(a.ctx).min(a.ctx).max(1);
    let params = ContextParams {
        n_ctx: a.ctx,
        n_ubatch: n_batch,
        ..ContextParams::default()
    };
    let model = load::load(&a.model, &params)?;
    let mut ctx = Context::new(model.clone(), params)?;
    let tokens = perplexity::tokenize(&ctx, &text)?;
    let params = PerplexityParams {
        n_ctx: a.ctx,
        n_batch,
        max_chunks: a.chunks,
    };
    let n_chunk = perplexity::chunks(tokens.len(), &params)?;
    let json = a.json;
    if !json {
        eprintln!(
            "perplexity over {n_chunk} chunks of {} tokens ({} in the text) on {}",
            a.ctx,
            tokens.len(),
            model.device().name()
        );
    }
    let t0 = Instant::now();
    let mut stdout = std::io::stdout();
    let r = perplexity::perplexity(&mut ctx, &tokens, &params, &mut |i, _, ppl| {
        if !json {
            let _ = write!(stdout, "[{}]{ppl:.4},", i + 1);
            let _ = stdout.flush();
        }
    })?;
    let secs = t0.elapsed().as_secs_f64();
    if json {
        let v = serde_json::json!({
            "device": model.device().name(),
            "n_ctx": a.ctx,
            "n_tokens": r.n_tokens,
            "n_chunks": r.running.len(),
            "n_scored": r.n_scored,
            "running": r.running,
            "ppl": r.ppl,
            "error": r.error,
            "seconds": secs,
        });
        println!("{v}");
    } else {
        println!();
        println!("Final estimate: PPL = {:.4} +/- {:.5}", r.ppl, r.error);
        eprintln!(
            "{} tokens scored in {:.1} s ({:.1} tokens/s evaluated)",
            r.n_scored,
            secs,
            (r.running.len() * a.ctx) as f64 / secs
        );
    }
    Ok(())
}
