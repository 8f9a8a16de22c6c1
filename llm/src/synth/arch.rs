//! The generated models of every architecture: their shapes ([`ArchShape`]), the tensors each
//! architecture's file holds, the metadata keys it carries, and the type each matrix is written
//! in ([`SynthType`]).
//!
//! Tensor names, shapes and metadata keys are the ones llama.cpp reads for the architecture
//! (and that its converter writes), so that llama.cpp loads every file: a file with a tensor its
//! loader does not take is refused, so each architecture lists exactly its own.

use tessera_core::gguf::GgufValue;
use tessera_core::{DType, Error, Result};

use super::vocab::{self, MIN_VOCAB};
use super::{Metadata, Plan};

/// An architecture a generated model is written as (`general.architecture`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Arch {
    /// Llama 2/3 (and Mistral, which converts to `llama`).
    Llama,
    /// Qwen 2 and 2.5: biases on the Q, K and V projections.
    Qwen2,
    /// Qwen 3: an RMS norm over each query and key head, no biases.
    Qwen3,
    /// Gemma 2: post-attention and post-FFN norms, attention and final logit soft-capping,
    /// sliding-window attention on every other layer, GELU-gated FFN, tied output.
    Gemma2,
    /// Gemma 3: as Gemma 2 without soft-capping, with Q/K norms and five local layers to one
    /// global.
    Gemma3,
    /// Phi 3: fused QKV and gate/up projections, LongRoPE factors.
    Phi3,
    /// Qwen 2 MoE: Qwen 2's attention, a mixture of experts and a gated shared expert.
    Qwen2Moe,
    /// Qwen 3 MoE: Qwen 3's attention and a mixture of experts.
    Qwen3Moe,
    /// OLMoE: Q and K normed over all heads, a mixture of experts.
    Olmoe,
    /// gpt-oss: Q/K/V and output biases, attention sinks, a sliding window on even layers,
    /// YaRN rope, biased experts in MXFP4 (as OpenAI's files hold them) behind a biased router.
    GptOss,
}

impl Arch {
    /// The `general.architecture` value, also the prefix of the architecture's keys.
    pub fn name(self) -> &'static str {
        match self {
            Arch::Llama => "llama",
            Arch::Qwen2 => "qwen2",
            Arch::Qwen3 => "qwen3",
            Arch::Gemma2 => "gemma2",
            Arch::Gemma3 => "gemma3",
            Arch::Phi3 => "phi3",
            Arch::Qwen2Moe => "qwen2moe",
            Arch::Qwen3Moe => "qwen3moe",
            Arch::Olmoe => "olmoe",
            Arch::GptOss => "gpt-oss",
        }
    }

    /// The name `general.name` uses (not "phi3" or "phi-3": llama.cpp gives the special
    /// tokens of a model so named Phi 3's own attributes, which need Phi 3's vocabulary).
    fn display(self) -> &'static str {
        match self {
            Arch::Llama => "Llama",
            Arch::Qwen2 => "Qwen 2",
            Arch::Qwen3 => "Qwen 3",
            Arch::Gemma2 => "Gemma 2",
            Arch::Gemma3 => "Gemma 3",
            Arch::Phi3 => "Phi 3",
            Arch::Qwen2Moe => "Qwen 2 MoE",
            Arch::Qwen3Moe => "Qwen 3 MoE",
            Arch::Olmoe => "OLMoE",
            Arch::GptOss => "gpt-oss",
        }
    }

    /// Whether every matrix row is of `n_embd` values in and out of attention (llama.cpp's
    /// Qwen 2 and Phi 3 loaders take `attn_output` as `[n_embd, n_embd]`, so the heads must
    /// cover the width exactly).
    fn heads_cover_width(self) -> bool {
        matches!(
            self,
            Arch::Qwen2 | Arch::Phi3 | Arch::Qwen2Moe | Arch::Olmoe
        )
    }

    /// Whether every layer's feed-forward is a mixture of experts.
    fn is_moe(self) -> bool {
        matches!(
            self,
            Arch::Qwen2Moe | Arch::Qwen3Moe | Arch::Olmoe | Arch::GptOss
        )
    }
}

/// The experts of a mixture-of-experts model (all zero for a dense one).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Experts {
    /// Experts per layer (`expert_count`; 0: a dense feed-forward).
    pub n_expert: usize,
    /// Experts each token uses (`expert_used_count`).
    pub n_used: usize,
    /// Width of one expert (`expert_feed_forward_length` where the architecture writes it;
    /// Mixtral's and OLMoE's experts are `n_ff` wide).
    pub n_ff_exp: usize,
    /// Width of the shared expert (Qwen 2 MoE's `expert_shared_feed_forward_length`).
    pub n_ff_shared: usize,
}

impl Experts {
    /// A dense model.
    pub const NONE: Experts = Experts {
        n_expert: 0,
        n_used: 0,
        n_ff_exp: 0,
        n_ff_shared: 0,
    };
}

/// The rope scaling a generated file carries.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum RopeScaling {
    /// None.
    None,
    /// Positions divided by the factor (`rope.scaling.type` linear, `rope.scaling.factor`); on
    /// Gemma 3 only the global layers are scaled.
    Linear(f32),
    /// Llama 3.1's per-dimension frequency divisors, written as `rope_freqs.weight` and computed
    /// as Hugging Face's converter does from these four numbers and the file's rope base and
    /// head width (no scaling keys: the tensor is the whole of it).
    Llama3 {
        /// The divisor of the slowest frequencies.
        factor: f32,
        /// Wavelengths over `original_context / low_freq_factor` are divided by `factor`.
        low_freq_factor: f32,
        /// Wavelengths under `original_context / high_freq_factor` are kept.
        high_freq_factor: f32,
        /// The context the model was first trained for.
        original_context: usize,
    },
    /// YaRN (gpt-oss): `rope.scaling.type` yarn, `rope.scaling.factor` and
    /// `rope.scaling.original_context_length`.
    Yarn {
        /// The context scale.
        factor: f32,
        /// The context the model was first trained for.
        original_context: usize,
    },
    /// Phi 3's LongRoPE: `rope_factors_short.weight` (used while the context is at most
    /// `original_context`) and `rope_factors_long.weight`, with
    /// `rope.scaling.original_context_length` and `rope.scaling.attn_factor`, the latter
    /// `sqrt(1 + ln(s) / ln(original_context))` for `s` = context length / `original_context`
    /// as the converter writes it.
    LongRope {
        /// The context the model was first trained for.
        original_context: usize,
    },
}

/// The shape of a generated model of any [`Arch`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ArchShape {
    /// The architecture.
    pub arch: Arch,
    /// Embedding width.
    pub n_embd: usize,
    /// Transformer blocks.
    pub n_layer: usize,
    /// Feed-forward width.
    pub n_ff: usize,
    /// Query heads.
    pub n_head: usize,
    /// Key/value heads.
    pub n_head_kv: usize,
    /// Width of one head (keys, values and queries); written as `attention.key_length` and
    /// `value_length` where the architecture's converter writes them.
    pub head_dim: usize,
    /// Vocabulary size (at least [`MIN_VOCAB`]).
    pub n_vocab: usize,
    /// Training context length written to the file.
    pub n_ctx_train: usize,
    /// Rope frequency base (of the global layers where an architecture has local ones).
    pub rope_base: f32,
    /// The rope scaling the file carries.
    pub rope_scaling: RopeScaling,
    /// RMS norm epsilon.
    pub rms_eps: f32,
    /// Sliding-window width (`attention.sliding_window`): the local layers' window on Gemma;
    /// on Phi 3 written as its converter does but not used by llama.cpp; 0 elsewhere.
    pub sliding_window: usize,
    /// Gemma 2's attention-score soft cap (0 elsewhere).
    pub attn_softcap: f32,
    /// Gemma 2's final-logit soft cap (0 elsewhere).
    pub final_softcap: f32,
    /// Whether the output projection is the token embedding (no `output.weight`).
    pub tied_output: bool,
    /// The mixture of experts ([`Experts::NONE`] for a dense model).
    pub experts: Experts,
}

