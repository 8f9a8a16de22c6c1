//! A model's hyper-parameters and the features of its blocks, read from GGUF metadata.
//!
//! [`ModelConfig::from_gguf`] reads what every architecture shares (widths, heads, rope) and
//! hands the rest to the architecture's module in [`crate::arch`], which sets the features its
//! blocks use ([`Block`]) and which layers attend through a sliding window ([`LayerConfig`]).
//! The one block builder ([`crate::forward`]) computes exactly those features, so a file whose
//! metadata asks for something no module sets (a rope scaling, an architecture) is refused here
//! with an error that names it.

use tessera_core::gguf::GgufFile;
use tessera_core::{Error, GluOp, Result, RopeMode, RopeParams};

use crate::arch::{self, Arch};

/// Where rope's per-pair frequency factors come from.
#[derive(Clone, Debug, PartialEq)]
pub enum RopeFactors {
    /// No factors.
    None,
    /// One tensor for every layer (Llama 3's `rope_freqs.weight`).
    Tensor(String),
    /// LongRoPE (Phi 3): `rope_factors_short.weight` for contexts up to the original training
    /// context, `rope_factors_long.weight` beyond it.
    LongRope,
}

/// How positions are encoded, for the global layers (sliding-window layers may use another
/// base and scale: [`LayerConfig`]).
#[derive(Clone, Debug, PartialEq)]
pub struct RopeConfig {
    /// Pairing of the rotated dimensions.
    pub mode: RopeMode,
    /// Dimensions of each head that rope rotates.
    pub n_rot: usize,
    /// Frequency base.
    pub base: f32,
    /// Linear position scale (1 / the file's scaling factor; 1 when the scaling is `none`).
    pub freq_scale: f32,
    /// YaRN's blend (0: none; 1 for `yarn` scaling).
    pub ext_factor: f32,
    /// Factor on cos and sin (YaRN's and LongRoPE's magnitude correction).
    pub attn_factor: f32,
    /// YaRN's fast and slow rotation bounds.
    pub beta: [f32; 2],
    /// The training context before scaling (YaRN, LongRoPE's choice of factors).
    pub n_ctx_orig: usize,
    /// Per-pair frequency factors.
    pub factors: RopeFactors,
}

impl RopeConfig {
    /// The op parameters at `base` and `freq_scale` (a layer's own, see [`LayerConfig`]).
    pub fn params(&self, base: f32, freq_scale: f32) -> RopeParams {
        RopeParams {
            ext_factor: self.ext_factor,
            attn_factor: self.attn_factor,
            beta_fast: self.beta[0],
            beta_slow: self.beta[1],
            n_ctx_orig: self.n_ctx_orig,
            ..RopeParams::new(self.n_rot, self.mode, base, freq_scale)
        }
    }
}

/// What differs between the layers of one model.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LayerConfig {
    /// Attention sees only the last this many positions (itself included); None: all.
    pub window: Option<usize>,
    /// Rope frequency base of the layer.
    pub rope_base: f32,
    /// Rope linear scale of the layer.
    pub rope_freq_scale: f32,
}

/// The features of a transformer block and of the model's ends, as the architectures use them.
/// Defaults are Llama's.
#[derive(Clone, Debug, PartialEq)]
pub struct Block {
    /// Q, K and V come from one `attn_qkv` matrix (split into its row segments at load).
    pub fused_qkv: bool,
    /// Q, K and V have biases (`attn_q.bias` ...).
    pub qkv_bias: bool,
    /// Q and K are RMS-normed per head (`attn_q_norm`, `attn_k_norm`) before rope.
    pub qk_norm: bool,
    /// Q and K are RMS-normed over all their heads at once (OLMoE: `attn_q_norm` as wide as
    /// the queries), before rope.
    pub qk_norm_whole: bool,
    /// Factor on q k^T.
    pub attn_scale: f32,
    /// tanh soft-cap of the attention logits (0: none).
    pub attn_softcap: f32,
    /// RMS norms after attention and after the feed-forward (`post_attention_norm`,
    /// `post_ffw_norm`), before each joins the residual.
    pub post_norms: bool,
    /// The gated feed-forward's activation.
    pub ffn_act: GluOp,
    /// Gate and up come from one `ffn_up` matrix of twice the width (gate rows first).
    pub fused_gate_up: bool,
    /// Factor on the token embeddings (Gemma: sqrt(n_embd), Granite's embedding_scale).
    pub embd_scale: Option<f32>,
    /// Factor on each block's attention and feed-forward output before the residual add.
    pub residual_scale: Option<f32>,
    /// The logits are divided by this (Granite).
    pub logit_scale: Option<f32>,
    /// tanh soft-cap of the final logits (Gemma 2).
    pub final_softcap: Option<f32>,
    /// Each layer's attention has sinks (`attn_sinks`: a logit per query head that joins the
    /// soft-max; gpt-oss).
    pub attn_sinks: bool,
    /// The attention output has a bias (`attn_output.bias`).
    pub attn_out_bias: bool,
    /// The name of the RMS norm before the feed-forward (`blk.N.{name}.weight`): `ffn_norm`,
    /// gpt-oss's `post_attention_norm`.
    pub ffn_norm: &'static str,
}

