//! How a model is divided over the parts of a meta device (`--device meta:cpu,cuda:0`): as
//! tensor parallelism ([`Sharding`], below) or by layers ([`LayerSplit`], at the end), as the
//! meta device's [`SplitMode`](tessera::meta::SplitMode) says.
//!
//! # Tensor parallelism
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

use tessera::meta::{
    partition, partition_units, plan_layers, LayerCosts, LayerPart, LayerPlan, LayerShares,
    MetaDevice, ShardedTensor, SplitState,
};
use tessera_core::gguf::GgufFile;
use tessera_core::{Buffer, DType, Device, DeviceKind, Error, Graph, Result};

use crate::config::ModelConfig;
use crate::context::{ContextParams, KV_PAD};
use crate::kv_cache::KvCache;

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
        let mut ratios = meta.ratios().to_vec();
        loop {
            match Sharding::with_ratios(cfg, file, device, meta, &ratios) {
                Ok(s) => return Ok(Some(s)),
                // Measured ratios always give a split that runs: the part with the least share
                // gets no work, and the others are tried again.
                Err(e)
                    if !meta.ratios_given() && ratios.iter().filter(|&&r| r > 0.0).count() > 1 =>
                {
                    let j = (0..ratios.len())
                        .filter(|&j| ratios[j] > 0.0)
                        .min_by(|&a, &b| ratios[a].total_cmp(&ratios[b]).then(b.cmp(&a)))
                        .expect("two parts with work");
                    let name = device.parts().get(j).map(|p| p.name()).unwrap_or_default();
                    log::info!(
                        "{}: part {j} ({name}) gets no work: with its measured share {:.3} the \
                         split fails ({e})",
                        device.name(),
                        ratios[j]
                    );
                    ratios[j] = 0.0;
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// The split of model `cfg` over meta device `meta` (`device`) by `ratios`.
    fn with_ratios(
        cfg: &ModelConfig,
        file: &GgufFile,
        device: &dyn Device,
        meta: &MetaDevice,
        ratios: &[f64],
    ) -> Result<Sharding> {
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
        Ok(Sharding {
            meta: meta.clone(),
            q_heads,
            kv_heads,
            head_dim: cfg.head_dim,
            ffn,
            vocab,
            experts,
            attn_mirrored,
        })
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
            "attn_sinks.weight" => SplitState::split(0, self.q_heads.clone()),
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

/// A model divided by layers: each part holds a contiguous range of whole layers with their KV
/// cache (see [`tessera::meta::plan_layers`] for who gets how many, and where the output head
/// goes), and core's scheduler runs each layer's nodes on its part, the activations crossing
/// once per boundary. A part that is itself a meta device (a group in brackets) holds its
/// layers tensor-parallel, split as [`Sharding`] says.
///
/// Each weight goes where its layer is; the output norm and head on the head's part; the token
/// embedding with the first layer, or with the head when the head is tied to it; the few
/// tensors every layer reads (rope factors) with the first layer, copied to the others by the
/// scheduler.
#[derive(Clone)]
pub struct LayerSplit {
    name: String,
    parts: Vec<Arc<dyn Device>>,
    /// The tensor-parallel split of each part that is a meta device.
    shards: Vec<Option<Sharding>>,
    plan: LayerPlan,
    /// Whether the output head is the token embedding.
    tied: bool,
    /// The smallest step whose CPU layers' mat-muls run on a GPU part (0: never).
    op_offload: usize,
    /// Bytes reserved on each part that is not a CPU for the weights op offload uploads (0
    /// without a CPU part or with op offload off).
    offload_scratch: usize,
}

impl LayerSplit {
    /// Plans model `cfg` (tensor sizes from `file`) over `parts` of the device named `name`, as
    /// `shares` say, with room for a context of `ctx`'s size, batch and cache type (and their
    /// compute buffers) on each part. `speeds` are the parts' mat-vec throughputs.
    /// `op_offload` (see [`crate::LoadParams::op_offload`]; 0: off) reserves, on the parts that
    /// are not a CPU, room for the weights a step uploads there when a CPU part is present.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        cfg: &ModelConfig,
        file: &GgufFile,
        name: &str,
        parts: Vec<Arc<dyn Device>>,
        speeds: &[f64],
        shares: &LayerShares,
        ctx: &ContextParams,
        op_offload: usize,
    ) -> Result<LayerSplit> {
        let tied = !file.tensors.iter().any(|t| t.name == "output.weight");
        let mut weights = vec![0usize; cfg.n_layer];
        let (mut head, mut input) = (0usize, 0usize);
        for t in &file.tensors {
            let size = t.size as usize;
            match layer_of(&t.name) {
                Some(l) if l < cfg.n_layer => weights[l] += size,
                Some(l) => {
                    return Err(Error::Model(format!(
                        "tensor '{}' belongs to layer {l}, past the model's {}",
                        t.name, cfg.n_layer
                    )))
                }
                None if is_head(&t.name, tied) => head += size,
                None => input += size,
            }
        }
        let n_ctx = planned_ctx(cfg, ctx);
        let cache = KvCache::layer_bytes(
            cfg,
            n_ctx.div_ceil(KV_PAD) * KV_PAD,
            ctx.n_ubatch,
            KV_PAD,
            ctx.kv_type,
        );
        // Compute memory: a batch's widest activations, a few at a time (f32), and a row of
        // logits on the head's part.
        let widths = 4 * cfg.n_embd + 3 * cfg.n_ff.max(cfg.n_embd_q());
        let compute = 4 * ctx.n_ubatch.max(1) * widths;
        head += 4 * cfg.n_vocab * 2;
        // Op offload uploads at most one layer's weights a step split at a time, into two
        // regions that each hold one step split's (a layer's Q, K and V, or its gate and up):
        // a layer's weights bound both.
        let cpu_part = parts.iter().any(|p| p.kind() == DeviceKind::Cpu);
        let scratch = if op_offload > 0 && cpu_part {
            weights.iter().copied().max().unwrap_or(0)
        } else {
            0
        };
        let layer_parts: Vec<LayerPart> = parts
            .iter()
            .zip(speeds)
            .map(|(p, &speed)| {
                let cpu = p.kind() == DeviceKind::Cpu;
                let keep = compute + if cpu { 0 } else { scratch };
                LayerPart {
                    name: p.name(),
                    budget: p.memory().free.saturating_sub(keep),
                    speed,
                    cpu,
                }
            })
            .collect();
        let costs = LayerCosts {
            weights,
            cache,
            head,
            input,
        };
        let plan = plan_layers(name, &layer_parts, &costs, shares)?;
        let shards = parts
            .iter()
            .map(|p| Sharding::new(cfg, file, p.as_ref()))
            .collect::<Result<Vec<_>>>()?;
        for (j, p) in parts.iter().enumerate() {
            let (a, b) = plan.range(j);
            let layers = if b > a {
                format!("layers {a}..{b}")
            } else {
                "no layers".into()
            };
            log::info!(
                "{name}: part {j} ({}) {layers}{}, {} MiB, {:.0}% of a token's time",
                p.name(),
                if j == plan.head_part {
                    " and the output head"
                } else {
                    ""
                },
                plan.bytes[j] >> 20,
                plan.time[j] * 100.0
            );
        }
        Ok(LayerSplit {
            name: name.to_string(),
            parts,
            shards,
            plan,
            tied,
            op_offload,
            offload_scratch: scratch,
        })
    }

    /// The smallest step (in tokens) whose CPU layers' mat-muls run on a GPU part; 0: op
    /// offload is off.
    pub fn op_offload(&self) -> usize {
        self.op_offload
    }

    /// Bytes reserved on each part that is not a CPU for the weights op offload uploads (one
    /// layer's; 0 when nothing is offloaded).
    pub fn offload_scratch(&self) -> usize {
        self.offload_scratch
    }

    /// The parts, in the order the plan's indices refer to.
    pub fn parts(&self) -> &[Arc<dyn Device>] {
        &self.parts
    }

    /// The plan: each layer's part, the head's part, bytes and time shares.
    pub fn plan(&self) -> &LayerPlan {
        &self.plan
    }

    /// The name of the whole (the meta device's, or the device and the CPU it offloads to).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The part holding layer `l` (the head's part past the last layer).
    pub fn layer_part(&self, l: usize) -> usize {
        self.plan
            .layer_part
            .get(l)
            .copied()
            .unwrap_or(self.plan.head_part)
    }

    /// The part holding weight `name`.
    pub fn part_of_weight(&self, name: &str) -> usize {
        match layer_of(name) {
            Some(l) => self.layer_part(l),
            None if is_head(name, self.tied) => self.plan.head_part,
            None => self.layer_part(0),
        }
    }

    /// The tensor-parallel split of part `j`, where it is a meta device.
    pub fn sharding(&self, j: usize) -> Option<&Sharding> {
        self.shards.get(j).and_then(Option::as_ref)
    }

    /// The scheduler's preferred device (a part index) for each tensor of a step's graph: the
    /// nodes of layer l (from the end of layer l-1's output, `l_out-{l-1}`, to its own) on its
    /// part, the nodes after the last layer on the head's part.
    pub fn hints(&self, graph: &Graph) -> Vec<Option<usize>> {
        let n_layer = self.plan.layer_part.len();
        let mut out = Vec::with_capacity(graph.len());
        let mut layer = 0;
        let mut end = format!("l_out-{layer}");
        for id in graph.ids() {
            out.push(Some(self.layer_part(layer)));
            if layer < n_layer && graph.get(id).name == end {
                layer += 1;
                end = format!("l_out-{layer}");
            }
        }
        out
    }

    /// A KV cache buffer on part `j` of virtual size `size` holding K and V matrices at the
    /// given (byte offset, cells).
    pub fn alloc_kv(
        &self,
        j: usize,
        cfg: &ModelConfig,
        matrices: &[(usize, usize)],
        dtype: DType,
        size: usize,
    ) -> Result<Arc<dyn Buffer>> {
        match self.sharding(j) {
            Some(sh) => sh.alloc_kv(cfg, matrices, dtype, size),
            None => self.parts[j].buffer_type().alloc(size.max(1)),
        }
    }
}

/// The positions a context of `ctx` holds for `cfg` (0: the smaller of the training context
/// and 4096, as [`crate::Context::new`] chooses).
pub fn planned_ctx(cfg: &ModelConfig, ctx: &ContextParams) -> usize {
    if ctx.n_ctx == 0 {
        cfg.n_ctx_train.min(4096)
    } else {
        ctx.n_ctx
    }
}

/// The layer of a tensor `blk.N.*`.
fn layer_of(name: &str) -> Option<usize> {
    name.strip_prefix("blk.")?.split_once('.')?.0.parse().ok()
}

/// Whether a tensor goes with the output head (the token embedding does when the head is tied
/// to it).
fn is_head(name: &str, tied: bool) -> bool {
    matches!(name, "output.weight" | "output_norm.weight") || (tied && name == "token_embd.weight")
}
