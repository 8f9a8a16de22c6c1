//! Tensor parallelism for models on a meta device (`--device meta:cpu,cuda:0`).
//!
//! The split follows Megatron-LM's layout, which needs two all-reduces per layer and nothing
//! else:
//!
//! - **Column-parallel** Q, K, V, gate and up: each part holds a slice of the output rows
//!   (`ne[1]`), so each computes its own heads and its own slice of the feed-forward width.
//!   Q, K and V are cut by heads (below), so that a part's attention needs only its own heads.
//!   The KV cache is cut as K and V are.
//! - **Row-parallel** attention output and down: each part holds the input columns (`ne[0]`)
//!   matching its heads or feed-forward slice, so each part's product is a partial sum of the
//!   full result; the meta layer all-reduces it before the residual add.
//! - **Column-parallel** output head (`output.weight`, where the model has one): each part
//!   computes the logits of its slice of the vocabulary, and the meta layer joins the slices
//!   when it reads the logits back (no all-reduce). A head tied to the token embedding stays
//!   mirrored, since the embedding lookup reads whole rows of it.
//! - **Whole experts** of a mixture-of-experts feed-forward (`ffn_gate_exps`, `ffn_up_exps`,
//!   `ffn_down_exps`: split along the expert axis, by the ratios): each part computes the
//!   tokens routed to its own experts, and the layer's output is summed once (expert
//!   parallelism, see tessera-meta's `experts` module). The router and a shared expert are
//!   mirrored.
//! - **Mirrored** everything else: embeddings, norms. The residual stream is mirrored, so
//!   every part has the whole activation at the start of each block.
//!
//! The split ratios are rounded to whole units once per dimension, so that all tensors of a
//! dimension agree: heads (Q, K, V, attention output, KV cache) and feed-forward rows in units
//! of the largest quantization block of the down weights (so `ffn_down`'s column slices are
//! whole blocks). A part with ratio 0 holds empty slices.
//!
//! Heads are split one of two ways:
//!
//! - **By KV heads** (the default): each part holds whole KV heads with their GQA groups of
//!   query heads; K, V and the KV cache are split like Q.
//! - **By query heads, K and V mirrored**, when the KV heads are too few for every part that
//!   asks for work to get one (a model with one KV head over two devices): each part holds its
//!   query heads' rows of Q (and the matching columns of the attention output) and the whole K
//!   and V projections and KV cache. Each part's query heads must be whole GQA groups or lie
//!   within one group, so that its attention reads a contiguous run of KV heads with the
//!   model's grouping (or one KV head for all its query heads); a split that cannot be rounded
//!   so is an error that says which part to give ratio 0.

use std::sync::Arc;

use tessera::meta::{partition, partition_units, MetaDevice, ShardedTensor, SplitState};
use tessera_core::gguf::GgufFile;
use tessera_core::{Buffer, DType, Device, Error, Result};

use crate::config::ModelConfig;

