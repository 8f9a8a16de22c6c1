//! The engine: one thread that owns the model's batch context and runs continuous batching.
//!
//! Each step carries every running sequence: the token each decoding sequence sampled last,
//! then prompt chunks of newly admitted sequences in the tokens left of the step's budget. A
//! request joins when a slot is free (it waits in the bounded queue until then) and leaves as
//! soon as it ends or its client is gone (its event channel closed), so its slot and cells are
//! free for the next step. Embeddings run between steps, as a sequence of their own.
//!
//! A finished request's sequence stays in the cache as a prefix for later requests (a chat's
//! system prompt, or the conversation so far on its next turn): a new request starts from the
//! cached sequence sharing the longest prefix with its prompt (the same cells, nothing is
//! copied) and evaluates only the rest. Cached sequences are dropped, least recently used
//! first, when a step or an embedding needs their cells, and never hold more than one
//! sequence's worth per slot.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, TryRecvError};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tessera_llm::batch::{BatchContext, Output, SeqTokens};
use tessera_llm::embed::{embed_tokens, Pooling};
use tessera_llm::generate::{Decoder, GenOptions, Step, StopReason, TokenEvent};
use tessera_llm::SeqId;
use tokio::sync::{mpsc, oneshot};

use crate::metrics::Metrics;

/// What a generation sends its client.
#[derive(Debug)]
pub enum Event {
    /// A token and the text it releases.
    Token(TokenEvent),
    /// The end: why, the text still held, and the token counts.
    Done {
        /// Why it ended.
        reason: StopReason,
        /// Text released at the end.
        text: String,
        /// Prompt tokens.
        prompt_tokens: usize,
        /// Generated tokens.
        completion_tokens: usize,
    },
    /// The step failed.
    Error(String),
}

/// Work for the engine.
pub enum Job {
    /// Generate after a prompt.
    Generate {
        /// The prompt's tokens (shorter than the context).
        prompt: Vec<u32>,
        /// Sampling, limits, stop strings.
        opts: GenOptions,
        /// Where the events go.
        events: mpsc::UnboundedSender<Event>,
        /// When the request was queued (time to first token counts from here).
        queued: Instant,
    },
    /// Embed token lists (each within the context).
    Embed {
        /// The inputs.
        inputs: Vec<Vec<u32>>,
        /// The unit vectors, or why not.
        reply: oneshot::Sender<Result<Vec<Vec<f32>>, String>>,
    },
}

struct Slot {
    seq: SeqId,
    /// The tokens the sequence holds (the prompt as it is fed, then each decoded token).
    held: Vec<u32>,
    decoder: Decoder,
    events: mpsc::UnboundedSender<Event>,
    prompt: Vec<u32>,
    /// Prompt tokens evaluated so far.
    fed: usize,
    /// The token sampled last, to evaluate in the next step.
    next: Option<u32>,
    queued: Instant,
}

/// A finished request's sequence, kept as a prefix for later ones.
struct Cached {
    seq: SeqId,
    tokens: Vec<u32>,
    /// When it was last used (engine steps).
    used: u64,
}

/// The engine's state.
pub struct Engine {
    ctx: BatchContext,
    slots: Vec<Option<Slot>>,
    cached: Vec<Cached>,
    clock: u64,
    pooling: Pooling,
    metrics: Arc<Metrics>,
    shutdown: Arc<AtomicBool>,
}

impl Engine {
    /// An engine over `ctx` with `parallel` slots.
    pub fn new(
        ctx: BatchContext,
        parallel: usize,
        pooling: Pooling,
        metrics: Arc<Metrics>,
        shutdown: Arc<AtomicBool>,
    ) -> Self {
        Engine {
            ctx,
            slots: (0..parallel).map(|_| None).collect(),
            cached: Vec::new(),
            clock: 0,
            pooling,
            metrics,
            shutdown,
        }
    }

    /// Runs until the job channel closes and no sequence is left.
    pub fn run(mut self, jobs: Receiver<Job>) {
        let mut open = true;
        loop {
            if self.shutdown.load(Ordering::Relaxed) {
                self.cancel_all();
            }
            open = open && self.admit(&jobs);
            self.drop_gone();
            if self.active() == 0 {
                if !open {
                    return;
                }
                continue;
            }
            self.step();
        }
    }

    fn active(&self) -> usize {
        self.slots.iter().filter(|s| s.is_some()).count()
    }

