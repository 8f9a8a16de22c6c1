//! Text generation: evaluate a prompt, then sample and evaluate one token at a time, streaming
//! the text as it is made.
//!
//! [`generate`] drives one [`Context`] through a callback. [`Decoder`] is the per-sequence part
//! alone (sampling, text, stop strings, limits, cancellation), fed one step's logits at a time,
//! so that a [`Session`](crate::session::Session)'s iterator and a server's batch of sequences
//! share it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use tessera_core::{Error, Result};

use crate::context::Context;
use crate::sampling::{Sampler, SamplerConfig};
use crate::tokenizer::{StreamDecoder, Tokenizer};

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
    /// The callback asked to stop, or the generation was cancelled.
    Stopped,
    /// A stop string appeared (the text ends before it).
    StopString,
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

/// Cancels a generation from any thread: the generation ends before its next step.
#[derive(Clone, Debug, Default)]
pub struct Cancel(Arc<AtomicBool>);

impl Cancel {
    /// A token not yet cancelled.
    pub fn new() -> Self {
        Cancel::default()
    }

    /// Asks the generations holding this token to stop.
    pub fn cancel(&self) {
        self.0.store(true, Ordering::Relaxed);
    }

    /// Whether [`Cancel::cancel`] was called.
    pub fn is_cancelled(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }
}

/// What to generate in a [`Decoder`].
#[derive(Clone, Debug)]
pub struct GenOptions {
    /// Most tokens to generate.
    pub max_tokens: usize,
    /// How to pick each token.
    pub sampler: SamplerConfig,
    /// Generation ends where one of these strings appears; the text stops before it.
    pub stop: Vec<String>,
    /// Stop at an end-of-generation token (it is not emitted).
    pub stop_at_eog: bool,
    /// Report each token's log-probability and this many top alternatives' (None: off).
    pub logprobs: Option<usize>,
    /// Ends the generation from another thread.
    pub cancel: Option<Cancel>,
}

impl Default for GenOptions {
    fn default() -> Self {
        GenOptions {
            max_tokens: 128,
            sampler: SamplerConfig::default(),
            stop: Vec::new(),
            stop_at_eog: true,
            logprobs: None,
            cancel: None,
        }
    }
}

/// A token's log-probability and the top alternatives' (see [`crate::sampling::logprobs`]).
#[derive(Clone, Debug, PartialEq)]
pub struct TokenLogprob {
    /// The chosen token's.
    pub logprob: f32,
    /// The most likely tokens and theirs, most likely first.
    pub top: Vec<(u32, f32)>,
}

/// One generated token and the text it releases.
#[derive(Clone, Debug)]
pub struct TokenEvent {
    /// The token id.
    pub id: u32,
    /// Text released by this token: empty while a character is incomplete or while the text
    /// could still be the start of a stop string.
    pub text: String,
    /// Its log-probabilities, when asked for.
    pub logprob: Option<TokenLogprob>,
}

/// What a [`Decoder`] made of one step's logits.
#[derive(Clone, Debug)]
pub enum Step {
    /// A token to evaluate next (and to show).
    Token(TokenEvent),
    /// Generation ended; the text still held back (complete, before any stop string).
    Done(StopReason, String),
}

/// Holds back text that may be the start of a stop string, and finds the first stop string.
#[derive(Clone, Debug, Default)]
pub struct StopMatcher {
    stops: Vec<String>,
    held: String,
}

impl StopMatcher {
    /// A matcher for `stops` (empty strings are ignored).
    pub fn new(stops: &[String]) -> Self {
        StopMatcher {
            stops: stops.iter().filter(|s| !s.is_empty()).cloned().collect(),
            held: String::new(),
        }
    }

