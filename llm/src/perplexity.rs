//! Perplexity of a model on a text, computed as llama.cpp's perplexity tool computes it, so that
//! the two can be compared number for number.
//!
//! The rules (llama.cpp `tools/perplexity`):
//! - The whole text is tokenized once, special tokens added as the model's vocabulary says and
//!   special-token text not parsed. A text read from a file loses one trailing newline
//!   ([`read_text`]), as llama.cpp's `-f` does.
//! - The tokens are cut into non-overlapping chunks of `n_ctx`; a trailing remainder is
//!   dropped (and so are chunks past `max_chunks`). A text of fewer than `2 * n_ctx` tokens is
//!   refused.
//! - Each chunk is evaluated from an empty cache; when the vocabulary adds BOS, the chunk's first
//!   token is replaced by BOS (the chunk keeps its length).
//! - Only the second half is scored: the logits at positions `n_ctx/2 .. n_ctx-1` predict the
//!   tokens after them, so each chunk scores `n_ctx - n_ctx/2 - 1` tokens and every scored token
//!   has at least half a window of context.
//! - PPL is `exp(mean NLL)` over every scored token so far (the running value after each chunk);
//!   its error is `PPL * sqrt(var(NLL) / (count - 1))`, the standard error of the mean NLL
//!   carried through the exponential.

use std::path::Path;

use rayon::prelude::*;
use tessera_core::{Error, Result};

use crate::context::Context;

/// Settings of a perplexity run.
#[derive(Clone, Debug)]
pub struct PerplexityParams {
    /// Tokens per chunk (llama.cpp's `--ctx-size`; 512 there by default).
    pub n_ctx: usize,
    /// Most tokens handed to one evaluation: the host holds the logits of this many tokens at
    /// once. The result does not depend on it.
    pub n_batch: usize,
    /// Score only the first this many chunks (llama.cpp's `--chunks`); `None`: every chunk.
    pub max_chunks: Option<usize>,
}

impl Default for PerplexityParams {
    fn default() -> Self {
        PerplexityParams {
            n_ctx: 512,
            n_batch: 512,
            max_chunks: None,
        }
    }
}

/// The result of a perplexity run.
#[derive(Clone, Debug)]
pub struct Perplexity {
    /// The running PPL after each chunk (the values llama.cpp prints as `[1]x,[2]y,...`).
    pub running: Vec<f64>,
    /// The final PPL over every scored token.
    pub ppl: f64,
    /// Its standard error.
    pub error: f64,
    /// Tokens in the text.
    pub n_tokens: usize,
    /// Tokens scored.
    pub n_scored: usize,
}

/// Reads a text file as llama.cpp's `-f` does: the whole file (UTF-8), less one trailing
/// newline.
pub fn read_text(path: &Path) -> Result<String> {
    let mut text = std::fs::read_to_string(path)
        .map_err(|e| Error::io(format!("reading {}", path.display()), e))?;
    if text.ends_with('\n') {
        text.pop();
    }
    Ok(text)
}

/// Tokenizes `text` as llama.cpp's perplexity tool does (special tokens added as the vocabulary
/// says, special-token text not parsed).
pub fn tokenize(ctx: &Context, text: &str) -> Result<Vec<u32>> {
    ctx.model().tokenizer.encode(text, true, false)
}

/// How many chunks a text of `n_tokens` tokens gives under `params`, or why it cannot be
/// scored (too short a text, too small a context, no chunks or no batch).
pub fn chunks(n_tokens: usize, params: &PerplexityParams) -> Result<usize> {
    let n_ctx = params.n_ctx;
    // With 3 tokens a chunk scores one token; two chunks then give the error's count - 1 > 0.
    if n_ctx < 3 {
        return Err(Error::Invalid(format!(
            "a perplexity context of {n_ctx} tokens scores nothing: it must be at least 3"
        )));
    }
    if params.n_batch == 0 {
        return Err(Error::Invalid("the batch size must be at least 1".into()));
    }
    if n_tokens < 2 * n_ctx {
        return Err(Error::Invalid(format!(
            "the text has {n_tokens} tokens: perplexity with a context of {n_ctx} needs at \
             least {} (two chunks); give a longer text or a smaller context",
            2 * n_ctx
        )));
    }
    match params.max_chunks {
        Some(0) => Err(Error::Invalid("at least one chunk must be scored".into())),
        Some(k) => Ok(k.min(n_tokens / n_ctx)),
        None => Ok(n_tokens / n_ctx),
    }
}

