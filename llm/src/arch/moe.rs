//! The mixture-of-experts architectures: Qwen 2 MoE, Qwen 3 MoE and OLMoE, and what every MoE
//! file shares (the expert counts and widths, read by [`read_moe`]; Mixtral is a `llama` file
//! with experts, see [`super::llama`]).
//!
//! The facts are llama.cpp's: every one of these routes with a soft-max over the router's
//! logits; Mixtral and Qwen 3 MoE divide the selected probabilities by their sum, Qwen 2 MoE and
//! OLMoE do not; llama.cpp reads no weight scale for them.

use tessera_core::{Error, Result};

use crate::config::{Meta, ModelConfig, Moe, Routing};

/// The experts of a file: `expert_count` and `expert_used_count` (both required, used at
/// most the count), each expert `expert_feed_forward_length` wide (or `n_ff_default`).
pub(super) fn read_moe(
    m: &Meta,
    n_ff_default: usize,
    norm_weights: bool,
    shared_ff: Option<usize>,
) -> Result<Moe> {
    let n_expert = m.usize("expert_count")?;
    let n_used = m.usize("expert_used_count")?;
    if n_expert == 0 || n_used == 0 || n_used > n_expert {
        return Err(Error::Model(format!(
            "a mixture of {n_expert} experts using {n_used} per token: need 0 < used <= experts"
        )));
    }
    for k in ["expert_group_count", "expert_gating_func"] {
        if m.usize_or(k, 0)? > 1 {
            return Err(Error::Model(format!(
                "metadata '{k}' = {} (expert groups or a gating other than soft-max) is not \
                 supported",
                m.usize(k)?
            )));
        }
    }
    Ok(Moe {
        n_expert,
        n_used,
        n_ff_exp: m.usize_or("expert_feed_forward_length", n_ff_default)?,
        norm_weights,
        shared_ff,
        routing: Routing::SoftMax,
        biases: false,
        swiglu_oai: None,
    })
}

/// Qwen 2 MoE (Qwen1.5-MoE, Qwen2-57B-A14B): Qwen 2's attention (Q/K/V biases where the file
/// has them), unnormalized expert weights, and a shared expert gated by a sigmoid.
pub(super) fn configure_qwen2moe(m: &Meta, cfg: &mut ModelConfig) -> Result<()> {
    cfg.block.qkv_bias = m.has_tensor("blk.0.attn_q.bias");
    let shared = m.usize_or("expert_shared_feed_forward_length", cfg.n_ff)?;
    cfg.moe = Some(read_moe(
        m,
        cfg.n_ff / m.usize("expert_used_count")?.max(1),
        false,
        Some(shared),
    )?);
    Ok(())
}

/// Qwen 3 MoE (Qwen3-30B-A3B, Qwen3-235B-A22B): Qwen 3's per-head Q/K norms, expert weights
/// normalized to sum 1.
pub(super) fn configure_qwen3moe(m: &Meta, cfg: &mut ModelConfig) -> Result<()> {
    cfg.block.qk_norm = true;
    cfg.block.qkv_bias = m.has_tensor("blk.0.attn_q.bias");
    cfg.moe = Some(read_moe(
        m,
        cfg.n_ff / m.usize("expert_used_count")?.max(1),
        true,
        None,
    )?);
    Ok(())
}

/// OLMoE: Q and K RMS-normed over all heads at once, unnormalized expert weights, each expert
/// `feed_forward_length` wide.
pub(super) fn configure_olmoe(m: &Meta, cfg: &mut ModelConfig) -> Result<()> {
    cfg.block.qk_norm_whole = true;
    cfg.moe = Some(read_moe(m, cfg.n_ff, false, None)?);
    Ok(())
}