    /// Takes jobs while slots are free (waiting a little when nothing runs). False once the
    /// channel is closed.
    fn admit(&mut self, jobs: &Receiver<Job>) -> bool {
        while self.slots.iter().any(Option::is_none) {
            let job = if self.active() == 0 {
                match jobs.recv_timeout(Duration::from_millis(100)) {
                    Ok(j) => j,
                    Err(RecvTimeoutError::Timeout) => return true,
                    Err(RecvTimeoutError::Disconnected) => return false,
                }
            } else {
                match jobs.try_recv() {
                    Ok(j) => j,
                    Err(TryRecvError::Empty) => return true,
                    Err(TryRecvError::Disconnected) => return false,
                }
            };
            self.metrics.queued.fetch_sub(1, Ordering::Relaxed);
            match job {
                Job::Embed { inputs, reply } => {
                    let r = inputs
                        .iter()
                        .map(|t| {
                            self.make_room(t.len());
                            embed_tokens(&mut self.ctx, t, self.pooling, true)
                        })
                        .collect::<tessera::Result<Vec<_>>>()
                        .map_err(|e| e.to_string());
                    // The client may be gone; then nobody wants the vectors.
                    let _ = reply.send(r);
                }
                Job::Generate {
                    prompt,
                    opts,
                    events,
                    queued,
                } => {
                    if self.shutdown.load(Ordering::Relaxed) {
                        let _ = events.send(Event::Error("the server is shutting down".into()));
                        continue;
                    }
                    let seq = self.ctx.add_seq();
                    let fed = self.reuse_prefix(seq, &prompt);
                    let decoder = Decoder::new(opts, &prompt);
                    let free = self.slots.iter_mut().find(|s| s.is_none());
                    if let Some(free) = free {
                        *free = Some(Slot {
                            seq,
                            held: prompt[..fed].to_vec(),
                            decoder,
                            events,
                            prompt,
                            fed,
                            next: None,
                            queued,
                        });
                    }
                }
            }
        }
        true
    }

    /// Makes `seq` share the longest prefix of `prompt` that a cached sequence holds, leaving
    /// at least the prompt's last token to evaluate (its logits start the generation). Returns
    /// the positions shared.
    fn reuse_prefix(&mut self, seq: SeqId, prompt: &[u32]) -> usize {
        let best = self
            .cached
            .iter_mut()
            .map(|c| {
                let n = c
                    .tokens
                    .iter()
                    .zip(prompt)
                    .take_while(|(a, b)| a == b)
                    .count();
                (n.min(prompt.len().saturating_sub(1)), c)
            })
            .max_by_key(|(n, _)| *n);
        let Some((n, c)) = best.filter(|(n, _)| *n > 0) else {
            return 0;
        };
        self.clock += 1;
        c.used = self.clock;
        match self.ctx.copy_prefix(c.seq, seq, n) {
            Ok(()) => {
                self.metrics
                    .prefix_tokens
                    .fetch_add(n as u64, Ordering::Relaxed);
                n
            }
            Err(_) => 0,
        }
    }

    /// Drops cached sequences, least recently used first, until `n` cells are free beside a
    /// sequence's worth for what comes next (or none is cached).
    fn make_room(&mut self, n: usize) {
        let want = n + self.ctx.n_ctx();
        while self.ctx.cells().n_free() < want && !self.cached.is_empty() {
            self.drop_oldest();
        }
    }

    /// Drops the least recently used cached sequence.
    fn drop_oldest(&mut self) {
        let oldest = (0..self.cached.len()).min_by_key(|&i| self.cached[i].used);
        if let Some(i) = oldest {
            let c = self.cached.swap_remove(i);
            let _ = self.ctx.remove_seq(c.seq);
        }
    }

    /// Ends slot `i`: its sequence is kept as a prefix when `keep` (one per slot at most),
    /// removed otherwise.
    fn end_slot(&mut self, i: usize, keep: bool) {
        let Some(s) = self.slots[i].take() else {
            return;
        };
        if !keep || s.held.is_empty() {
            // The sequence exists: it was added when the slot was taken.
            let _ = self.ctx.remove_seq(s.seq);
            return;
        }
        if self.cached.len() >= self.slots.len() {
            self.drop_oldest();
        }
        self.clock += 1;
        self.cached.push(Cached {
            seq: s.seq,
            tokens: s.held,
            used: self.clock,
        });
    }

    fn free(&mut self, i: usize) {
        self.end_slot(i, false);
    }