impl Block {
    /// Llama's block for heads of width `head_dim`.
    pub fn llama(head_dim: usize) -> Block {
        Block {
            fused_qkv: false,
            qkv_bias: false,
            qk_norm: false,
            qk_norm_whole: false,
            attn_scale: 1.0 / (head_dim as f32).sqrt(),
            attn_softcap: 0.0,
            post_norms: false,
            ffn_act: GluOp::Swiglu,
            fused_gate_up: false,
            embd_scale: None,
            residual_scale: None,
            logit_scale: None,
            final_softcap: None,
            attn_sinks: false,
            attn_out_bias: false,
            ffn_norm: "ffn_norm",
        }
    }
}

/// A mixture-of-experts feed-forward (llama.cpp's `build_moe_ffn` with soft-max gating): the
/// router `ffn_gate_inp` scores every expert, the `n_used` most probable experts of each token
/// compute a gated FFN (`ffn_gate_exps`, `ffn_up_exps`, `ffn_down_exps`, one matrix per expert)
/// and their outputs are summed, each weighted by its probability.
#[derive(Clone, Debug, PartialEq)]
pub struct Moe {
    /// Experts per layer (`expert_count`).
    pub n_expert: usize,
    /// Experts each token uses (`expert_used_count`).
    pub n_used: usize,
    /// Feed-forward width of one expert.
    pub n_ff_exp: usize,
    /// The selected experts' probabilities are divided by their sum (Mixtral, Qwen 3 MoE),
    /// or used as the soft-max gave them (Qwen 2 MoE, OLMoE).
    pub norm_weights: bool,
    /// A shared expert every token uses (`ffn_gate_shexp`, `ffn_up_shexp`, `ffn_down_shexp`)
    /// of this width, its output scaled by sigmoid(`ffn_gate_inp_shexp` x) (Qwen 2 MoE).
    pub shared_ff: Option<usize>,
    /// How the router's logits become the selected experts and their weights.
    pub routing: Routing,
    /// The router and every expert projection have biases (`ffn_gate_inp.bias`,
    /// `ffn_gate_exps.bias` ...: one row per expert; gpt-oss).
    pub biases: bool,
    /// The experts' activation is the clamped SwiGLU with this alpha and limit (gpt-oss), not
    /// the block's GLU.
    pub swiglu_oai: Option<[f32; 2]>,
}

/// How a mixture of experts routes (llama.cpp's expert gating functions).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Routing {
    /// Soft-max over every expert's logit, the most probable `n_used` selected, each weighted
    /// by its probability.
    SoftMax,
    /// The `n_used` largest logits selected, their weights the soft-max over those alone
    /// (gpt-oss).
    TopKSoftMax,
}

/// The shape, constants and block features of a model.
#[derive(Clone, Debug, PartialEq)]
pub struct ModelConfig {
    /// The architecture.
    pub arch: Arch,
    /// Embedding width.
    pub n_embd: usize,
    /// Number of transformer blocks.
    pub n_layer: usize,
    /// Feed-forward width.
    pub n_ff: usize,
    /// Query heads.
    pub n_head: usize,
    /// Key/value heads (grouped-query attention when fewer than `n_head`).
    pub n_head_kv: usize,
    /// Width of one head.
    pub head_dim: usize,
    /// RMS-norm epsilon.
    pub rms_eps: f32,
    /// Context length the model was trained for.
    pub n_ctx_train: usize,
    /// Vocabulary size.
    pub n_vocab: usize,
    /// Rope of the global layers.
    pub rope: RopeConfig,
    /// Per-layer settings, `n_layer` of them.
    pub layers: Vec<LayerConfig>,
    /// Block features.
    pub block: Block,
    /// The mixture-of-experts feed-forward that replaces the dense one in every layer.
    pub moe: Option<Moe>,
}

