//! gpt-oss (OpenAI's open-weight mixtures of experts; llama.cpp's `LLM_ARCH_OPENAI_MOE`).
//!
//! The facts are llama.cpp's: Q, K, V and the attention output have biases; every layer's
//! attention has sinks (a learned logit per query head in the soft-max); even layers attend
//! through a sliding window of `attention.sliding_window` positions (the period 2 unless
//! `attention.sliding_window_pattern` says otherwise), odd layers see the whole context, both
//! with the file's rope (NeoX pairs, YaRN scaling from its metadata; the window layers' base is
//! `rope.freq_base_swa` where the file gives one); queries are scaled by 1/sqrt(rope
//! dimensions). The feed-forward is always a mixture of experts, normed by
//! `post_attention_norm`: the router (with a bias) picks the `expert_used_count` largest logits
//! and weighs them by a soft-max over those alone; each expert's gate, up and down projections
//! have biases, and its activation is the clamped SwiGLU with alpha 1.702 and limit 7, the
//! constants llama.cpp builds the graph with.

use tessera_core::{Error, Result};

use crate::config::{Meta, ModelConfig, Routing};

/// The clamped SwiGLU's alpha and limit.
const SWIGLU_OAI: [f32; 2] = [1.702, 7.0];

/// Sets gpt-oss's features.
pub(super) fn configure(m: &Meta, cfg: &mut ModelConfig) -> Result<()> {
    let b = &mut cfg.block;
    b.qkv_bias = true;
    b.attn_out_bias = true;
    b.attn_sinks = true;
    b.ffn_norm = "post_attention_norm";
    b.attn_scale = 1.0 / (cfg.rope.n_rot as f32).sqrt();

    if !m.has("expert_feed_forward_length") {
        return Err(Error::Model(
            "gpt-oss file without gpt-oss.expert_feed_forward_length".into(),
        ));
    }
    let mut moe = super::moe::read_moe(m, 0, false, None)?;
    moe.routing = Routing::TopKSoftMax;
    moe.biases = true;
    moe.swiglu_oai = Some(SWIGLU_OAI);
    cfg.moe = Some(moe);

    let window = m.usize("attention.sliding_window")?;
    let rope = (cfg.rope.base, cfg.rope.freq_scale);
    super::set_sliding_window(m, cfg, window, 2, rope)
}
