//! Tensor parallelism for models on a meta device (`--device meta:cpu,cuda:0`).
//!
//! The split follows Megatron-LM's layout, which needs two all-reduces per layer and nothing
//! else:
//!
//! - **Column-parallel** Q, K, V, gate and up: each part holds a slice of the output rows
//!   (`ne[1]`), so each computes its own heads and its own slice of the feed-forward width.
//!   Q, K and V are cut by KV heads, each KV head with its GQA group of query heads, so that a
//!   part's attention needs only its own heads. The KV cache is cut the same way.
//! - **Row-parallel** attention output and down: each part holds the input columns (`ne[0]`)
//!   matching its heads or feed-forward slice, so each part's product is a partial sum of the
//!   full result; the meta layer all-reduces it before the residual add.
//! - **Column-parallel** output head (`output.weight`, where the model has one): each part
//!   computes the logits of its slice of the vocabulary, and the meta layer joins the slices
//!   when it reads the logits back (no all-reduce). A head tied to the token embedding stays
//!   mirrored, since the embedding lookup reads whole rows of it.
//! - **Mirrored** everything else: embeddings, norms. The residual stream is mirrored, so
//!   every part has the whole activation at the start of each block.
//!
//! The split ratios are rounded to whole units once per dimension, so that all tensors of a
//! dimension agree: KV heads (Q, K, V, attention output, KV cache) and feed-forward rows in
//! units of the largest quantization block of the down weights (so `ffn_down`'s column slices
//! are whole blocks). A part whose ratio is positive but that would get no KV head is an error
//! (the model's heads cannot be divided as asked); a part with ratio 0 holds empty slices.

use std::sync::Arc;

use tessera::meta::{partition, partition_units, MetaDevice, ShardedTensor, SplitState};
use tessera_core::gguf::GgufFile;
use tessera_core::{Buffer, DType, Device, Error, Result};

use crate::config::ModelConfig;

/// How a Llama model's weights and KV cache are split over the parts of a meta device.
#[derive(Clone)]
pub struct Sharding {
    meta: MetaDevice,
    /// KV heads of each part.
    kv_heads: Vec<usize>,
    /// Query heads per KV head.
    group: usize,
    /// Width of one head.
    head_dim: usize,
    /// Feed-forward rows of each part.
    ffn: Vec<usize>,
    /// Vocabulary rows of the output head of each part.
    vocab: Vec<usize>,
}

impl Sharding {
    /// The split of model `cfg` (tensor types from `file`) over `device` when it is a meta
    /// device; `None` for a plain device.
    pub fn new(
        cfg: &ModelConfig,
        file: &GgufFile,
        device: &dyn Device,
    ) -> Result<Option<Sharding>> {
        let Some(meta) = MetaDevice::from_device(device) else {
            return Ok(None);
        };
        let ratios = meta.ratios();
        let kv_heads = partition(cfg.n_head_kv, ratios);
        let parts = device.parts();
        for (j, (&c, &r)) in kv_heads.iter().zip(ratios).enumerate() {
            if r > 0.0 && c == 0 {
                let name = parts.get(j).map(|p| p.name()).unwrap_or_default();
                return Err(Error::Model(format!(
                    "the model's {} KV heads cannot be divided among the {} parts of {} by ratios {}: part {j} ({name}) \
                     would get none (give it ratio 0 or use fewer devices)",
                    cfg.n_head_kv,
                    ratios.len(),
                    device.name(),
                    fmt_ratios(ratios)
                )));
            }
        }
        let unit = file
            .tensors
            .iter()
            .filter(|t| t.name.ends_with(".ffn_down.weight"))
            .map(|t| t.dtype.block_size())
            .max()
            .unwrap_or(1);
        let ffn = partition_units(cfg.n_ff, unit, ratios, "feed-forward width")
            .map_err(|e| Error::Model(e.to_string()))?;
        let vocab = partition(cfg.n_vocab, ratios);
        let group = cfg.n_head / cfg.n_head_kv;
        log::info!(
            "{}: KV heads {:?} (each with {group} query heads), feed-forward rows {:?}, output head rows {:?}",
            device.name(),
            kv_heads,
            ffn,
            vocab
        );
        Ok(Some(Sharding {
            meta: meta.clone(),
            kv_heads,
            group,
            head_dim: cfg.head_dim,
            ffn,
            vocab,
        }))
    }

