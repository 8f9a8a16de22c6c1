//! Hyper-parameters of a Llama-family model, read from GGUF metadata.

use tessera_core::gguf::GgufFile;
use tessera_core::{Error, Result, RopeMode};

/// The shape and constants of a Llama-family model.
#[derive(Clone, Debug, PartialEq)]
pub struct LlamaConfig {
    /// The architecture name from `general.architecture`.
    pub arch: String,
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
    /// Dimensions of each head that rope rotates.
    pub n_rot: usize,
    /// Rope frequency base.
    pub rope_base: f32,
    /// Rope linear frequency scale (1 / the file's scaling factor).
    pub rope_freq_scale: f32,
    /// How rope pairs dimensions (Normal for `llama` GGUF files).
    pub rope_mode: RopeMode,
    /// RMS-norm epsilon.
    pub rms_eps: f32,
    /// Context length the model was trained for.
    pub n_ctx_train: usize,
    /// Vocabulary size.
    pub n_vocab: usize,
}

/// Architectures this runner knows, with their rope pairing.
const ARCHES: &[(&str, RopeMode)] = &[
    ("llama", RopeMode::Normal),
    ("mistral", RopeMode::Normal),
    ("granite", RopeMode::Normal),
];

impl LlamaConfig {
    /// Reads the config from a GGUF file's metadata.
    pub fn from_gguf(f: &GgufFile) -> Result<Self> {
        let arch = f.get_str("general.architecture")?.to_string();
        let rope_mode = ARCHES
            .iter()
            .find(|(a, _)| *a == arch)
            .map(|(_, m)| *m)
            .ok_or_else(|| {
                Error::Model(format!(
                    "architecture '{arch}' is not supported (supported: llama, mistral, granite)"
                ))
            })?;
        let key = |k: &str| format!("{arch}.{k}");
        let u = |k: &str| -> Result<usize> { Ok(f.get_u64(&key(k))? as usize) };
        let n_embd = u("embedding_length")?;
        let n_head = u("attention.head_count")?;
        let n_head_kv = match f.get(&key("attention.head_count_kv")) {
            Some(_) => u("attention.head_count_kv")?,
            None => n_head,
        };
        if n_head == 0 || n_head_kv == 0 || n_embd % n_head != 0 || n_head % n_head_kv != 0 {
            return Err(Error::Model(format!(
                "heads do not divide: n_embd {n_embd}, n_head {n_head}, n_head_kv {n_head_kv}"
            )));
        }
        let head_dim = match f.get(&key("attention.key_length")) {
            Some(_) => u("attention.key_length")?,
            None => n_embd / n_head,
        };
        let n_rot = match f.get(&key("rope.dimension_count")) {
            Some(_) => u("rope.dimension_count")?,
            None => head_dim,
        };
        if n_rot > head_dim || n_rot % 2 != 0 {
            return Err(Error::Model(format!(
                "rope dimension {n_rot} does not fit head width {head_dim}"
            )));
        }
        let rope_base = f
            .get(&key("rope.freq_base"))
            .and_then(|v| v.as_f32())
            .unwrap_or(10000.0);
        let rope_freq_scale = match f.get(&key("rope.scaling.type")).and_then(|v| v.as_str()) {
            None | Some("none") => 1.0,
            Some("linear") => {
                let factor = f
                    .get(&key("rope.scaling.factor"))
                    .and_then(|v| v.as_f32())
                    .unwrap_or(1.0);
                if factor > 0.0 {
                    1.0 / factor
                } else {
                    1.0
                }
            }
            Some(other) => {
                return Err(Error::Model(format!(
                    "rope scaling '{other}' is not supported"
                )))
            }
        };
        let rms_eps = f.get_f32(&key("attention.layer_norm_rms_epsilon"))?;
        let n_vocab = match f.get(&key("vocab_size")) {
            Some(_) => u("vocab_size")?,
            None => f.get_str_array("tokenizer.ggml.tokens")?.len(),
        };
        Ok(LlamaConfig {
            n_embd,
            n_layer: u("block_count")?,
            n_ff: u("feed_forward_length")?,
            n_head,
            n_head_kv,
            head_dim,
            n_rot,
            rope_base,
            rope_freq_scale,
            rope_mode,
            rms_eps,
            n_ctx_train: u("context_length")?,
            n_vocab,
            arch,
        })
    }

    /// Width of the key (and value) rows of one token in the KV cache.
    pub fn n_embd_kv(&self) -> usize {
        self.head_dim * self.n_head_kv
    }
}
