//! The architectures the runner computes, one small module each. Each reads the metadata its
//! architecture adds and sets the block features ([`crate::config::Block`]) and per-layer
//! settings ([`crate::config::LayerConfig`]) that the one block builder ([`crate::forward`])
//! computes. An architecture not listed here is refused by name.

mod gemma;
mod gpt_oss;
mod llama;
mod moe;
mod phi3;
mod qwen;

use std::fmt;

use tessera_core::{Error, Result, RopeMode};

use crate::config::{Meta, ModelConfig};

/// A model architecture (`general.architecture`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Arch {
    /// Llama 1-3 (and Mistral, whose files are `llama` files), with every rope scaling.
    Llama,
    /// IBM Granite 3: Llama with embedding, residual, attention and logit scales.
    Granite,
    /// Qwen 2 and 2.5: Llama with Q/K/V biases and NeoX rope.
    Qwen2,
    /// Qwen 3: Llama with per-head Q/K RMS norms and NeoX rope.
    Qwen3,
    /// Gemma 2: GELU-gated, post-norms, soft-capped attention and logits, local/global layers.
    Gemma2,
    /// Gemma 3: Gemma 2 with Q/K norms instead of attention soft-capping, five local layers to a
    /// global one, and a rope base of its own for the local layers.
    Gemma3,
    /// Phi 3: fused QKV and gate/up matrices, NeoX rope, LongRoPE factors.
    Phi3,
    /// Qwen 2 MoE: Qwen 2 with a mixture of experts and a gated shared expert.
    Qwen2Moe,
    /// Qwen 3 MoE: Qwen 3 with a mixture of experts.
    Qwen3Moe,
    /// OLMoE: a mixture of experts, Q and K normed over all heads.
    Olmoe,
    /// gpt-oss: biased attention with sinks on alternating sliding-window layers, biased
    /// experts (MXFP4 in OpenAI's files) with a clamped SwiGLU, routed by a soft-max over the
    /// selected logits.
    GptOss,
}

impl Arch {
    /// Every architecture, in the order of [`Arch::NAMES`].
    pub const ALL: [Arch; 11] = [
        Arch::Llama,
        Arch::Granite,
        Arch::Qwen2,
        Arch::Qwen3,
        Arch::Gemma2,
        Arch::Gemma3,
        Arch::Phi3,
        Arch::Qwen2Moe,
        Arch::Qwen3Moe,
        Arch::Olmoe,
        Arch::GptOss,
    ];

    /// The names GGUF files give them.
    pub const NAMES: [&'static str; 11] = [
        "llama", "granite", "qwen2", "qwen3", "gemma2", "gemma3", "phi3", "qwen2moe", "qwen3moe",
        "olmoe", "gpt-oss",
    ];

    /// The architecture a file names; an unknown name is an error listing the known ones.
    pub fn from_name(name: &str) -> Result<Arch> {
        Arch::NAMES
            .iter()
            .position(|&n| n == name)
            .map(|i| Arch::ALL[i])
            .ok_or_else(|| {
                Error::Model(format!(
                    "architecture '{name}' is not supported (supported: {})",
                    Arch::NAMES.join(", ")
                ))
            })
    }

    /// The GGUF name.
    pub fn name(self) -> &'static str {
        Arch::NAMES[Arch::ALL.iter().position(|&a| a == self).expect("listed")]
    }

    /// How rope pairs dimensions (llama.cpp's rope type of the architecture).
    pub fn rope_mode(self) -> RopeMode {
        match self {
            Arch::Llama | Arch::Granite => RopeMode::Normal,
            Arch::Qwen2
            | Arch::Qwen3
            | Arch::Gemma2
            | Arch::Gemma3
            | Arch::Phi3
            | Arch::Qwen2Moe
            | Arch::Qwen3Moe
            | Arch::Olmoe
            | Arch::GptOss => RopeMode::Neox,
        }
    }
}

impl fmt::Display for Arch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Puts layers on a sliding window of `window` positions: in each period of `pattern` layers
/// (the file's `attention.sliding_window_pattern` where it gives one; 0: every layer) all but
/// the last, with the local rope: base `rope.freq_base_swa` where the file gives one, else
/// `local_rope.0`, frequency scale `local_rope.1`. A per-layer pattern array is refused.
fn set_sliding_window(
    m: &Meta,
    cfg: &mut ModelConfig,
    window: usize,
    pattern: usize,
    local_rope: (f32, f32),
) -> Result<()> {
    if window == 0 {
        return Err(Error::Model("sliding window of 0 positions".into()));
    }
    let pattern_key = format!("{}.attention.sliding_window_pattern", cfg.arch);
    if m.file
        .get(&pattern_key)
        .and_then(|v| v.as_array())
        .is_some()
    {
        return Err(Error::Model(format!(
            "a per-layer {pattern_key} array is not supported"
        )));
    }
    let pattern = m.usize_or("attention.sliding_window_pattern", pattern)?;
    let base = m.f32_opt("rope.freq_base_swa")?.unwrap_or(local_rope.0);
    for (l, layer) in cfg.layers.iter_mut().enumerate() {
        if pattern == 0 || l % pattern < pattern - 1 {
            layer.window = Some(window);
            layer.rope_base = base;
            layer.rope_freq_scale = local_rope.1;
        }
    }
    Ok(())
}

/// Sets what `cfg.arch` adds to the shared settings.
pub(crate) fn configure(m: &Meta, cfg: &mut ModelConfig) -> Result<()> {
    match cfg.arch {
        Arch::Llama => llama::configure(m, cfg),
        Arch::Granite => llama::configure_granite(m, cfg),
        Arch::Qwen2 => qwen::configure_qwen2(m, cfg),
        Arch::Qwen3 => qwen::configure_qwen3(m, cfg),
        Arch::Gemma2 => gemma::configure_gemma2(m, cfg),
        Arch::Gemma3 => gemma::configure_gemma3(m, cfg),
        Arch::Phi3 => phi3::configure(m, cfg),
        Arch::Qwen2Moe => moe::configure_qwen2moe(m, cfg),
        Arch::Qwen3Moe => moe::configure_qwen3moe(m, cfg),
        Arch::Olmoe => moe::configure_olmoe(m, cfg),
        Arch::GptOss => gpt_oss::configure(m, cfg),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_unknown_ones_are_refused_by_name() {
        for a in Arch::ALL {
            assert_eq!(Arch::from_name(a.name()).unwrap(), a);
        }
        assert_eq!(Arch::from_name("gpt-oss").unwrap(), Arch::GptOss);
        let e = Arch::from_name("mamba").unwrap_err().to_string();
        assert!(e.contains("'mamba'") && e.contains("gpt-oss"), "{e}");
    }
}