    /// Frees the slots whose client is gone.
    fn drop_gone(&mut self) {
        for i in 0..self.slots.len() {
            if self.slots[i].as_ref().is_some_and(|s| s.events.is_closed()) {
                self.metrics.disconnects.fetch_add(1, Ordering::Relaxed);
                self.free(i);
            }
        }
    }

    fn cancel_all(&mut self) {
        for i in 0..self.slots.len() {
            if let Some(s) = self.slots[i].as_mut() {
                if let Step::Done(reason, text) = s.decoder.done(StopReason::Stopped) {
                    let _ = s.events.send(Event::Done {
                        reason,
                        text,
                        prompt_tokens: s.prompt.len(),
                        completion_tokens: s.decoder.n_generated(),
                    });
                }
                self.free(i);
            }
        }
    }

    /// One step over every running sequence.
    fn step(&mut self) {
        let started = Instant::now();
        let mut budget = self.ctx.n_ubatch();
        // (slot, tokens, output): decodes first, then prompt chunks in what is left.
        let mut plan: Vec<(usize, Vec<u32>, Output)> = Vec::new();
        for (i, s) in self.slots.iter().enumerate() {
            if let Some(t) = s.as_ref().and_then(|s| s.next) {
                plan.push((i, vec![t], Output::Last));
                budget = budget.saturating_sub(1);
            }
        }
        for (i, s) in self.slots.iter().enumerate() {
            let Some(s) = s.as_ref().filter(|s| s.next.is_none()) else {
                continue;
            };
            if budget == 0 {
                break;
            }
            let end = (s.fed + budget).min(s.prompt.len());
            let out = if end == s.prompt.len() {
                Output::Last
            } else {
                Output::None
            };
            budget -= end - s.fed;
            plan.push((i, s.prompt[s.fed..end].to_vec(), out));
        }
        let batch: Vec<SeqTokens> = plan
            .iter()
            .filter_map(|(i, t, o)| {
                self.slots[*i].as_ref().map(|s| SeqTokens {
                    seq: s.seq,
                    tokens: t,
                    output: *o,
                })
            })
            .collect();
        let n_tokens: usize = plan.iter().map(|p| p.1.len()).sum();
        self.make_room(n_tokens);
        let result = self.ctx.decode(&batch);
        self.metrics.step(started.elapsed(), n_tokens);
        let logits = match result {
            Ok(l) => l,
            Err(e) => {
                log::error!("step failed: {e}");
                for (i, _, _) in &plan {
                    if let Some(s) = &self.slots[*i] {
                        let _ = s.events.send(Event::Error(e.to_string()));
                    }
                    self.free(*i);
                }
                return;
            }
        };
        let model = self.ctx.model().clone();
        for ((i, tokens, out), logits) in plan.into_iter().zip(logits) {
            let n_ctx = self.ctx.n_ctx();
            let Some(s) = self.slots[i].as_mut() else {
                continue;
            };
            s.held.extend_from_slice(&tokens);
            if s.next.take().is_none() {
                s.fed += tokens.len();
                self.metrics
                    .prompt_tokens
                    .fetch_add(tokens.len() as u64, Ordering::Relaxed);
            }
            if out == Output::None {
                continue;
            }
            let held = self.ctx.seq_len(s.seq).unwrap_or(n_ctx);
            let ended = match s.decoder.step(&model.tokenizer, &logits) {
                Err(e) => Some(Event::Error(e.to_string())),
                Ok(Step::Done(reason, text)) => Some(done(s, reason, text)),
                Ok(Step::Token(ev)) => {
                    self.metrics
                        .generated_tokens
                        .fetch_add(1, Ordering::Relaxed);
                    if s.decoder.n_generated() == 1 {
                        self.metrics.first_token(s.queued.elapsed());
                    }
                    let id = ev.id;
                    let _ = s.events.send(Event::Token(ev));
                    match s.decoder.end(held < n_ctx) {
                        Some(Step::Done(reason, text)) => Some(done(s, reason, text)),
                        _ => {
                            s.next = Some(id);
                            None
                        }
                    }
                }
            };
            if let Some(ev) = ended {
                let ok = !matches!(ev, Event::Error(_));
                let _ = s.events.send(ev);
                self.end_slot(i, ok);
            }
        }
    }
}

fn done(s: &Slot, reason: StopReason, text: String) -> Event {
    Event::Done {
        reason,
        text,
        prompt_tokens: s.prompt.len(),
        completion_tokens: s.decoder.n_generated(),
    }
}