/// Perplexity of `ctx`'s model on `tokens` (from [`tokenize`]), by llama.cpp's rules (see the
/// module's documentation). `on_chunk(i, n_chunk, running_ppl)` is called after each chunk.
/// The context is cleared before every chunk and must hold at least `params.n_ctx` positions.
pub fn perplexity(
    ctx: &mut Context,
    tokens: &[u32],
    params: &PerplexityParams,
    on_chunk: &mut dyn FnMut(usize, usize, f64),
) -> Result<Perplexity> {
    let n_chunk = chunks(tokens.len(), params)?;
    let n_ctx = params.n_ctx;
    if ctx.n_ctx() < n_ctx {
        return Err(Error::Invalid(format!(
            "the context holds {} positions, fewer than the perplexity context of {n_ctx}",
            ctx.n_ctx()
        )));
    }
    let tokenizer = &ctx.model().tokenizer;
    let bos = if tokenizer.add_bos() {
        Some(tokenizer.bos().ok_or_else(|| {
            Error::Invalid("the vocabulary adds BOS but names no BOS token".into())
        })?)
    } else {
        None
    };
    let first = n_ctx / 2;
    let mut nll = 0f64;
    let mut nll2 = 0f64;
    let mut count = 0usize;
    let mut running = Vec::with_capacity(n_chunk);
    for i in 0..n_chunk {
        let mut chunk = tokens[i * n_ctx..(i + 1) * n_ctx].to_vec();
        if let Some(b) = bos {
            chunk[0] = b;
        }
        ctx.clear();
        // The first half only fills the cache: its logits are not scored.
        ctx.eval(&chunk[..first], false)?;
        // Logits at position p predict the token at p + 1; the last position predicts nothing.
        let mut p = first;
        while p < n_ctx {
            let end = (p + params.n_batch).min(n_ctx);
            let logits = ctx.eval(&chunk[p..end], true)?;
            let rows = end - p;
            if logits.len() % rows != 0 {
                return Err(Error::Invalid(format!(
                    "the model returned {} logits for {rows} tokens",
                    logits.len()
                )));
            }
            let n_vocab = logits.len() / rows;
            let scored = rows.min(n_ctx - 1 - p);
            let (s, s2) = logits[..scored * n_vocab]
                .par_chunks(n_vocab)
                .enumerate()
                .map(|(r, row)| {
                    let v = -log_softmax(row, chunk[p + r + 1] as usize);
                    (v, v * v)
                })
                .reduce(|| (0.0, 0.0), |a, b| (a.0 + b.0, a.1 + b.1));
            nll += s;
            nll2 += s2;
            count += scored;
            p = end;
        }
        let ppl = (nll / count as f64).exp();
        running.push(ppl);
        on_chunk(i, n_chunk, ppl);
    }
    let mean = nll / count as f64;
    let var = nll2 / count as f64 - mean * mean;
    let ppl = mean.exp();
    let error = if var > 0.0 {
        (var / (count - 1) as f64).sqrt() * ppl
    } else {
        0.0
    };
    Ok(Perplexity {
        running,
        ppl,
        error,
        n_tokens: tokens.len(),
        n_scored: count,
    })
}

/// `log(softmax(row)[tok])` in f64.
fn log_softmax(row: &[f32], tok: usize) -> f64 {
    let max = row.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x)) as f64;
    let sum: f64 = row.iter().map(|&x| (x as f64 - max).exp()).sum();
    row[tok] as f64 - max - sum.ln()
}

/// The running values as llama.cpp prints them: `[1]12.3456,[2]11.2345,`.
pub fn format_running(running: &[f64]) -> String {
    running
        .iter()
        .enumerate()
        .map(|(i, p)| format!("[{}]{p:.4},", i + 1))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_softmax_of_equal_logits_is_minus_log_n() {
        let row = [3.0f32; 8];
        assert!((log_softmax(&row, 5) + (8f64).ln()).abs() < 1e-12);
    }

    #[test]
    fn log_softmax_is_shift_invariant_and_normalised() {
        let row = [1.0f32, -2.0, 0.5, 7.25, -30.0];
        let shifted: Vec<f32> = row.iter().map(|x| x + 1000.0).collect();
        let total: f64 = (0..row.len()).map(|t| log_softmax(&row, t).exp()).sum();
        assert!((total - 1.0).abs() < 1e-12);
        for t in 0..row.len() {
            assert!((log_softmax(&row, t) - log_softmax(&shifted, t)).abs() < 1e-4);
        }
    }

    #[test]
    fn running_values_print_as_llama_cpp_does() {
        assert_eq!(format_running(&[12.34567, 9.0]), "[1]12.3457,[2]9.0000,");
    }
}