/// The small shapes have these in common: width 128, feed-forward 384, 4 query heads over 2
/// KV heads (grouped-query attention), a vocabulary of 1024 generated tokens; a prompt of a
/// hundred tokens takes milliseconds on the CPU.
const SMALL: ArchShape = ArchShape {
    arch: Arch::Llama,
    n_embd: 128,
    n_layer: 3,
    n_ff: 384,
    n_head: 4,
    n_head_kv: 2,
    head_dim: 32,
    n_vocab: 1024,
    n_ctx_train: 8192,
    rope_base: 10_000.0,
    rope_scaling: RopeScaling::None,
    rms_eps: 1e-5,
    sliding_window: 0,
    attn_softcap: 0.0,
    final_softcap: 0.0,
    tied_output: true,
    experts: Experts::NONE,
};

/// Llama 3.1's rope frequency factors (factor 8, low 1, high 4, original context 8192).
const LLAMA31_ROPE: RopeScaling = RopeScaling::Llama3 {
    factor: 8.0,
    low_freq_factor: 1.0,
    high_freq_factor: 4.0,
    original_context: 8192,
};

impl ArchShape {
    /// Llama 3.2-style small model: 3 layers, Llama 3.1 rope factors (`rope_freqs.weight`)
    /// over heads of 32, rope base 500000, tied output.
    pub const LLAMA3_SMALL: ArchShape = ArchShape {
        n_ctx_train: 131_072,
        rope_base: 500_000.0,
        rope_scaling: LLAMA31_ROPE,
        ..SMALL
    };

    /// A small Llama whose matrix rows are all whole 256-value blocks (so that every K and
    /// i-quant type is used as asked, not its fallback), four query heads per KV head, and 8
    /// layers (llama.cpp's mixes treat the first eighth differently).
    pub const QUANT_SMALL: ArchShape = ArchShape {
        n_embd: 256,
        n_layer: 8,
        n_ff: 512,
        n_head: 4,
        n_head_kv: 1,
        head_dim: 64,
        ..SMALL
    };

    /// Llama 3.1 8B: Llama 3 8B's shape with its rope factors and 131072 context.
    pub const LLAMA31_8B: ArchShape = ArchShape {
        arch: Arch::Llama,
        n_embd: 4096,
        n_layer: 32,
        n_ff: 14_336,
        n_head: 32,
        n_head_kv: 8,
        head_dim: 128,
        n_vocab: 128_256,
        n_ctx_train: 131_072,
        rope_base: 500_000.0,
        rope_scaling: LLAMA31_ROPE,
        rms_eps: 1e-5,
        sliding_window: 0,
        attn_softcap: 0.0,
        final_softcap: 0.0,
        tied_output: false,
        experts: Experts::NONE,
    };

    /// Qwen 2.5 0.5B-style small model: 3 layers, Q/K/V biases, rope base 1e6, tied output.
    pub const QWEN2_SMALL: ArchShape = ArchShape {
        arch: Arch::Qwen2,
        n_ctx_train: 32_768,
        rope_base: 1_000_000.0,
        rms_eps: 1e-6,
        ..SMALL
    };

    /// Qwen 2.5 7B: width 3584, 28 layers, feed-forward 18944, 28 query and 4 KV heads of 128,
    /// vocabulary 152064, separate output.
    pub const QWEN2_7B: ArchShape = ArchShape {
        arch: Arch::Qwen2,
        n_embd: 3584,
        n_layer: 28,
        n_ff: 18_944,
        n_head: 28,
        n_head_kv: 4,
        head_dim: 128,
        n_vocab: 152_064,
        n_ctx_train: 32_768,
        rope_base: 1_000_000.0,
        rope_scaling: RopeScaling::None,
        rms_eps: 1e-6,
        sliding_window: 0,
        attn_softcap: 0.0,
        final_softcap: 0.0,
        tied_output: false,
        experts: Experts::NONE,
    };

    /// Qwen 3 0.6B-style small model: 3 layers, heads of 64 whose queries (256 wide) are
    /// wider than the model (as Qwen 3 0.6B's are), per-head Q/K norms, tied output.
    pub const QWEN3_SMALL: ArchShape = ArchShape {
        arch: Arch::Qwen3,
        head_dim: 64,
        n_ctx_train: 40_960,
        rope_base: 1_000_000.0,
        rms_eps: 1e-6,
        ..SMALL
    };

    /// Qwen 3 8B: width 4096, 36 layers, feed-forward 12288, 32 query and 8 KV heads of 128,
    /// vocabulary 151936, separate output.
    pub const QWEN3_8B: ArchShape = ArchShape {
        arch: Arch::Qwen3,
        n_embd: 4096,
        n_layer: 36,
        n_ff: 12_288,
        n_head: 32,
        n_head_kv: 8,
        head_dim: 128,
        n_vocab: 151_936,
        n_ctx_train: 40_960,
        rope_base: 1_000_000.0,
        rope_scaling: RopeScaling::None,
        rms_eps: 1e-6,
        sliding_window: 0,
        attn_softcap: 0.0,
        final_softcap: 0.0,
        tied_output: false,
        experts: Experts::NONE,
    };

    /// Gemma 2-style small model: 4 layers (local, global, local, global), heads of 48 (queries
    /// 192 wide), a sliding window of 16, and soft caps of 10 on attention scores and 100 on the
    /// logits (Gemma 2's are 50 and 30: a random model's scores never come near 50, and a cap of
    /// 30 on its logits, which spread wider than a trained model's, would squeeze the top ones
    /// together; these bend both without hiding the order).
    pub const GEMMA2_SMALL: ArchShape = ArchShape {
        arch: Arch::Gemma2,
        n_layer: 4,
        head_dim: 48,
        rms_eps: 1e-6,
        sliding_window: 16,
        attn_softcap: 10.0,
        final_softcap: 100.0,
        ..SMALL
    };

    /// Gemma 2 9B: width 3584, 42 layers, feed-forward 14336, 16 query and 8 KV heads of 256,
    /// vocabulary 256000, window 4096, soft caps 50 and 30.
    pub const GEMMA2_9B: ArchShape = ArchShape {
        arch: Arch::Gemma2,
        n_embd: 3584,
        n_layer: 42,
        n_ff: 14_336,
        n_head: 16,
        n_head_kv: 8,
        head_dim: 256,
        n_vocab: 256_000,
        n_ctx_train: 8192,
        rope_base: 10_000.0,
        rope_scaling: RopeScaling::None,
        rms_eps: 1e-6,
        sliding_window: 4096,
        attn_softcap: 50.0,
        final_softcap: 30.0,
        tied_output: true,
        experts: Experts::NONE,
    };

    /// Gemma 3-style small model: 6 layers (five local, then one global), 4 query heads of 64
    /// over one KV head, a sliding window of 16, global rope base 1e6 scaled linearly by 8 as
    /// Gemma 3 4B-27B's are (the local layers keep llama.cpp's default base 10000, unscaled).
    pub const GEMMA3_SMALL: ArchShape = ArchShape {
        arch: Arch::Gemma3,
        n_layer: 6,
        n_head_kv: 1,
        head_dim: 64,
        n_ctx_train: 32_768,
        rope_base: 1_000_000.0,
        rope_scaling: RopeScaling::Linear(8.0),
        rms_eps: 1e-6,
        sliding_window: 16,
        ..SMALL
    };

