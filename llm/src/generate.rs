//! Text generation: evaluate a prompt, then sample and evaluate one token at a time, streaming
//! the text as it is made.

use std::time::Instant;

use tessera_core::{Error, Result};

use crate::context::Context;
use crate::sampling::{Sampler, SamplerConfig};
use crate::tokenizer::StreamDecoder;

/// What to generate.
#[derive(Clone, Debug)]
pub struct GenerateParams {
    /// Most tokens to generate.
    pub max_tokens: usize,
    /// How to pick each token.
    pub sampler: SamplerConfig,
    /// Stop at an end-of-generation token (it is not emitted).
    pub stop_at_eog: bool,
}

impl Default for GenerateParams {
    fn default() -> Self {
        GenerateParams {
            max_tokens: 128,
            sampler: SamplerConfig::default(),
            stop_at_eog: true,
        }
    }
}

/// Why generation ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StopReason {
    /// `max_tokens` were generated.
    MaxTokens,
    /// The model emitted an end-of-generation token.
    EndOfGeneration,
    /// The context is full.
    ContextFull,
    /// The callback asked to stop.
    Stopped,
}

/// The result of a generation.
#[derive(Clone, Debug)]
pub struct Generation {
    /// The prompt's token ids.
    pub prompt_ids: Vec<u32>,
    /// The generated token ids.
    pub ids: Vec<u32>,
    /// The generated text.
    pub text: String,
    /// Seconds spent evaluating the prompt.
    pub prompt_secs: f64,
    /// Seconds spent generating after the prompt (sampling and evaluating tokens).
    pub gen_secs: f64,
    /// Tokens evaluated after the prompt (the decode steps timed by `gen_secs`).
    pub gen_evals: usize,
    /// Why it ended.
    pub stop: StopReason,
}

impl Generation {
    /// Prompt tokens per second.
    pub fn prompt_tps(&self) -> f64 {
        self.prompt_ids.len() as f64 / self.prompt_secs.max(1e-9)
    }

    /// Generated tokens per second (decode steps over their time).
    pub fn gen_tps(&self) -> f64 {
        self.gen_evals as f64 / self.gen_secs.max(1e-9)
    }
}

/// Generates after `prompt_ids` (evaluated from the context's current state). `on_text` gets
/// each piece of text as soon as it is complete UTF-8; returning false stops generation.
pub fn generate(
    ctx: &mut Context,
    prompt_ids: &[u32],
    params: &GenerateParams,
    on_text: &mut dyn FnMut(&str) -> bool,
) -> Result<Generation> {
    if prompt_ids.is_empty() {
        return Err(Error::Invalid(
            "the prompt is empty: give at least one token".into(),
        ));
    }
    let model = ctx.model().clone();
    let tok = &model.tokenizer;
    let mut sampler = Sampler::new(params.sampler.clone());
    let t0 = Instant::now();
    let mut logits = ctx.eval(prompt_ids, false)?;
    let prompt_secs = t0.elapsed().as_secs_f64();

    let t1 = Instant::now();
    let mut history: Vec<u32> = prompt_ids.to_vec();
    let mut ids = Vec::new();
    let mut text = String::new();
    let mut stream = StreamDecoder::new();
    let mut evals = 0;
    let stop = loop {
        if ids.len() >= params.max_tokens {
            break StopReason::MaxTokens;
        }
        let next = sampler.sample(&logits, &history);
        if params.stop_at_eog && tok.is_eog(next) {
            break StopReason::EndOfGeneration;
        }
        ids.push(next);
        history.push(next);
        let piece = stream.push(tok, next)?;
        text.push_str(&piece);
        if !piece.is_empty() && !on_text(&piece) {
            break StopReason::Stopped;
        }
        if ids.len() >= params.max_tokens {
            break StopReason::MaxTokens;
        }
        if ctx.n_past() >= ctx.n_ctx() {
            break StopReason::ContextFull;
        }
        logits = ctx.eval(&[next], false)?;
        evals += 1;
    };
    let rest = stream.finish();
    if !rest.is_empty() {
        on_text(&rest);
        text.push_str(&rest);
    }
    Ok(Generation {
        prompt_ids: prompt_ids.to_vec(),
        ids,
        text,
        prompt_secs,
        gen_secs: t1.elapsed().as_secs_f64(),
        gen_evals: evals,
        stop,
    })
}