/// How a model's weights and KV cache are split over the parts of a meta device.
#[derive(Clone)]
pub struct Sharding {
    meta: MetaDevice,
    /// Query heads of each part.
    q_heads: Vec<usize>,
    /// KV heads of each part when K and V are split with Q; `None` when they are mirrored.
    kv_heads: Option<Vec<usize>>,
    /// Width of one head.
    head_dim: usize,
    /// Feed-forward rows of each part.
    ffn: Vec<usize>,
    /// Vocabulary rows of the output head of each part.
    vocab: Vec<usize>,
    /// Experts of each part (a mixture of experts; empty otherwise).
    experts: Vec<usize>,
    /// Attention is computed whole on every part: its Q and K are normed over all heads at
    /// once (OLMoE), which no split by heads computes.
    attn_mirrored: bool,
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
        let group = cfg.n_head / cfg.n_head_kv;
        let kv_heads = partition(cfg.n_head_kv, ratios);
        let starved = |counts: &[usize]| {
            counts
                .iter()
                .zip(ratios)
                .position(|(&c, &r)| r > 0.0 && c == 0)
        };
        let heads = || -> Result<(Vec<usize>, Option<Vec<usize>>)> {
            if starved(&kv_heads).is_none() {
                return Ok((
                    kv_heads.iter().map(|h| h * group).collect(),
                    Some(kv_heads.clone()),
                ));
            }
            {
                let q_heads = partition(cfg.n_head, ratios);
                let refuse = |j: usize, why: String| {
                    let name = device.parts().get(j).map(|p| p.name()).unwrap_or_default();
                    Error::Model(format!(
                    "the model's {} KV heads ({} query heads, {group} per KV head) cannot be divided \
                     among the {} parts of {} by ratios {}: part {j} ({name}) {why} (give it ratio 0 \
                     or use fewer devices)",
                    cfg.n_head_kv,
                    cfg.n_head,
                    ratios.len(),
                    device.name(),
                    fmt_ratios(ratios)
                ))
                };
                if let Some(j) = starved(&q_heads) {
                    return Err(refuse(j, "would get no query head".into()));
                }
                let mut first = 0;
                for (j, &c) in q_heads.iter().enumerate() {
                    let last = first + c;
                    let whole = first.is_multiple_of(group) && c.is_multiple_of(group);
                    if c > 0 && !whole && first / group != (last - 1) / group {
                        return Err(refuse(
                            j,
                            format!(
                            "would get query heads {first}..{last}, which cut across the groups \
                             of two KV heads"
                        ),
                        ));
                    }
                    first = last;
                }
                Ok((q_heads, None))
            }
        };
        // A mixture of experts whose heads cannot be divided by the ratios (or whose Q/K norms
        // span every head, as OLMoE's) keeps its attention whole on every part and still
        // splits its experts.
        let (q_heads, kv_heads, attn_mirrored) = if cfg.block.qk_norm_whole {
            (partition(cfg.n_head, ratios), None, true)
        } else {
            match heads() {
                Ok((q, kv)) => (q, kv, false),
                Err(e) if cfg.moe.is_some() => {
                    log::info!("{e}: attention computed whole on every part");
                    (partition(cfg.n_head, ratios), None, true)
                }
                Err(e) => return Err(e),
            }
        };
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
        let experts = match &cfg.moe {
            Some(moe) => {
                let e = partition(moe.n_expert, ratios);
                log::info!("{}: experts {e:?} of {}", device.name(), moe.n_expert);
                e
            }
            None => Vec::new(),
        };
        match &kv_heads {
            Some(kv) => log::info!(
                "{}: KV heads {kv:?} (each with {group} query heads), feed-forward rows {ffn:?}, \
                 output head rows {vocab:?}",
                device.name()
            ),
            None => log::info!(
                "{}: query heads {q_heads:?} with all {} KV heads on every part, feed-forward rows \
                 {ffn:?}, output head rows {vocab:?}",
                device.name(),
                cfg.n_head_kv
            ),
        }
        Ok(Some(Sharding {
            meta: meta.clone(),
            q_heads,
            kv_heads,
            head_dim: cfg.head_dim,
            ffn,
            vocab,
            experts,
            attn_mirrored,
        }))
    }

    /// Query heads each part holds.
    pub fn q_heads(&self) -> &[usize] {
        &self.q_heads
    }

    /// KV heads each part holds when K, V and the KV cache are split by heads; `None` when
    /// every part holds all of them (the split by query heads).
    pub fn kv_heads(&self) -> Option<&[usize]> {
        self.kv_heads.as_deref()
    }

    /// Feed-forward rows each part holds.
    pub fn ffn_rows(&self) -> &[usize] {
        &self.ffn
    }

    /// Experts each part holds (empty for a model without a mixture of experts).
    pub fn experts(&self) -> &[usize] {
        &self.experts
    }

    fn q_rows(&self) -> Vec<usize> {
        self.q_heads.iter().map(|h| h * self.head_dim).collect()
    }

    /// The state of K and V rows: split by KV heads, or mirrored.
    fn kv_rows_state(&self, axis: usize) -> SplitState {
        if self.attn_mirrored {
            return SplitState::Mirrored;
        }
        match &self.kv_heads {
            Some(kv) => SplitState::split(axis, kv.iter().map(|h| h * self.head_dim).collect()),
            None => SplitState::Mirrored,
        }
    }

    /// The state of weight `name` of type `dtype` and shape `ne`.
    pub fn weight_state(&self, name: &str, dtype: DType, ne: [usize; 4]) -> Result<SplitState> {
        let kind = name
            .strip_prefix("blk.")
            .and_then(|r| r.split_once('.'))
            .map(|(_, k)| k)
            .unwrap_or("");
        let state = match kind {
            _ if self.attn_mirrored && kind.starts_with("attn_") => SplitState::Mirrored,
            "attn_q.weight" => SplitState::split(1, self.q_rows()),
            "attn_k.weight" | "attn_v.weight" => self.kv_rows_state(1),
            "attn_q.bias" => SplitState::split(0, self.q_rows()),
            "attn_k.bias" | "attn_v.bias" => self.kv_rows_state(0),
            "attn_output.weight" => SplitState::split(0, self.q_rows()),
            "ffn_gate.weight" | "ffn_up.weight" => SplitState::split(1, self.ffn.clone()),
            "ffn_down.weight" => SplitState::split(0, self.ffn.clone()),
            "ffn_gate_exps.weight" | "ffn_up_exps.weight" | "ffn_down_exps.weight"
                if !self.experts.is_empty() =>
            {
                SplitState::split(2, self.experts.clone())
            }
            _ if name == "output.weight" => SplitState::split(1, self.vocab.clone()),
            _ => SplitState::Mirrored,
        };
        state
            .check_fits(dtype, ne, self.q_heads.len())
            .map_err(|r| {
                Error::Model(format!(
                    "tensor '{name}' ({dtype} {ne:?}) cannot be split over {}: {r}",
                    self.meta_name()
                ))
            })?;
        Ok(state)
    }

    /// The state of each layer's K and V cache matrix ([n_embd_kv, cells]): split by KV heads,
    /// or mirrored when the heads are split by query heads.
    pub fn kv_state(&self) -> SplitState {
        self.kv_rows_state(0)
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
    /// `dtype` at the given (byte offset, cells), each in [`Sharding::kv_state`].
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