    /// Gemma 3 4B (text): width 2560, 34 layers, feed-forward 10240, 8 query and 4 KV heads
    /// of 256, vocabulary 262208, window 1024, global rope base 1e6 scaled linearly by 8.
    pub const GEMMA3_4B: ArchShape = ArchShape {
        arch: Arch::Gemma3,
        n_embd: 2560,
        n_layer: 34,
        n_ff: 10_240,
        n_head: 8,
        n_head_kv: 4,
        head_dim: 256,
        n_vocab: 262_208,
        n_ctx_train: 131_072,
        rope_base: 1_000_000.0,
        rope_scaling: RopeScaling::Linear(8.0),
        rms_eps: 1e-6,
        sliding_window: 1024,
        attn_softcap: 0.0,
        final_softcap: 0.0,
        tied_output: true,
        experts: Experts::NONE,
    };

    /// Phi 3-style small model: 3 layers, fused QKV and gate/up, LongRoPE factors for a
    /// 131072 context trained from 4096 (the short factors apply below 4096), separate output.
    pub const PHI3_SMALL: ArchShape = ArchShape {
        arch: Arch::Phi3,
        n_ctx_train: 131_072,
        rope_scaling: RopeScaling::LongRope {
            original_context: 4096,
        },
        sliding_window: 262_144,
        tied_output: false,
        ..SMALL
    };

    /// Phi 3 mini 128k: width 3072, 32 layers, feed-forward 8192, 32 heads of 96 (no grouping),
    /// vocabulary 32064, LongRoPE from 4096 to 131072, separate output.
    pub const PHI3_MINI: ArchShape = ArchShape {
        arch: Arch::Phi3,
        n_embd: 3072,
        n_layer: 32,
        n_ff: 8192,
        n_head: 32,
        n_head_kv: 32,
        head_dim: 96,
        n_vocab: 32_064,
        n_ctx_train: 131_072,
        rope_base: 10_000.0,
        rope_scaling: RopeScaling::LongRope {
            original_context: 4096,
        },
        rms_eps: 1e-5,
        sliding_window: 262_144,
        attn_softcap: 0.0,
        final_softcap: 0.0,
        tied_output: false,
        experts: Experts::NONE,
    };

    /// Mixtral-style small model (a `llama` file with experts): 3 layers, 8 experts of width
    /// 128, 2 per token, rope base 1e6, separate output.
    pub const MIXTRAL_SMALL: ArchShape = ArchShape {
        n_ff: 128,
        rope_base: 1_000_000.0,
        n_ctx_train: 32_768,
        tied_output: false,
        experts: Experts {
            n_expert: 8,
            n_used: 2,
            n_ff_exp: 128,
            n_ff_shared: 0,
        },
        ..SMALL
    };

    /// Mixtral 8x7B: Mistral 7B's attention (width 4096, 32 layers, 32 query and 8 KV heads of
    /// 128, vocabulary 32000, rope base 1e6) with 8 experts of width 14336, 2 per token.
    pub const MIXTRAL_8X7B: ArchShape = ArchShape {
        arch: Arch::Llama,
        n_embd: 4096,
        n_layer: 32,
        n_ff: 14_336,
        n_head: 32,
        n_head_kv: 8,
        head_dim: 128,
        n_vocab: 32_000,
        n_ctx_train: 32_768,
        rope_base: 1_000_000.0,
        rope_scaling: RopeScaling::None,
        rms_eps: 1e-5,
        sliding_window: 0,
        attn_softcap: 0.0,
        final_softcap: 0.0,
        tied_output: false,
        experts: Experts {
            n_expert: 8,
            n_used: 2,
            n_ff_exp: 14_336,
            n_ff_shared: 0,
        },
    };

    /// Qwen 1.5 MoE-style small model: Qwen 2's attention, 8 experts of width 64, 2 per token,
    /// a shared expert of width 192, separate output (llama.cpp's loader requires one).
    pub const QWEN2MOE_SMALL: ArchShape = ArchShape {
        arch: Arch::Qwen2Moe,
        tied_output: false,
        experts: Experts {
            n_expert: 8,
            n_used: 2,
            n_ff_exp: 64,
            n_ff_shared: 192,
        },
        ..ArchShape::QWEN2_SMALL
    };

    /// Qwen 3 30B-A3B-style small model: Qwen 3's attention, 16 experts of width 64, 4 per
    /// token (weights normalized to sum 1).
    pub const QWEN3MOE_SMALL: ArchShape = ArchShape {
        arch: Arch::Qwen3Moe,
        experts: Experts {
            n_expert: 16,
            n_used: 4,
            n_ff_exp: 64,
            n_ff_shared: 0,
        },
        ..ArchShape::QWEN3_SMALL
    };

    /// Qwen 3 30B-A3B: width 2048, 48 layers, 32 query and 4 KV heads of 128, 128 experts of
    /// width 768, 8 per token, vocabulary 151936, separate output.
    pub const QWEN3_30B_A3B: ArchShape = ArchShape {
        arch: Arch::Qwen3Moe,
        n_embd: 2048,
        n_layer: 48,
        n_ff: 6144,
        n_head: 32,
        n_head_kv: 4,
        head_dim: 128,
        n_vocab: 151_936,
        n_ctx_train: 40_960,
        rope_base: 1_000_000.0,
        rope_scaling: RopeScaling::None,
        rms_eps: 1e-6,
        sliding_window: 0,
        attn_softcap: 0.0,
        final_softcap: 0.0,
        tied_output: false,
        experts: Experts {
            n_expert: 128,
            n_used: 8,
            n_ff_exp: 768,
            n_ff_shared: 0,
        },
    };

    /// OLMoE-style small model: 4 heads of 32 covering the width (no grouped KV heads, as
    /// OLMoE's K norm is as wide as the model), 8 experts of width 64, 2 per token.
    pub const OLMOE_SMALL: ArchShape = ArchShape {
        arch: Arch::Olmoe,
        n_head_kv: 4,
        n_ff: 64,
        n_ctx_train: 4096,
        tied_output: false,
        experts: Experts {
            n_expert: 8,
            n_used: 2,
            n_ff_exp: 64,
            n_ff_shared: 0,
        },
        ..SMALL
    };

    /// gpt-oss-style small model: 4 layers (window, global, window, global), 8 query heads of
    /// 64 over 2 KV heads (queries 512 wide), a window of 16, rope base 150000 with YaRN 32
    /// from 4096 as gpt-oss's, 16 experts of width 128, 4 per token, separate output.
    pub const GPT_OSS_SMALL: ArchShape = ArchShape {
        arch: Arch::GptOss,
        n_layer: 4,
        n_ff: 128,
        n_head: 8,
        n_head_kv: 2,
        head_dim: 64,
        n_ctx_train: 131_072,
        rope_base: 150_000.0,
        rope_scaling: RopeScaling::Yarn {
            factor: 32.0,
            original_context: 4096,
        },
        sliding_window: 16,
        tied_output: false,
        experts: Experts {
            n_expert: 16,
            n_used: 4,
            n_ff_exp: 128,
            n_ff_shared: 0,
        },
        ..SMALL
    };

    /// gpt-oss-20b: width 2880, 24 layers, 64 query and 8 KV heads of 64, window 128, 32
    /// experts of width 2880, 4 per token, vocabulary 201088, rope base 150000 with YaRN 32
    /// from 4096, separate output.
    pub const GPT_OSS_20B: ArchShape = ArchShape {
        arch: Arch::GptOss,
        n_embd: 2880,
        n_layer: 24,
        n_ff: 2880,
        n_head: 64,
        n_head_kv: 8,
        head_dim: 64,
        n_vocab: 201_088,
        n_ctx_train: 131_072,
        rope_base: 150_000.0,
        rope_scaling: RopeScaling::Yarn {
            factor: 32.0,
            original_context: 4096,
        },
        rms_eps: 1e-5,
        sliding_window: 128,
        attn_softcap: 0.0,
        final_softcap: 0.0,
        tied_output: false,
        experts: Experts {
            n_expert: 32,
            n_used: 4,
            n_ff_exp: 2880,
            n_ff_shared: 0,
        },
    };

