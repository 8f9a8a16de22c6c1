//! Gemma 2 and Gemma 3.
//!
//! Both scale the token embeddings by sqrt(n_embd), gate the feed-forward with GELU (tanh),
//! RMS-norm each block's attention and feed-forward outputs before they join the residual,
//! tie the output head to the embeddings, and alternate layers that attend through a sliding
//! window ("local") with layers that see the whole context ("global"). Gemma's norm weights are
//! stored with the 1 of its `(1 + w)` already added by the converter, so the plain RMS norm
//! applies.

use tessera_core::{GluOp, Result};

use super::Arch;
use crate::config::{Meta, ModelConfig};

/// Settings common to both. `window`: the sliding window of the local layers (None: every
/// layer global); `pattern`: the default local/global period (the last layer of each period is
/// global); `local_rope`: the rope base and scale of the local layers when the file gives no
/// `rope.freq_base_swa`.
fn configure_common(
    m: &Meta,
    cfg: &mut ModelConfig,
    window: Option<usize>,
    pattern: usize,
    local_rope: (f32, f32),
) -> Result<()> {
    let b = &mut cfg.block;
    b.ffn_act = GluOp::Geglu;
    b.post_norms = true;
    b.embd_scale = Some((cfg.n_embd as f32).sqrt());
    // The 27B models scale queries by the width per head of the embedding, the others by the
    // head width (Gemma's query_pre_attn_scalar).
    let big = matches!(
        (cfg.arch, cfg.n_layer),
        (Arch::Gemma2, 46) | (Arch::Gemma3, 62)
    );
    b.attn_scale = if big {
        1.0 / ((cfg.n_embd / cfg.n_head) as f32).sqrt()
    } else {
        1.0 / (cfg.head_dim as f32).sqrt()
    };
    let Some(window) = window else {
        return Ok(());
    };
    super::set_sliding_window(m, cfg, window, pattern, local_rope)
}

/// Gemma 2: window 4096 unless the file says, every other layer local (even layers), local
/// layers with the global rope, attention logits soft-capped at 50 and final logits at 30
/// unless the file says otherwise.
pub(super) fn configure_gemma2(m: &Meta, cfg: &mut ModelConfig) -> Result<()> {
    let window = m.usize_or("attention.sliding_window", 4096)?;
    let global = (cfg.rope.base, cfg.rope.freq_scale);
    configure_common(m, cfg, Some(window), 2, global)?;
    cfg.block.attn_softcap = m.f32_opt("attn_logit_softcapping")?.unwrap_or(50.0);
    cfg.block.final_softcap =
        Some(m.f32_opt("final_logit_softcapping")?.unwrap_or(30.0)).filter(|&c| c != 0.0);
    Ok(())
}

/// Gemma 3: per-head Q/K RMS norms, five local layers to each global one, local layers with
/// rope base 10000 and no scaling (the file's base and scaling apply to the global layers), no
/// soft-capping unless the file asks for final soft-capping. Without a sliding window in the
/// metadata every layer is global.
pub(super) fn configure_gemma3(m: &Meta, cfg: &mut ModelConfig) -> Result<()> {
    cfg.block.qk_norm = true;
    cfg.block.final_softcap = m.f32_opt("final_logit_softcapping")?.filter(|&c| c != 0.0);
    let window = m.usize_or("attention.sliding_window", 0)?;
    configure_common(m, cfg, (window > 0).then_some(window), 6, (10000.0, 1.0))
}
