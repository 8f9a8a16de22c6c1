//! Phi 3 (mini, medium; 4k and 128k).

use tessera_core::Result;

use crate::config::{Meta, ModelConfig};

/// Phi 3: Q, K and V in one `attn_qkv` matrix and gate and up in one `ffn_up` matrix (read as
/// their row segments), NeoX rope with LongRoPE factors where the file has them. Some Phi 3
/// files name a sliding window; llama.cpp attends over the whole context for them, and so do
/// we, so that the tokens agree.
pub(super) fn configure(m: &Meta, cfg: &mut ModelConfig) -> Result<()> {
    cfg.block.fused_qkv = m.has_tensor("blk.0.attn_qkv.weight");
    cfg.block.fused_gate_up = true;
    Ok(())
}