    /// Checks that the shape makes a file llama.cpp and the runner can load.
    pub(super) fn check(&self) -> Result<()> {
        let bad = |why: String| Err(Error::Invalid(format!("synthetic shape {self:?}: {why}")));
        if self.n_layer == 0 || self.n_head == 0 || self.n_head_kv == 0 || self.n_ff == 0 {
            return bad("layers, heads and the feed-forward width must be at least 1".into());
        }
        if self.n_embd == 0 || !self.n_head.is_multiple_of(self.n_head_kv) {
            return bad("the width must be positive and the KV heads must divide the heads".into());
        }
        if self.head_dim == 0 || !self.head_dim.is_multiple_of(2) {
            return bad(format!(
                "the head width {} must be even for rope",
                self.head_dim
            ));
        }
        if self.arch.heads_cover_width() && self.head_dim * self.n_head != self.n_embd {
            return bad(format!(
                "{} takes queries as wide as the model: {} heads of {} must make {}",
                self.arch.name(),
                self.n_head,
                self.head_dim,
                self.n_embd
            ));
        }
        if !(MIN_VOCAB..=1 << 24).contains(&self.n_vocab) {
            return bad(format!(
                "the vocabulary must have {MIN_VOCAB} to {} tokens",
                1 << 24
            ));
        }
        if self.n_ctx_train == 0 || !(self.rope_base.is_finite() && self.rope_base > 0.0) {
            return bad("the context length and rope base must be positive".into());
        }
        let e = &self.experts;
        let moe = e.n_expert > 0;
        if self.arch.is_moe() && !moe {
            return bad(format!("{} files have experts", self.arch.name()));
        }
        if moe && !(self.arch.is_moe() || self.arch == Arch::Llama) {
            return bad(format!("{} files have no experts here", self.arch.name()));
        }
        if moe && !(0 < e.n_used && e.n_used <= e.n_expert && e.n_ff_exp > 0) {
            return bad("experts: need 0 < used <= experts and a positive width".into());
        }
        if moe && matches!(self.arch, Arch::Llama | Arch::Olmoe) && e.n_ff_exp != self.n_ff {
            return bad("Mixtral's and OLMoE's experts are the feed-forward width".into());
        }
        if (self.arch == Arch::Qwen2Moe) != (e.n_ff_shared > 0) {
            return bad("Qwen 2 MoE files, and only they, have a shared expert".into());
        }
        if matches!(self.arch, Arch::Qwen2Moe | Arch::Olmoe) && self.tied_output {
            return bad(format!(
                "llama.cpp's {} loader requires output.weight",
                self.arch.name()
            ));
        }
        if self.arch == Arch::Olmoe && self.n_head_kv != self.n_head {
            return bad("OLMoE's K norm is as wide as the model: no grouped KV heads".into());
        }
        let gemma = matches!(self.arch, Arch::Gemma2 | Arch::Gemma3);
        if (gemma || self.arch == Arch::GptOss) && self.sliding_window == 0 {
            return bad(format!("{} files need a sliding window", self.arch.name()));
        }
        if self.arch == Arch::GptOss {
            if self.tied_output {
                return bad("llama.cpp's gpt-oss loader requires output.weight".into());
            }
            let mx = DType::MXFP4.block_size();
            if !(self.n_embd.is_multiple_of(mx) && e.n_ff_exp.is_multiple_of(mx)) {
                return bad(format!(
                    "gpt-oss's MXFP4 experts need the width and expert width in blocks of {mx}"
                ));
            }
        }
        if self.arch == Arch::Gemma2 && !self.tied_output {
            return bad("llama.cpp's Gemma 2 takes its output from the token embedding".into());
        }
        let caps = self.attn_softcap != 0.0 || self.final_softcap != 0.0;
        if self.arch == Arch::Gemma2 && !(self.attn_softcap > 0.0 && self.final_softcap > 0.0) {
            return bad("Gemma 2 files carry both soft caps".into());
        }
        if self.arch != Arch::Gemma2 && caps {
            return bad("only Gemma 2 files carry soft caps here".into());
        }
        match self.rope_scaling {
            RopeScaling::None => {}
            RopeScaling::Linear(f) if f.is_finite() && f > 0.0 => {}
            RopeScaling::Linear(f) => return bad(format!("linear rope factor {f}")),
            RopeScaling::Llama3 {
                factor,
                low_freq_factor,
                high_freq_factor,
                original_context,
            } => {
                if self.arch != Arch::Llama {
                    return bad("Llama 3 rope factors belong to llama files".into());
                }
                if !(factor > 0.0 && high_freq_factor > low_freq_factor && original_context > 0) {
                    return bad("Llama 3 rope factors need factor > 0, high > low".into());
                }
            }
            RopeScaling::Yarn {
                factor,
                original_context,
            } => {
                if !(factor > 1.0 && original_context > 0) {
                    return bad("YaRN needs a factor above 1 and an original context".into());
                }
            }
            RopeScaling::LongRope { original_context } => {
                if self.arch != Arch::Phi3 {
                    return bad("LongRoPE factors belong to phi3 files".into());
                }
                if original_context == 0 || original_context > self.n_ctx_train {
                    return bad("LongRoPE's original context must be within the context".into());
                }
            }
        }
        Ok(())
    }
}

/// The types [`SynthType::All`] takes: F16, F32, Q4_0, Q4_1, Q8_0, Q4_K, and every newer quant
/// type (the lattice i-quants tessera does not write, IQ1_S, IQ2_XXS and IQ2_XS, as random
/// blocks: see [`tessera_core::quant::fit_random_block`]).
pub const SYNTH_TYPES: [DType; 18] = [
    DType::Q4_0,
    DType::Q4_1,
    DType::Q8_0,
    DType::Q4_K,
    DType::F16,
    DType::F32,
    DType::IQ1_S,
    DType::IQ1_M,
    DType::IQ2_XXS,
    DType::IQ2_XS,
    DType::IQ2_S,
    DType::IQ3_XXS,
    DType::IQ3_S,
    DType::IQ4_NL,
    DType::IQ4_XS,
    DType::TQ1_0,
    DType::TQ2_0,
    DType::MXFP4,
];

/// The types the weight matrices of a synthetic model are written in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SynthType {
    /// Every matrix of this type (one of [`SYNTH_TYPES`]); where a row is not whole blocks
    /// of Q4_K, Q5_0.
    All(DType),
    /// llama.cpp's Q4_K_M mix: Q4_K, but Q6_K for the output head (or the token embedding
    /// where it is the head), and for `attn_v` (or a fused `attn_qkv`) and `ffn_down` in the
    /// first and last eighth of the layers and every third layer between; with llama.cpp's
    /// fallbacks where a row is not whole 256-value blocks (Q4_K to Q5_0, Q6_K to Q8_0).
    Q4KM,
    /// llama.cpp's IQ4_XS mix (without an importance matrix): IQ4_XS, but Q6_K for the output
    /// head (or the token embedding where it is the head), Q5_K for `attn_v` (or a fused
    /// `attn_qkv`) where four or more query heads share a KV head, and Q5_K for `ffn_down` in
    /// the first eighth of the layers; IQ4_XS falls back to IQ4_NL where a row is not whole
    /// 256-value blocks (Q5_K to Q5_1, Q6_K to Q8_0).
    IQ4XSMix,
}

impl SynthType {
    /// Every type's name, as the command line takes them.
    pub const NAMES: [&'static str; 20] = [
        "q4_0",
        "q4_1",
        "q8_0",
        "q4_k",
        "f16",
        "f32",
        "iq1_s",
        "iq1_m",
        "iq2_xxs",
        "iq2_xs",
        "iq2_s",
        "iq3_xxs",
        "iq3_s",
        "iq4_nl",
        "iq4_xs",
        "tq1_0",
        "tq2_0",
        "mxfp4",
        "q4_k_m",
        "iq4_xs_mix",
    ];

