//! A conversation with a model: the tokens it holds and their KV cache, generation as an
//! iterator of tokens, and its state saved to and restored from bytes or a file.
//!
//! Many sessions share one [`Model`] (an `Arc`): the weights are loaded once, and each session
//! keeps only its own cache. Each generation takes its own [`GenOptions`] (sampling, stop
//! strings, limits, a [`Cancel`](crate::generate::Cancel) token another thread may trigger).
//!
//! ```no_run
//! # use std::sync::Arc;
//! # use tessera_llm::{Model, session::Session, batch::BatchParams, generate::GenOptions};
//! # fn f(model: Arc<Model>) -> tessera::Result<()> {
//! let mut s = Session::new(model, BatchParams::default())?;
//! for t in s.complete("Once upon a time", GenOptions::default())? {
//!     print!("{}", t?.text);
//! }
//! # Ok(())
//! # }
//! ```

use std::path::Path;
use std::sync::Arc;

use tessera_core::{Error, Result};

use crate::batch::{BatchContext, BatchParams, Output, SeqTokens};
use crate::generate::{Decoder, GenOptions, Step, StopReason, TokenLogprob};
use crate::kv_cache::SeqId;
use crate::model::Model;

/// Magic and version of a saved session.
const MAGIC: &[u8; 8] = b"TSSESS01";

/// One conversation's tokens and cache.
pub struct Session {
    ctx: BatchContext,
    seq: SeqId,
    tokens: Vec<u32>,
    /// The logits after the last token held (None after a restore or a truncation).
    logits: Option<Vec<f32>>,
}

impl Session {
    /// An empty session; `params.n_ctx` is the positions it may hold.
    pub fn new(model: Arc<Model>, params: BatchParams) -> Result<Self> {
        let mut ctx = BatchContext::new(model, BatchParams { n_seq: 1, ..params })?;
        let seq = ctx.add_seq();
        Ok(Session {
            ctx,
            seq,
            tokens: Vec::new(),
            logits: None,
        })
    }

    /// The model.
    pub fn model(&self) -> &Arc<Model> {
        self.ctx.model()
    }

    /// The tokens the session holds.
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    /// Positions the session may hold.
    pub fn n_ctx(&self) -> usize {
        self.ctx.n_ctx()
    }

    /// Keeps the first `n` tokens.
    pub fn truncate(&mut self, n: usize) -> Result<()> {
        if n < self.tokens.len() {
            self.ctx.truncate(self.seq, n)?;
            self.tokens.truncate(n);
            self.logits = None;
        }
        Ok(())
    }

    /// Evaluates `tokens` after those held.
    pub fn feed(&mut self, tokens: &[u32]) -> Result<()> {
        if tokens.is_empty() {
            return Ok(());
        }
        let batch = [SeqTokens {
            seq: self.seq,
            tokens,
            output: Output::Last,
        }];
        let logits = self.ctx.decode(&batch)?.remove(0);
        self.tokens.extend_from_slice(tokens);
        self.logits = Some(logits);
        Ok(())
    }

    /// Makes the session hold exactly `tokens`, evaluating only what follows the longest
    /// prefix it already holds (a conversation's next turn re-reads nothing before it).
    pub fn set_tokens(&mut self, tokens: &[u32]) -> Result<()> {
        let common = self
            .tokens
            .iter()
            .zip(tokens)
            .take_while(|(a, b)| a == b)
            .count();
        // The last token is evaluated again when nothing follows it: its logits are needed.
        let stale = self.logits.is_none() || common < self.tokens.len();
        let keep = if common == tokens.len() && stale {
            common.saturating_sub(1)
        } else {
            common
        };
        self.truncate(keep)?;
        self.feed(&tokens[keep..])
    }

