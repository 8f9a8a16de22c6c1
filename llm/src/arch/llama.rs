//! Llama (Llama 1-3, Mistral, SmolLM ...) and Granite.

use tessera_core::{Error, Result};

use crate::config::{Meta, ModelConfig};

/// Llama: the shared settings as they are; optional Q/K/V biases where the file has them, the
/// attention scale of `attention.scale` where the file gives one, and a mixture of experts
/// where the file has `expert_count` (Mixtral: experts as wide as `feed_forward_length`,
/// their weights normalized to sum 1).
pub(super) fn configure(m: &Meta, cfg: &mut ModelConfig) -> Result<()> {
    cfg.block.qkv_bias = m.has_tensor("blk.0.attn_q.bias");
    if m.usize_or("expert_count", 0)? > 0 {
        cfg.moe = Some(super::moe::read_moe(m, cfg.n_ff, true, None)?);
    }
    if let Some(s) = m.f32_opt("attention.scale")?.filter(|&s| s != 0.0) {
        cfg.block.attn_scale = s;
    }
    Ok(())
}

/// Granite 3: Llama with the token embeddings scaled by `embedding_scale`, each block's
/// attention and feed-forward output by `residual_scale`, attention by `attention.scale`, and
/// the logits divided by `logit_scale` (which the file must give).
pub(super) fn configure_granite(m: &Meta, cfg: &mut ModelConfig) -> Result<()> {
    configure(m, cfg)?;
    let nonzero = |k: &str| -> Result<Option<f32>> { Ok(m.f32_opt(k)?.filter(|&v| v != 0.0)) };
    cfg.block.embd_scale = nonzero("embedding_scale")?;
    cfg.block.residual_scale = nonzero("residual_scale")?;
    cfg.block.logit_scale = Some(
        nonzero("logit_scale")?
            .ok_or_else(|| Error::Model("granite file without granite.logit_scale".into()))?,
    );
    Ok(())
}
