//! Embeddings: a text's hidden states after the model's output norm, pooled to one vector.
//!
//! How tokens are pooled comes from the file's `{arch}.pooling_type` (llama.cpp's values: 1
//! mean, 2 first token, 3 last token). Where the file says none (0) or nothing, llama.cpp
//! gives one vector per token, which one embedding per input cannot carry; the last token is
//! used then, the one token of a causal model that has read the whole text.

use std::sync::Arc;

use tessera_core::{Error, Result};

use crate::batch::{BatchContext, BatchParams};
use crate::model::Model;

/// How a text's token vectors become one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pooling {
    /// The mean over the tokens.
    Mean,
    /// The first token's.
    First,
    /// The last token's.
    Last,
}

impl Pooling {
    /// The pooling `model`'s file asks for (see the module's documentation).
    pub fn of(model: &Model) -> Result<Pooling> {
        let arch = model.file().get_str("general.architecture")?;
        let key = format!("{arch}.pooling_type");
        let Some(v) = model.file().get(&key) else {
            return Ok(Pooling::Last);
        };
        let code = model.file().get_u32(&key).or_else(|_| {
            model
                .file()
                .get_i32(&key)
                .map(|i| u32::try_from(i).unwrap_or(u32::MAX))
        });
        match code {
            Ok(0 | 3) => Ok(Pooling::Last),
            Ok(1) => Ok(Pooling::Mean),
            Ok(2) => Ok(Pooling::First),
            _ => Err(Error::Model(format!(
                "{key} = {v:?}: a pooling this runner does not compute"
            ))),
        }
    }

    /// Pools `hidden` (`width` values per token) into one vector.
    pub fn pool(self, hidden: &[f32], width: usize) -> Vec<f32> {
        let n = hidden.len() / width.max(1);
        match self {
            Pooling::First => hidden[..width.min(hidden.len())].to_vec(),
            Pooling::Last => hidden[hidden.len().saturating_sub(width)..].to_vec(),
            Pooling::Mean => {
                let mut sum = vec![0f64; width];
                for row in hidden.chunks(width) {
                    for (s, &x) in sum.iter_mut().zip(row) {
                        *s += f64::from(x);
                    }
                }
                sum.into_iter()
                    .map(|s| (s / n.max(1) as f64) as f32)
                    .collect()
            }
        }
    }
}

/// Scales `v` to unit Euclidean length (a zero vector stays zero).
pub fn normalize(v: &mut [f32]) {
    let norm = v
        .iter()
        .map(|&x| f64::from(x) * f64::from(x))
        .sum::<f64>()
        .sqrt();
    if norm > 0.0 {
        for x in v {
            *x = (f64::from(*x) / norm) as f32;
        }
    }
}

/// The embedding of `tokens`, evaluated as a sequence of its own in `ctx` (removed again,
/// whatever happens): the hidden states pooled by `pooling`, scaled to unit length when
/// `unit`.
pub fn embed_tokens(
    ctx: &mut BatchContext,
    tokens: &[u32],
    pooling: Pooling,
    unit: bool,
) -> Result<Vec<f32>> {
    if tokens.is_empty() {
        return Err(Error::Invalid(
            "nothing to embed: the text has no tokens".into(),
        ));
    }
    let seq = ctx.add_seq();
    let hidden = ctx.hidden(seq, tokens);
    ctx.remove_seq(seq)?;
    let mut v = pooling.pool(&hidden?, ctx.model().config.n_embd);
    if unit {
        normalize(&mut v);
    }
    Ok(v)
}

/// Computes embeddings of texts with a model (its own context, one text at a time).
pub struct Embedder {
    ctx: BatchContext,
    pooling: Pooling,
}

impl Embedder {
    /// An embedder for texts of up to `n_ctx` tokens (0: the model's training context, at most
    /// 4096).
    pub fn new(model: Arc<Model>, n_ctx: usize) -> Result<Self> {
        let pooling = Pooling::of(&model)?;
        let params = BatchParams {
            n_ctx,
            ..BatchParams::default()
        };
        Ok(Embedder {
            ctx: BatchContext::new(model, params)?,
            pooling,
        })
    }

    /// The pooling in use.
    pub fn pooling(&self) -> Pooling {
        self.pooling
    }

    /// The unit-length embedding of `text` (tokenized with the model's special-token rules).
    pub fn embed(&mut self, text: &str) -> Result<Vec<f32>> {
        let tokens = self.ctx.model().tokenizer.encode(text, true, false)?;
        embed_tokens(&mut self.ctx, &tokens, self.pooling, true)
    }
}