    /// Generates after the tokens held.
    pub fn generate(&mut self, opts: GenOptions) -> Result<Generator<'_>> {
        if self.logits.is_none() {
            // Restored or truncated: the last token's logits come from evaluating it again.
            let Some(&last) = self.tokens.last() else {
                return Err(Error::Invalid(
                    "nothing to continue: the session holds no tokens".into(),
                ));
            };
            self.truncate(self.tokens.len() - 1)?;
            self.feed(&[last])?;
        }
        let decoder = Decoder::new(opts, &self.tokens);
        Ok(Generator {
            session: self,
            decoder,
            stop: None,
        })
    }

    /// Tokenizes `text` (with the beginning-of-text token when the session is empty and the
    /// model wants one), holds it after what the session holds, and generates.
    pub fn complete(&mut self, text: &str, opts: GenOptions) -> Result<Generator<'_>> {
        let tok = &self.ctx.model().tokenizer;
        let ids = tok.encode(text, self.tokens.is_empty(), true)?;
        let mut all = self.tokens.clone();
        all.extend_from_slice(&ids);
        self.set_tokens(&all)?;
        self.generate(opts)
    }

    /// The session's tokens and KV state as bytes.
    pub fn save(&self) -> Result<Vec<u8>> {
        let kv = self.ctx.save_seq(self.seq)?;
        let mut out = Vec::with_capacity(16 + 4 * self.tokens.len() + kv.len());
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&(self.tokens.len() as u64).to_le_bytes());
        for t in &self.tokens {
            out.extend_from_slice(&t.to_le_bytes());
        }
        out.extend_from_slice(&kv);
        Ok(out)
    }

    /// Writes [`Session::save`]'s bytes to a file.
    pub fn save_file(&self, path: impl AsRef<Path>) -> Result<()> {
        let path = path.as_ref();
        std::fs::write(path, self.save()?)
            .map_err(|e| Error::io(format!("writing {}", path.display()), e))
    }

    /// A session holding the state [`Session::save`] gave (for the same model file).
    pub fn restore(model: Arc<Model>, params: BatchParams, bytes: &[u8]) -> Result<Self> {
        let bad = || Error::Invalid("not a saved session: the header is damaged".into());
        if bytes.len() < 16 || &bytes[..8] != MAGIC {
            return Err(bad());
        }
        let n = u64::from_le_bytes(bytes[8..16].try_into().map_err(|_| bad())?);
        let n = usize::try_from(n).map_err(|_| bad())?;
        let end = n
            .checked_mul(4)
            .and_then(|b| b.checked_add(16))
            .ok_or_else(bad)?;
        if bytes.len() < end {
            return Err(bad());
        }
        let tokens: Vec<u32> = bytes[16..end]
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        let mut ctx = BatchContext::new(model, BatchParams { n_seq: 1, ..params })?;
        let seq = ctx.restore_seq(&bytes[end..])?;
        if ctx.seq_len(seq)? != tokens.len() {
            return Err(Error::Invalid(
                "not a saved session: its tokens and KV state differ in length".into(),
            ));
        }
        Ok(Session {
            ctx,
            seq,
            tokens,
            logits: None,
        })
    }

    /// [`Session::restore`] from a file.
    pub fn restore_file(
        model: Arc<Model>,
        params: BatchParams,
        path: impl AsRef<Path>,
    ) -> Result<Self> {
        let path = path.as_ref();
        let bytes =
            std::fs::read(path).map_err(|e| Error::io(format!("reading {}", path.display()), e))?;
        Session::restore(model, params, &bytes)
    }
}

/// One piece of a generation.
#[derive(Clone, Debug)]
pub struct Piece {
    /// The token generated (None for the text held back to the end, after the last token).
    pub token: Option<u32>,
    /// The text it releases (see [`crate::generate::TokenEvent::text`]).
    pub text: String,
    /// The token's log-probabilities, when asked for.
    pub logprob: Option<TokenLogprob>,
}

/// A generation in progress: an iterator of the pieces generated. Each token is evaluated
/// when the next one is asked for, so stopping early costs nothing.
pub struct Generator<'a> {
    session: &'a mut Session,
    decoder: Decoder,
    stop: Option<StopReason>,
}

impl Generator<'_> {
    /// Why the generation ended (None while it runs).
    pub fn stop_reason(&self) -> Option<StopReason> {
        self.stop
    }

    /// Tokens generated so far.
    pub fn n_generated(&self) -> usize {
        self.decoder.n_generated()
    }

    fn end(&mut self, why: StopReason, text: String) -> Option<Result<Piece>> {
        self.stop = Some(why);
        (!text.is_empty()).then_some(Ok(Piece {
            token: None,
            text,
            logprob: None,
        }))
    }
}

impl Iterator for Generator<'_> {
    type Item = Result<Piece>;

    fn next(&mut self) -> Option<Result<Piece>> {
        if self.stop.is_some() {
            return None;
        }
        let s = &mut *self.session;
        let Some(logits) = s.logits.as_ref() else {
            self.stop = Some(StopReason::Stopped);
            return Some(Err(Error::Invalid("the session lost its logits".into())));
        };
        let step = match self.decoder.step(&s.ctx.model().tokenizer, logits) {
            Ok(step) => step,
            Err(e) => {
                self.stop = Some(StopReason::Stopped);
                return Some(Err(e));
            }
        };
        let ev = match step {
            Step::Done(why, text) => return self.end(why, text),
            Step::Token(ev) => ev,
        };
        let mut piece = Piece {
            token: Some(ev.id),
            text: ev.text,
            logprob: ev.logprob,
        };
        let room = s.tokens.len() + 1 < s.n_ctx();
        if let Some(Step::Done(why, text)) = self.decoder.end(room) {
            // The token is shown but never evaluated: nothing reads its logits.
            piece.text.push_str(&text);
            self.stop = Some(why);
            return Some(Ok(piece));
        }
        if let Err(e) = s.feed(&[ev.id]) {
            self.stop = Some(StopReason::Stopped);
            return Some(Err(e));
        }
        Some(Ok(piece))
    }
}