/// The metadata of one file, read with the architecture's key prefix.
pub(crate) struct Meta<'a> {
    pub(crate) file: &'a GgufFile,
    prefix: &'a str,
}

impl<'a> Meta<'a> {
    fn key(&self, k: &str) -> String {
        format!("{}.{k}", self.prefix)
    }

    /// Whether `{arch}.k` is present.
    pub(crate) fn has(&self, k: &str) -> bool {
        self.file.get(&self.key(k)).is_some()
    }

    /// A required count.
    pub(crate) fn usize(&self, k: &str) -> Result<usize> {
        Ok(self.file.get_u64(&self.key(k))? as usize)
    }

    /// An optional count.
    pub(crate) fn usize_or(&self, k: &str, default: usize) -> Result<usize> {
        if self.has(k) {
            self.usize(k)
        } else {
            Ok(default)
        }
    }

    /// An optional real; present but not a number is an error naming the key.
    pub(crate) fn f32_opt(&self, k: &str) -> Result<Option<f32>> {
        match self.file.get(&self.key(k)) {
            None => Ok(None),
            Some(v) => v
                .as_f32()
                .map(Some)
                .ok_or_else(|| Error::Model(format!("metadata '{}' is not a number", self.key(k)))),
        }
    }

    /// An optional string.
    pub(crate) fn str_opt(&self, k: &str) -> Option<&'a str> {
        self.file.get(&self.key(k)).and_then(|v| v.as_str())
    }

    /// Whether the file holds tensor `name`.
    pub(crate) fn has_tensor(&self, name: &str) -> bool {
        self.file.tensors.iter().any(|t| t.name == name)
    }
}

impl ModelConfig {
    /// Reads the config from a GGUF file's metadata.
    pub fn from_gguf(f: &GgufFile) -> Result<Self> {
        let arch_name = f.get_str("general.architecture")?;
        let arch = Arch::from_name(arch_name)?;
        let m = Meta {
            file: f,
            prefix: arch_name,
        };
        let n_embd = m.usize("embedding_length")?;
        let n_head = m.usize("attention.head_count")?;
        let n_head_kv = m.usize_or("attention.head_count_kv", n_head)?;
        if n_head == 0 || n_head_kv == 0 || n_head % n_head_kv != 0 {
            return Err(Error::Model(format!(
                "heads do not divide: n_head {n_head}, n_head_kv {n_head_kv}"
            )));
        }
        let head_dim = match m.has("attention.key_length") {
            true => m.usize("attention.key_length")?,
            false if n_embd % n_head == 0 => n_embd / n_head,
            false => {
                return Err(Error::Model(format!(
                "{n_head} heads do not divide the width {n_embd} and the file gives no head width"
            )))
            }
        };
        if m.usize_or("attention.value_length", head_dim)? != head_dim {
            return Err(Error::Model(format!(
                "value heads of width {} differ from key heads of {head_dim}: not supported",
                m.usize("attention.value_length")?
            )));
        }
        let n_rot = m.usize_or("rope.dimension_count", head_dim)?;
        if n_rot > head_dim || n_rot % 2 != 0 {
            return Err(Error::Model(format!(
                "rope dimension {n_rot} does not fit head width {head_dim}"
            )));
        }
        let n_ctx_train = m.usize("context_length")?;
        let rope = read_rope(&m, arch.rope_mode(), n_rot, n_ctx_train)?;
        let n_layer = m.usize("block_count")?;
        let layer = LayerConfig {
            window: None,
            rope_base: rope.base,
            rope_freq_scale: rope.freq_scale,
        };
        let n_vocab = match m.has("vocab_size") {
            true => m.usize("vocab_size")?,
            false => f.get_str_array("tokenizer.ggml.tokens")?.len(),
        };
        let mut cfg = ModelConfig {
            arch,
            n_embd,
            n_layer,
            n_ff: m.usize("feed_forward_length")?,
            n_head,
            n_head_kv,
            head_dim,
            rms_eps: f.get_f32(&m.key("attention.layer_norm_rms_epsilon"))?,
            n_ctx_train,
            n_vocab,
            rope,
            layers: vec![layer; n_layer],
            block: Block::llama(head_dim),
            moe: None,
        };
        arch::configure(&m, &mut cfg)?;
        Ok(cfg)
    }

    /// Width of the key (and value) rows of one token in the KV cache.
    pub fn n_embd_kv(&self) -> usize {
        self.head_dim * self.n_head_kv
    }