    /// The type of this name; an error listing the names otherwise.
    pub fn from_name(name: &str) -> Result<SynthType> {
        match name {
            "q4_k_m" => return Ok(SynthType::Q4KM),
            "iq4_xs_mix" => return Ok(SynthType::IQ4XSMix),
            _ => {}
        }
        let ty = SynthType::All(DType::from_name(name).map_err(|_| unknown_type(name))?);
        ty.check()?;
        Ok(ty)
    }

    /// The name (`q4_0`, ..., `q4_k_m`).
    pub fn name(self) -> &'static str {
        match self {
            SynthType::All(t) => t.name(),
            SynthType::Q4KM => "q4_k_m",
            SynthType::IQ4XSMix => "iq4_xs_mix",
        }
    }

    pub(super) fn check(self) -> Result<()> {
        match self {
            SynthType::All(t) if !SYNTH_TYPES.contains(&t) => Err(unknown_type(t.name())),
            _ => Ok(()),
        }
    }

    /// `general.file_type` (llama.cpp's `LLAMA_FTYPE_*`).
    pub(super) fn file_type(self) -> u32 {
        match self {
            SynthType::All(DType::F32) => 0,
            SynthType::All(DType::F16) => 1,
            SynthType::All(DType::Q4_0) => 2,
            SynthType::All(DType::Q4_1) => 3,
            SynthType::All(DType::Q8_0) => 7,
            // MOSTLY_Q4_K_S: every matrix Q4_K.
            SynthType::All(DType::Q4_K) => 14,
            SynthType::Q4KM => 15,
            SynthType::All(DType::IQ2_XXS) => 19,
            SynthType::All(DType::IQ2_XS) => 20,
            SynthType::All(DType::IQ3_XXS) => 23,
            SynthType::All(DType::IQ1_S) => 24,
            SynthType::All(DType::IQ4_NL) => 25,
            SynthType::All(DType::IQ3_S) => 26,
            SynthType::All(DType::IQ2_S) => 28,
            SynthType::All(DType::IQ4_XS) | SynthType::IQ4XSMix => 30,
            SynthType::All(DType::IQ1_M) => 31,
            SynthType::All(DType::TQ1_0) => 36,
            SynthType::All(DType::TQ2_0) => 37,
            SynthType::All(_) => 0,
        }
    }

    /// The type of the matrix `name`, of `role`, at `place`, whose rows are `ne0` values.
    pub(super) fn matrix_type(
        self,
        name: &str,
        role: Role,
        place: &Place,
        ne0: u64,
    ) -> Result<DType> {
        let Place {
            layer,
            n_layer,
            tied,
            big_attn_v,
            gqa,
        } = *place;
        let want = match self {
            SynthType::All(t) => t,
            SynthType::Q4KM => {
                // llama.cpp's rule for "more bits": the first and last eighth of the layers and
                // every third one between.
                let more = layer < n_layer / 8
                    || layer >= 7 * n_layer / 8
                    || (layer as i64 - (n_layer / 8) as i64).rem_euclid(3) == 2;
                match role {
                    Role::Output => DType::Q6_K,
                    Role::TokenEmbd if tied => DType::Q6_K,
                    Role::AttnV | Role::AttnQkv if more => DType::Q6_K,
                    Role::AttnV | Role::AttnQkv if big_attn_v => DType::Q5_K,
                    Role::FfnDown if more => DType::Q6_K,
                    _ => DType::Q4_K,
                }
            }
            SynthType::IQ4XSMix => match role {
                Role::Output => DType::Q6_K,
                Role::TokenEmbd if tied => DType::Q6_K,
                Role::AttnV | Role::AttnQkv if gqa >= 4 => DType::Q5_K,
                Role::FfnDown if layer < n_layer / 8 => DType::Q5_K,
                _ => DType::IQ4_XS,
            },
        };
        let fits = |t: DType| ne0.is_multiple_of(t.block_size() as u64);
        if fits(want) {
            return Ok(want);
        }
        // llama.cpp's fallbacks for rows that are not whole 256-value blocks; the output head
        // of such a model goes to Q8_0.
        let fallback = match want {
            DType::Q4_K => DType::Q5_0,
            DType::Q5_K => DType::Q5_1,
            DType::Q6_K => DType::Q8_0,
            DType::IQ1_S
            | DType::IQ1_M
            | DType::IQ2_XXS
            | DType::IQ2_XS
            | DType::IQ2_S
            | DType::IQ3_XXS
            | DType::IQ3_S
            | DType::IQ4_XS => DType::IQ4_NL,
            DType::TQ1_0 | DType::TQ2_0 => DType::Q4_0,
            _ => want,
        };
        if fits(fallback) {
            return Ok(fallback);
        }
        Err(Error::Invalid(format!(
            "tensor '{name}': rows of {ne0} values are not whole {want} blocks of {}",
            want.block_size()
        )))
    }
}

fn unknown_type(name: &str) -> Error {
    Error::Invalid(format!(
        "synthetic models are written in {}, not {name}",
        SynthType::NAMES.join(", ")
    ))
}

/// Where a matrix sits in its model, which a type mix looks at.
#[derive(Clone, Copy, Debug)]
pub(super) struct Place {
    /// Its layer (the output head: `n_layer`).
    pub layer: usize,
    /// The model's layers.
    pub n_layer: usize,
    /// Whether the token embedding is also the output head.
    pub tied: bool,
    /// llama.cpp's 70B rule: its `attn_v`, shared by 8 query heads, one step up.
    pub big_attn_v: bool,
    /// Query heads per KV head (llama.cpp's `n_gqa`).
    pub gqa: usize,
}

/// What a weight matrix does, which decides its type in a mix and its scale.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Role {
    TokenEmbd,
    Output,
    AttnQ,
    AttnK,
    AttnV,
    AttnQkv,
    AttnOut,
    FfnGate,
    FfnUp,
    FfnDown,
}

impl Role {
    /// The role of a tensor of this name (`blk.N.attn_v.weight` ...), if it is a matrix.
    pub(super) fn of(name: &str) -> Option<Role> {
        let base = name.strip_suffix(".weight")?;
        let base = match base.strip_prefix("blk.") {
            Some(rest) => rest.split_once('.')?.1,
            None => base,
        };
        Some(match base {
            "token_embd" => Role::TokenEmbd,
            "output" => Role::Output,
            "attn_q" => Role::AttnQ,
            "attn_k" => Role::AttnK,
            "attn_v" => Role::AttnV,
            "attn_qkv" => Role::AttnQkv,
            "attn_output" => Role::AttnOut,
            "ffn_gate" | "ffn_gate_exps" | "ffn_gate_shexp" => Role::FfnGate,
            "ffn_up" | "ffn_up_exps" | "ffn_up_shexp" => Role::FfnUp,
            "ffn_down" | "ffn_down_exps" | "ffn_down_shexp" => Role::FfnDown,
            _ => return None,
        })
    }

    /// The standard deviation of the matrix's values, times `1/sqrt(row length)`: every
    /// projection keeps its input's scale, and queries and keys are a little larger so that a
    /// random model's attention is peaked rather than a plain average.
    fn gain(self) -> f32 {
        match self {
            Role::AttnQ | Role::AttnK => 1.7,
            Role::AttnQkv => 1.5,
            _ => 1.0,
        }
    }
}

/// How the values of a generated model are drawn.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Weights {
    /// Matrices of standard deviation 0.02 and norms around 1: the Llama benchmark shapes
    /// (their files stay as they were).
    Flat,
    /// Scaled so that a random model is decisive: every projection keeps its input's scale,
    /// the final norm multiplies by [`LOGIT_SCALE`] so that the top logits stand apart, and
    /// Gemma's post-norms by [`BLOCK_SCALE`] so that the blocks, not the token embedding,
    /// steer the residual stream (else a tied output head repeats the last token).
    Scaled,
}

