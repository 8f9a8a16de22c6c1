//! Qwen 2 / 2.5 and Qwen 3.

use tessera_core::Result;

use crate::config::{Meta, ModelConfig};

/// Qwen 2: Llama with Q, K and V biases (required) and NeoX rope.
pub(super) fn configure_qwen2(_m: &Meta, cfg: &mut ModelConfig) -> Result<()> {
    cfg.block.qkv_bias = true;
    Ok(())
}

/// Qwen 3: Llama with per-head RMS norms of Q and K before rope, and NeoX rope.
pub(super) fn configure_qwen3(_m: &Meta, cfg: &mut ModelConfig) -> Result<()> {
    cfg.block.qk_norm = true;
    Ok(())
}