    /// Adds text; returns the text now safe to show and whether a stop string was found (then
    /// the text shown ends before it).
    pub fn push(&mut self, text: &str) -> (String, bool) {
        self.held.push_str(text);
        if let Some(at) = self
            .stops
            .iter()
            .filter_map(|s| self.held.find(s.as_str()))
            .min()
        {
            let out = self.held[..at].to_string();
            self.held.clear();
            return (out, true);
        }
        // Keep the longest tail that is a proper prefix of some stop string.
        let mut keep = 0;
        for s in &self.stops {
            for (i, _) in s.char_indices().skip(1) {
                if i > keep && self.held.ends_with(&s[..i]) {
                    keep = i;
                }
            }
        }
        let cut = self.held.len() - keep;
        let out = self.held[..cut].to_string();
        self.held.drain(..cut);
        (out, false)
    }

    /// Ends the text: returns what is still held.
    pub fn finish(&mut self) -> String {
        std::mem::take(&mut self.held)
    }
}

/// The per-sequence part of generation: turns each step's logits into the next token and the
/// text it releases, and says when to stop.
#[derive(Clone, Debug)]
pub struct Decoder {
    sampler: Sampler,
    stream: StreamDecoder,
    stop: StopMatcher,
    opts: GenOptions,
    /// The tokens so far (prompt then generated), for the repetition penalty.
    history: Vec<u32>,
    n_generated: usize,
}

impl Decoder {
    /// A decoder after `prompt` (the tokens the sequence holds).
    pub fn new(opts: GenOptions, prompt: &[u32]) -> Self {
        Decoder {
            sampler: Sampler::new(opts.sampler.clone()),
            stream: StreamDecoder::new(),
            stop: StopMatcher::new(&opts.stop),
            history: prompt.to_vec(),
            n_generated: 0,
            opts,
        }
    }

    /// Tokens generated so far.
    pub fn n_generated(&self) -> usize {
        self.n_generated
    }

    /// Whether the generation was cancelled.
    pub fn cancelled(&self) -> bool {
        self.opts.cancel.as_ref().is_some_and(Cancel::is_cancelled)
    }

    /// Picks the next token from `logits`. After a [`Step::Token`], call [`Decoder::end`]
    /// before evaluating the token: it may not be needed.
    pub fn step(&mut self, tok: &Tokenizer, logits: &[f32]) -> Result<Step> {
        if self.cancelled() {
            return Ok(self.done(StopReason::Stopped));
        }
        if self.n_generated >= self.opts.max_tokens {
            return Ok(self.done(StopReason::MaxTokens));
        }
        let id = self.sampler.sample(logits, &self.history);
        if self.opts.stop_at_eog && tok.is_eog(id) {
            return Ok(self.done(StopReason::EndOfGeneration));
        }
        self.n_generated += 1;
        self.history.push(id);
        let logprob = self.opts.logprobs.map(|top| {
            let (logprob, top) = crate::sampling::logprobs(logits, id, top);
            TokenLogprob { logprob, top }
        });
        let piece = self.stream.push(tok, id)?;
        let (text, stopped) = self.stop.push(&piece);
        if stopped {
            return Ok(Step::Done(StopReason::StopString, text));
        }
        Ok(Step::Token(TokenEvent { id, text, logprob }))
    }

    /// The end of the generation after a token, when it comes before evaluating that token:
    /// `max_tokens` reached, cancelled, or no `room` in the sequence for another position.
    pub fn end(&mut self, room: bool) -> Option<Step> {
        let why = if self.n_generated >= self.opts.max_tokens {
            StopReason::MaxTokens
        } else if self.cancelled() {
            StopReason::Stopped
        } else if !room {
            StopReason::ContextFull
        } else {
            return None;
        };
        Some(self.done(why))
    }

    /// Ends the generation: the reason and the text still held.
    pub fn done(&mut self, why: StopReason) -> Step {
        let rest = self.stream.finish();
        let (mut text, stopped) = self.stop.push(&rest);
        if !stopped {
            text.push_str(&self.stop.finish());
        }
        Step::Done(if stopped { StopReason::StopString } else { why }, text)
    }
}