/// The output norm's mean weight in [`Weights::Scaled`] models: the logits' spread.
const LOGIT_SCALE: f32 = 24.0;

/// gpt-oss's query and key scale (matrices and biases) in [`Weights::Scaled`] models, against
/// the other models': softer attention, because YaRN's magnitude and the sinks make gpt-oss's
/// scores sharp enough that f16 rounding in llama.cpp's own attention paths moves its logits by
/// about 1 and flips near-tied experts while it decodes.
const GPT_OSS_QK_SCALE: f32 = 0.35;

/// gpt-oss's router in [`Weights::Scaled`] models: the spread of the logits from the token
/// (gain, as `gate_vector`'s) and of the router's bias. A bias larger than the token's part
/// keeps the 4th and 5th experts' logits apart, so that rounding noise in the token's hidden
/// state seldom swaps them, while the choice still depends on the token.
const GPT_OSS_ROUTER: (f32, f32) = (1.0, 2.0);

/// Gemma's post-attention and post-FFN norms' mean weight in [`Weights::Scaled`] models.
const BLOCK_SCALE: f32 = 8.0;

/// The metadata and tensor plans of a generated model of `shape`.
pub(super) fn layout(
    shape: &ArchShape,
    ty: SynthType,
    weights: Weights,
) -> Result<(Metadata, Vec<Plan>)> {
    ty.check()?;
    shape.check()?;
    let arch = shape.arch;
    let (d, ff, nv) = (shape.n_embd as u64, shape.n_ff as u64, shape.n_vocab as u64);
    let hd = shape.head_dim as u64;
    let (nq, nkv) = (hd * shape.n_head as u64, hd * shape.n_head_kv as u64);
    // llama.cpp counts a model of 80 layers with grouped KV heads as 70B.
    let big_attn_v = shape.n_layer == 80 && shape.n_head_kv != shape.n_head;

    // YaRN multiplies queries and keys by its magnitude 1 + 0.1 ln(factor): their matrices are
    // that much smaller, so that attention is as peaked as the other models'.
    let yarn_magnitude = match shape.rope_scaling {
        RopeScaling::Yarn { factor, .. } => 1.0 + 0.1 * factor.ln(),
        _ => 1.0,
    };
    let qk_scale = if arch == Arch::GptOss {
        GPT_OSS_QK_SCALE
    } else {
        1.0
    };
    let matrix_ne = |name: String, layer: usize, ne: Vec<u64>| -> Result<Plan> {
        let ne0 = ne[0];
        let role = Role::of(&name).expect("a matrix name");
        let place = Place {
            layer,
            n_layer: shape.n_layer,
            tied: shape.tied_output,
            big_attn_v,
            gqa: shape.n_head / shape.n_head_kv.max(1),
        };
        let dtype = ty.matrix_type(&name, role, &place, ne0)?;
        let gain = match role {
            Role::AttnQ | Role::AttnK => role.gain() * qk_scale / yarn_magnitude,
            _ => role.gain(),
        };
        let std = match weights {
            Weights::Flat => 0.02,
            Weights::Scaled => gain / (ne0 as f32).sqrt(),
        };
        Ok(Plan::random(name, dtype, ne, 0.0, std))
    };
    let matrix =
        |name: String, layer: usize, ne0: u64, ne1: u64| matrix_ne(name, layer, vec![ne0, ne1]);
    // The router's and the shared expert's gate vectors stay F32, as llama.cpp's quantizer
    // leaves them; the router's logits spread by about 2, so that a token's experts are
    // chosen by clear margins.
    let gate_vector = |name: String, ne: Vec<u64>, gain: f32| match weights {
        Weights::Flat => Plan::random(name, DType::F32, ne, 0.0, 0.02),
        Weights::Scaled => Plan::random(name, DType::F32, ne, 0.0, gain / (d as f32).sqrt()),
    };
    let norm = |name: String, n: u64, mean: f32| match weights {
        Weights::Flat => Plan::random(name, DType::F32, vec![n], 1.0, 0.02),
        // A spread of a quarter of the mean, so that each channel's weight matters.
        Weights::Scaled => Plan::random(name, DType::F32, vec![n], mean, 0.25 * mean),
    };
    // Query and key biases spread by 0.5 (gpt-oss's scaled as its queries and keys are), value
    // biases by 0.1 only: a value bias adds one vector to every attention output, and a large
    // one makes the model say the same token whatever came before.
    let bias = |name: String, n: u64, std: f32| Plan::random(name, DType::F32, vec![n], 0.0, std);

    let mut plans = vec![matrix("token_embd.weight".into(), 0, d, nv)?];
    match shape.rope_scaling {
        RopeScaling::Llama3 { .. } => plans.push(Plan::values(
            "rope_freqs.weight".into(),
            llama3_rope_factors(shape),
        )),
        RopeScaling::LongRope { .. } => {
            let (short, long) = longrope_factors(shape.head_dim / 2);
            plans.push(Plan::values("rope_factors_long.weight".into(), long));
            plans.push(Plan::values("rope_factors_short.weight".into(), short));
        }
        RopeScaling::None | RopeScaling::Linear(_) | RopeScaling::Yarn { .. } => {}
    }
    let gemma = matches!(arch, Arch::Gemma2 | Arch::Gemma3);
    let gpt_oss = arch == Arch::GptOss;
    // gpt-oss's experts are MXFP4 whatever the other matrices are, their down projection a
    // quarter of the usual scale (the clamped SwiGLU's (up + 1) factor makes its input larger).
    let expert = |name: String, layer: usize, ne: Vec<u64>, gain: f32| -> Result<Plan> {
        if !gpt_oss {
            return matrix_ne(name, layer, ne);
        }
        let std = match weights {
            Weights::Flat => 0.02,
            Weights::Scaled => gain / (ne[0] as f32).sqrt(),
        };
        Ok(Plan::random(name, DType::MXFP4, ne, 0.0, std))
    };
    for l in 0..shape.n_layer {
        let p = |s: &str| format!("blk.{l}.{s}.weight");
        plans.push(norm(p("attn_norm"), d, 1.0));
        if arch == Arch::Phi3 {
            plans.push(matrix(p("attn_qkv"), l, d, nq + 2 * nkv)?);
        } else {
            plans.push(matrix(p("attn_q"), l, d, nq)?);
            plans.push(matrix(p("attn_k"), l, d, nkv)?);
            plans.push(matrix(p("attn_v"), l, d, nkv)?);
        }
        if matches!(arch, Arch::Qwen2 | Arch::GptOss) {
            plans.push(bias(format!("blk.{l}.attn_q.bias"), nq, 0.5 * qk_scale));
            plans.push(bias(format!("blk.{l}.attn_k.bias"), nkv, 0.5 * qk_scale));
            plans.push(bias(format!("blk.{l}.attn_v.bias"), nkv, 0.1));
        }
        if arch == Arch::Olmoe {
            // OLMoE normalizes all the heads of Q (and of K) as one row.
            plans.push(norm(p("attn_q_norm"), nq, Role::AttnQ.gain()));
            plans.push(norm(p("attn_k_norm"), nkv, Role::AttnK.gain()));
        }
        if matches!(arch, Arch::Qwen3 | Arch::Gemma3 | Arch::Qwen3Moe) {
            // Normalized queries and keys of unit scale would give flat attention: the norm
            // weights make them as large as the other models' are.
            plans.push(norm(p("attn_q_norm"), hd, Role::AttnQ.gain()));
            plans.push(norm(p("attn_k_norm"), hd, Role::AttnK.gain()));
        }
        plans.push(matrix(p("attn_output"), l, nq, d)?);
        if gemma {
            plans.push(norm(p("post_attention_norm"), d, BLOCK_SCALE));
        }
        if gpt_oss {
            // A sink per query head of about the scores' size, the output's bias, and the
            // feed-forward's norm under gpt-oss's name.
            let b = |s: &str| format!("blk.{l}.{s}.bias");
            let heads = shape.n_head as u64;
            plans.push(Plan::random(
                p("attn_sinks"),
                DType::F32,
                vec![heads],
                0.0,
                1.0,
            ));
            plans.push(bias(b("attn_output"), d, 0.1));
            plans.push(norm(p("post_attention_norm"), d, 1.0));
        } else {
            plans.push(norm(p("ffn_norm"), d, 1.0));
        }
        let e = &shape.experts;
        if e.n_expert > 0 {
            let (ne, fe) = (e.n_expert as u64, e.n_ff_exp as u64);
            let router_gain = if gpt_oss { GPT_OSS_ROUTER.0 } else { 2.0 };
            plans.push(gate_vector(p("ffn_gate_inp"), vec![d, ne], router_gain));
            plans.push(expert(p("ffn_gate_exps"), l, vec![d, fe, ne], 1.0)?);
            plans.push(expert(p("ffn_down_exps"), l, vec![fe, d, ne], 0.25)?);
            plans.push(expert(p("ffn_up_exps"), l, vec![d, fe, ne], 1.0)?);
            if gpt_oss {
                // A bias row per expert; the gate and up biases spread by 2.5, so that the
                // clamped SwiGLU's limit of 7 cuts the values of some rows.
                let rows = |s: &str, n: u64, std: f32| {
                    Plan::random(
                        format!("blk.{l}.{s}.bias"),
                        DType::F32,
                        vec![n, ne],
                        0.0,
                        std,
                    )
                };
                plans.push(bias(
                    format!("blk.{l}.ffn_gate_inp.bias"),
                    ne,
                    GPT_OSS_ROUTER.1,
                ));
                plans.push(rows("ffn_gate_exps", fe, 2.5));
                plans.push(rows("ffn_down_exps", d, 0.1));
                plans.push(rows("ffn_up_exps", fe, 2.5));
            }
            if e.n_ff_shared > 0 {
                let fs = e.n_ff_shared as u64;
                plans.push(gate_vector(p("ffn_gate_inp_shexp"), vec![d], 1.0));
                plans.push(matrix(p("ffn_gate_shexp"), l, d, fs)?);
                plans.push(matrix(p("ffn_down_shexp"), l, fs, d)?);
                plans.push(matrix(p("ffn_up_shexp"), l, d, fs)?);
            }
        } else if arch == Arch::Phi3 {
            plans.push(matrix(p("ffn_up"), l, d, 2 * ff)?);
        } else {
            plans.push(matrix(p("ffn_gate"), l, d, ff)?);
            plans.push(matrix(p("ffn_up"), l, d, ff)?);
        }
        if e.n_expert == 0 {
            plans.push(matrix(p("ffn_down"), l, ff, d)?);
        }
        if gemma {
            plans.push(norm(p("post_ffw_norm"), d, BLOCK_SCALE));
        }
    }
    plans.push(norm("output_norm.weight".into(), d, LOGIT_SCALE));
    if !shape.tied_output {
        plans.push(matrix("output.weight".into(), shape.n_layer, d, nv)?);
    }
    Ok((metadata(shape, ty)?, plans))
}