    /// KV heads each part holds.
    pub fn kv_heads(&self) -> &[usize] {
        &self.kv_heads
    }

    /// Feed-forward rows each part holds.
    pub fn ffn_rows(&self) -> &[usize] {
        &self.ffn
    }

    fn q_rows(&self) -> Vec<usize> {
        self.kv_heads
            .iter()
            .map(|h| h * self.group * self.head_dim)
            .collect()
    }

    fn kv_rows(&self) -> Vec<usize> {
        self.kv_heads.iter().map(|h| h * self.head_dim).collect()
    }

    /// The state of weight `name` of type `dtype` and shape `ne`.
    pub fn weight_state(&self, name: &str, dtype: DType, ne: [usize; 4]) -> Result<SplitState> {
        let kind = name
            .strip_prefix("blk.")
            .and_then(|r| r.split_once('.'))
            .map(|(_, k)| k)
            .unwrap_or("");
        let state = match kind {
            "attn_q.weight" => SplitState::split(1, self.q_rows()),
            "attn_k.weight" | "attn_v.weight" => SplitState::split(1, self.kv_rows()),
            "attn_q.bias" => SplitState::split(0, self.q_rows()),
            "attn_k.bias" | "attn_v.bias" => SplitState::split(0, self.kv_rows()),
            "attn_output.weight" => SplitState::split(0, self.q_rows()),
            "ffn_gate.weight" | "ffn_up.weight" => SplitState::split(1, self.ffn.clone()),
            "ffn_down.weight" => SplitState::split(0, self.ffn.clone()),
            _ if name == "output.weight" => SplitState::split(1, self.vocab.clone()),
            _ => SplitState::Mirrored,
        };
        state
            .check_fits(dtype, ne, self.kv_heads.len())
            .map_err(|r| {
                Error::Model(format!(
                    "tensor '{name}' ({dtype} {ne:?}) cannot be split over {}: {r}",
                    self.meta_name()
                ))
            })?;
        Ok(state)
    }

    /// The state of each layer's K and V cache matrix ([n_embd_kv, n_ctx]): split by KV heads.
    pub fn kv_state(&self) -> SplitState {
        SplitState::split(0, self.kv_rows())
    }

    fn meta_name(&self) -> String {
        self.meta.name()
    }

    /// A sharded buffer of virtual size `size` for weights `(name, type, shape, offset)`.
    pub fn alloc_weights(
        &self,
        size: usize,
        tensors: &[(&str, DType, [usize; 4], usize)],
    ) -> Result<Arc<dyn Buffer>> {
        let specs = tensors
            .iter()
            .map(|&(name, dtype, ne, offset)| {
                Ok(ShardedTensor {
                    offset,
                    dtype,
                    ne,
                    state: self.weight_state(name, dtype, ne)?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        self.meta.alloc_sharded(size, &specs)
    }

    /// A sharded KV cache of virtual size `size`: K and V matrices of `[n_embd_kv, cells]`
    /// `dtype` at the given (byte offset, cells), each split by KV heads.
    pub fn alloc_kv(
        &self,
        cfg: &ModelConfig,
        matrices: &[(usize, usize)],
        dtype: DType,
        size: usize,
    ) -> Result<Arc<dyn Buffer>> {
        let n_embd_kv = cfg.n_embd_kv();
        let specs: Vec<ShardedTensor> = matrices
            .iter()
            .map(|&(offset, cells)| ShardedTensor {
                offset,
                dtype,
                ne: [n_embd_kv, cells, 1, 1],
                state: self.kv_state(),
            })
            .collect();
        self.meta.alloc_sharded(size, &specs)
    }
}

fn fmt_ratios(r: &[f64]) -> String {
    r.iter()
        .map(|x| format!("{x:.2}"))
        .collect::<Vec<_>>()
        .join(",")
}