    /// Width of the query rows of one token.
    pub fn n_embd_q(&self) -> usize {
        self.head_dim * self.n_head
    }

    /// The largest sliding window of any layer (None when every layer sees everything).
    pub fn max_window(&self) -> Option<usize> {
        self.layers.iter().filter_map(|l| l.window).max()
    }

    /// Whether some layers attend through a sliding window and some do not.
    pub fn has_window_layers(&self) -> bool {
        self.layers.iter().any(|l| l.window.is_some())
    }

    /// The fused weights the file holds and the row segments each is read as:
    /// (`blk.N.` suffix of the fused tensor, [(suffix of each segment, rows)]).
    pub fn fused_segments(&self) -> Vec<(&'static str, Vec<(&'static str, usize)>)> {
        let mut out = Vec::new();
        if self.block.fused_qkv {
            let kv = self.n_embd_kv();
            out.push((
                "attn_qkv.weight",
                vec![
                    ("attn_q.weight", self.n_embd_q()),
                    ("attn_k.weight", kv),
                    ("attn_v.weight", kv),
                ],
            ));
        }
        if self.block.fused_gate_up {
            out.push((
                "ffn_up.weight",
                vec![("ffn_gate.weight", self.n_ff), ("ffn_up.weight", self.n_ff)],
            ));
        }
        out
    }
}

/// The rope settings every architecture reads the same way. A scaling type other than none,
/// linear, yarn or longrope is refused: its positions would be wrong without a word.
fn read_rope(m: &Meta, mode: RopeMode, n_rot: usize, n_ctx_train: usize) -> Result<RopeConfig> {
    let base = m.f32_opt("rope.freq_base")?.unwrap_or(10000.0);
    let factor = match m.f32_opt("rope.scaling.factor")? {
        Some(f) => Some(f),
        None => m.f32_opt("rope.scale_linear")?,
    };
    let scale_from_factor = match factor {
        Some(f) if f > 0.0 => 1.0 / f,
        _ => 1.0,
    };
    let n_ctx_orig = m.usize_or("rope.scaling.original_context_length", n_ctx_train)?;
    let attn_factor_file = m.f32_opt("rope.scaling.attn_factor")?.unwrap_or(1.0);
    let mut rope = RopeConfig {
        mode,
        n_rot,
        base,
        freq_scale: scale_from_factor,
        ext_factor: 0.0,
        attn_factor: attn_factor_file,
        beta: [32.0, 1.0],
        n_ctx_orig,
        factors: RopeFactors::None,
    };
    // llama.cpp takes a missing scaling type as linear (with no factor: no scaling).
    match m.str_opt("rope.scaling.type").unwrap_or("linear") {
        "none" => rope.freq_scale = 1.0,
        "linear" => {}
        "yarn" => {
            if m.f32_opt("rope.scaling.yarn_log_multiplier")?
                .unwrap_or(0.0)
                != 0.0
            {
                return Err(Error::Model(
                    "rope scaling 'yarn' with a log multiplier (DeepSeek's mscale) is not supported"
                        .into(),
                ));
            }
            rope.ext_factor = 1.0;
            // The rope op multiplies in YaRN's magnitude 1 + 0.1 ln(factor) when the blend is
            // on; llama.cpp's attention factor is max(that, 1) divided by it, times the file's.
            let factor = 1.0 / rope.freq_scale;
            let mscale = if factor <= 1.0 {
                1.0
            } else {
                0.1 * factor.ln() + 1.0
            };
            rope.attn_factor = attn_factor_file * mscale / (1.0 + 0.1 * factor.ln());
        }
        "longrope" => {}
        other => {
            return Err(Error::Model(format!(
                "rope scaling '{other}' is not supported (supported: none, linear, yarn, longrope)"
            )))
        }
    }
    let long =
        m.has_tensor("rope_factors_long.weight") || m.has_tensor("rope_factors_short.weight");
    match (m.has_tensor("rope_freqs.weight"), long) {
        (true, true) => {
            return Err(Error::Model(
                "the file has both rope_freqs.weight and LongRoPE factors".into(),
            ))
        }
        (true, false) => rope.factors = RopeFactors::Tensor("rope_freqs.weight".into()),
        (false, true) => rope.factors = RopeFactors::LongRope,
        (false, false) if m.str_opt("rope.scaling.type") == Some("longrope") => {
            return Err(Error::Model(
                "rope scaling 'longrope' without rope_factors_long/short tensors".into(),
            ))
        }
        (false, false) => {}
    }
    Ok(rope)
}