/// The metadata of a generated model: the keys llama.cpp's converter writes for the
/// architecture, and the generated vocabulary.
fn metadata(shape: &ArchShape, ty: SynthType) -> Result<Metadata> {
    let arch = shape.arch;
    let a = arch.name();
    let u = |n: usize| GgufValue::U32(n as u32);
    let k = |key: &str| format!("{a}.{key}");
    let mut m: Metadata = vec![
        ("general.architecture".into(), a.into()),
        ("general.type".into(), "model".into()),
        (
            "general.name".into(),
            format!(
                "tessera synthetic {}, {} layers x {}",
                arch.display(),
                shape.n_layer,
                shape.n_embd
            )
            .into(),
        ),
        ("general.file_type".into(), ty.file_type().into()),
        ("general.quantization_version".into(), 2u32.into()),
        (k("block_count"), u(shape.n_layer)),
        (k("context_length"), u(shape.n_ctx_train)),
        (k("embedding_length"), u(shape.n_embd)),
        (k("feed_forward_length"), u(shape.n_ff)),
        (k("attention.head_count"), u(shape.n_head)),
        (k("attention.head_count_kv"), u(shape.n_head_kv)),
        (k("rope.freq_base"), shape.rope_base.into()),
        (k("attention.layer_norm_rms_epsilon"), shape.rms_eps.into()),
    ];
    // Head widths: Llama's converter writes them with the vocabulary size and rope width;
    // Qwen 3's and Gemma's from their configs' head_dim; Qwen 2's and Phi 3's heads are the
    // width over the heads, which llama.cpp takes when the keys are absent.
    match arch {
        Arch::Llama => {
            m.push((k("attention.key_length"), u(shape.head_dim)));
            m.push((k("attention.value_length"), u(shape.head_dim)));
            m.push((k("vocab_size"), u(shape.n_vocab)));
            m.push((k("rope.dimension_count"), u(shape.head_dim)));
        }
        Arch::Qwen3 | Arch::Gemma2 | Arch::Gemma3 | Arch::Qwen3Moe | Arch::GptOss => {
            m.push((k("attention.key_length"), u(shape.head_dim)));
            m.push((k("attention.value_length"), u(shape.head_dim)));
        }
        Arch::Phi3 => m.push((k("rope.dimension_count"), u(shape.head_dim))),
        Arch::Qwen2 | Arch::Qwen2Moe | Arch::Olmoe => {}
    }
    let e = &shape.experts;
    if e.n_expert > 0 {
        m.push((k("expert_count"), u(e.n_expert)));
        m.push((k("expert_used_count"), u(e.n_used)));
    }
    if matches!(arch, Arch::Qwen2Moe | Arch::Qwen3Moe | Arch::GptOss) {
        m.push((k("expert_feed_forward_length"), u(e.n_ff_exp)));
    }
    if e.n_ff_shared > 0 {
        m.push((k("expert_shared_feed_forward_length"), u(e.n_ff_shared)));
    }
    if shape.sliding_window > 0 {
        m.push((k("attention.sliding_window"), u(shape.sliding_window)));
    }
    if arch == Arch::Gemma2 {
        m.push((k("attn_logit_softcapping"), shape.attn_softcap.into()));
        m.push((k("final_logit_softcapping"), shape.final_softcap.into()));
    }
    match shape.rope_scaling {
        RopeScaling::Linear(f) => {
            m.push((k("rope.scaling.type"), "linear".into()));
            m.push((k("rope.scaling.factor"), f.into()));
        }
        RopeScaling::Yarn {
            factor,
            original_context,
        } => {
            m.push((k("rope.scaling.type"), "yarn".into()));
            m.push((k("rope.scaling.factor"), factor.into()));
            m.push((
                k("rope.scaling.original_context_length"),
                u(original_context),
            ));
        }
        RopeScaling::LongRope { original_context } => {
            m.push((
                k("rope.scaling.original_context_length"),
                u(original_context),
            ));
            m.push((
                k("rope.scaling.attn_factor"),
                longrope_attn_factor(shape.n_ctx_train, original_context).into(),
            ));
        }
        RopeScaling::None | RopeScaling::Llama3 { .. } => {}
    }

    let v = vocab::byte_level_bpe(shape.n_vocab)?;
    // Qwen's files split digits one by one and add no BOS; the others are Llama 3's.
    let qwen = matches!(
        arch,
        Arch::Qwen2 | Arch::Qwen3 | Arch::Qwen2Moe | Arch::Qwen3Moe
    );
    let pre = match arch {
        _ if qwen => "qwen2",
        Arch::GptOss => "gpt-4o",
        _ => "llama-bpe",
    };
    m.extend([
        ("tokenizer.ggml.model".into(), "gpt2".into()),
        ("tokenizer.ggml.pre".into(), pre.into()),
        ("tokenizer.ggml.tokens".into(), v.tokens.into()),
        ("tokenizer.ggml.token_type".into(), v.types.into()),
        ("tokenizer.ggml.merges".into(), v.merges.into()),
        ("tokenizer.ggml.bos_token_id".into(), v.bos.into()),
        ("tokenizer.ggml.eos_token_id".into(), v.eos.into()),
        (
            "tokenizer.ggml.add_bos_token".into(),
            (!qwen && arch != Arch::GptOss).into(),
        ),
        ("tokenizer.chat_template".into(), CHAT_TEMPLATE.into()),
    ]);
    Ok(m)
}

/// The chat template of the generated vocabulary: Llama 3's turn markers.
const CHAT_TEMPLATE: &str =
    "{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n\
    {{ m['content'] | trim }}<|eot_id|>{% endfor %}{% if add_generation_prompt %}\
    <|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}";

/// Llama 3.1's rope frequency divisors, one per pair of a head's dimensions, as Hugging Face's
/// converter computes them: 1 for wavelengths under `original / high`, `factor` over
/// `original / low`, and a smooth blend between.
fn llama3_rope_factors(shape: &ArchShape) -> Vec<f32> {
    let RopeScaling::Llama3 {
        factor,
        low_freq_factor: low,
        high_freq_factor: high,
        original_context,
    } = shape.rope_scaling
    else {
        unreachable!("only called for Llama 3 rope scaling")
    };
    let old = original_context as f32;
    let (low_wavelen, high_wavelen) = (old / low, old / high);
    let dim = shape.head_dim;
    (0..dim / 2)
        .map(|i| {
            let freq = 1.0 / shape.rope_base.powf((2 * i) as f32 / dim as f32);
            let wavelen = 2.0 * std::f32::consts::PI / freq;
            if wavelen < high_wavelen {
                1.0
            } else if wavelen > low_wavelen {
                factor
            } else {
                let smooth = (old / wavelen - low) / (high - low);
                1.0 / ((1.0 - smooth) / factor + smooth)
            }
        })
        .collect()
}

/// Phi 3's LongRoPE factors for `n` dimension pairs (short, long). Real files carry fitted
/// lists; these rise smoothly as theirs do, the short ones from 1 to 3 (so that they change
/// the middle frequencies, which a short prompt sees) and the long ones from 1 to 48.
fn longrope_factors(n: usize) -> (Vec<f32>, Vec<f32>) {
    let t = |i: usize| i as f32 / (n.max(2) - 1) as f32;
    let short = (0..n).map(|i| 1.0 + 2.0 * t(i)).collect();
    let long = (0..n).map(|i| 1.0 + 47.0 * t(i) * t(i)).collect();
    (short, long)
}

/// The attention factor Phi 3's converter writes: `sqrt(1 + ln(s) / ln(original))` for the
/// context scale `s`, 1 when the context is not extended.
fn longrope_attn_factor(n_ctx_train: usize, original: usize) -> f32 {
    let scale = n_ctx_train as f64 / original as f64;
    if scale <= 1.0 {
        return 1.0;
    }
    (1.0 + scale.ln() / (original as f64).ln()).sqrt() as f32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn llama31_rope_factors_match_the_converter() {
        // Llama 3.1 8B's 64 factors (base 500000, heads of 128): 1 for the 29 fastest pairs,
        // 8 for the 29 slowest, a blend of six between (the converter's 1.207 ... 5.257).
        let f = llama3_rope_factors(&ArchShape::LLAMA31_8B);
        assert_eq!(f.len(), 64);
        assert!(f[..29].iter().all(|&x| x == 1.0), "{f:?}");
        assert!(f[35..].iter().all(|&x| x == 8.0), "{f:?}");
        assert!(
            (f[29] - 1.207).abs() < 1e-3 && (f[34] - 5.257).abs() < 1e-3,
            "{f:?}"
        );
        assert!(f.windows(2).all(|w| w[0] <= w[1]));
    }

    #[test]
    fn q4_k_m_follows_llama_cpps_layers() {
        let ty = SynthType::Q4KM;
        let at = |layer, n_layer, tied| Place {
            layer,
            n_layer,
            tied,
            big_attn_v: false,
            gqa: 1,
        };
        let t = |role, layer| {
            ty.matrix_type("t", role, &at(layer, 36, false), 4096)
                .unwrap()
        };
        // Of 36 layers: 0-3 and 31-35, and 6, 9, ..., 30 take more bits.
        let more: Vec<usize> = (0..36)
            .filter(|&l| t(Role::FfnDown, l) == DType::Q6_K)
            .collect();
        let mut want: Vec<usize> = (0..4).chain(31..36).collect();
        want.extend((6..31).step_by(3));
        want.sort();
        assert_eq!(more, want);
        assert_eq!(t(Role::Output, 36), DType::Q6_K);
        assert_eq!(t(Role::TokenEmbd, 0), DType::Q4_K);
        assert_eq!(t(Role::AttnQ, 0), DType::Q4_K);
        assert_eq!(t(Role::AttnV, 0), DType::Q6_K);
        assert_eq!(t(Role::AttnV, 4), DType::Q4_K);
        // The Gemma 3 270M file's types: rows of 640 fall back.
        let g = |role, layer| {
            ty.matrix_type("t", role, &at(layer, 18, true), 640)
                .unwrap()
        };
        assert_eq!(g(Role::TokenEmbd, 0), DType::Q8_0);
        assert_eq!(g(Role::AttnQ, 0), DType::Q5_0);
        assert_eq!(g(Role::AttnV, 0), DType::Q8_0);
    }

    #[test]
    fn iq4_xs_mix_follows_llama_cpps_rule() {
        let ty = SynthType::IQ4XSMix;
        let at = |layer, tied, gqa| Place {
            layer,
            n_layer: 32,
            tied,
            big_attn_v: false,
            gqa,
        };
        let t = |role, layer, gqa, ne0| {
            ty.matrix_type("t", role, &at(layer, false, gqa), ne0)
                .unwrap()
        };
        // ffn_down: Q5_K in the first eighth of the layers only.
        let q5: Vec<usize> = (0..32)
            .filter(|&l| t(Role::FfnDown, l, 1, 4096) == DType::Q5_K)
            .collect();
        assert_eq!(q5, vec![0, 1, 2, 3]);
        assert_eq!(t(Role::Output, 32, 1, 4096), DType::Q6_K);
        assert_eq!(t(Role::TokenEmbd, 0, 1, 4096), DType::IQ4_XS);
        assert_eq!(t(Role::AttnQ, 0, 4, 4096), DType::IQ4_XS);
        assert_eq!(t(Role::AttnV, 9, 4, 4096), DType::Q5_K);
        assert_eq!(t(Role::AttnV, 9, 2, 4096), DType::IQ4_XS);
        // Rows of 640: IQ4_XS falls back to IQ4_NL, Q5_K to Q5_1, Q6_K to Q8_0.
        assert_eq!(t(Role::AttnQ, 9, 1, 640), DType::IQ4_NL);
        assert_eq!(t(Role::FfnDown, 0, 1, 640), DType::Q5_1);
        let tied = ty
            .matrix_type("t", Role::TokenEmbd, &at(0, true, 1), 640)
            .unwrap();
        assert_eq!(tied, DType::Q8_0);
    }

    #[test]
    fn longrope_attn_factor_is_the_converters() {
        let f = longrope_attn_factor(131_072, 4096);
        assert!((f - 1.190_238_4).abs() < 1e-6, "{f}");
        assert_eq!(longrope_attn_factor(4096, 4096), 1.0);
    }
}
