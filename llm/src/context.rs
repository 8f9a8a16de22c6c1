//! An evaluation context: a KV cache, a scheduler over the model's device (with the CPU as
//! fallback), and the last step's graph, replayed while the step shape stays the same.

use std::sync::Arc;

use half::f16;
use tessera_core::{DType, Device, Error, Graph, Result, SchedPlan, Scheduler};

use crate::forward::{self, StepIo, StepShape, StepSource};
use crate::kv_cache::KvCache;
use crate::model::Model;

/// KV cells are attended in multiples of this, so a decode graph serves many steps.
pub const KV_PAD: usize = 256;

/// Settings of a context.
#[derive(Clone, Debug)]
pub struct ContextParams {
    /// Positions the context holds (0: the smaller of the model's training context and 4096).
    /// The KV cache is allocated for this rounded up to a multiple of [`KV_PAD`].
    pub n_ctx: usize,
    /// Most tokens evaluated in one graph (prompt processing is cut into batches of this).
    pub n_ubatch: usize,
    /// KV cache element type (F16 as llama.cpp, or F32).
    pub kv_type: DType,
}

impl Default for ContextParams {
    fn default() -> Self {
        ContextParams {
            n_ctx: 0,
            n_ubatch: 512,
            kv_type: DType::F16,
        }
    }
}

struct Step {
    shape: StepShape,
    graph: Graph,
    plan: SchedPlan,
    io: StepIo,
}

/// Evaluates tokens of one sequence against a model, keeping its KV cache.
pub struct Context {
    model: Arc<Model>,
    sched: Scheduler,
    kv: KvCache,
    /// Positions the context holds (the cache may hold a few more: whole KV_PAD blocks).
    n_ctx: usize,
    n_ubatch: usize,
    n_past: usize,
    steps: Vec<Step>,
}

impl Context {
    /// A context for `model` on the model's device (the CPU runs what the device cannot).
    pub fn new(model: Arc<Model>, params: ContextParams) -> Result<Self> {
        let cfg = &model.config;
        let n_ctx = if params.n_ctx == 0 {
            cfg.n_ctx_train.min(4096)
        } else {
            params.n_ctx
        };
        if params.n_ubatch == 0 {
            return Err(Error::Invalid("the batch size must be at least 1".into()));
        }
        let device = model.device().clone();
        // The cache holds whole KV_PAD blocks (as llama.cpp pads its context): every step's mask
        // rows are then whole words, which a device writes without a read-modify-write.
        let cells = n_ctx.div_ceil(KV_PAD) * KV_PAD;
        let (kv, devices) = match model.layer_split() {
            Some(split) => {
                let kv =
                    KvCache::new_split(cfg, split, cells, params.n_ubatch, KV_PAD, params.kv_type)?;
                let mut devices = split.parts().to_vec();
                if !devices
                    .iter()
                    .any(|d| d.kind() == tessera_core::DeviceKind::Cpu)
                {
                    devices.push(model.fallback().clone());
                }
                (kv, devices)
            }
            None => {
                let kv = KvCache::new(
                    cfg,
                    device.as_ref(),
                    cells,
                    params.n_ubatch,
                    KV_PAD,
                    params.kv_type,
                    model.sharding(),
                )?;
                let mut devices: Vec<Arc<dyn Device>> = vec![device.clone()];
                if device.kind() != tessera_core::DeviceKind::Cpu {
                    devices.push(model.fallback().clone());
                }
                (kv, devices)
            }
        };
        let mut sched = Scheduler::new(devices)?;
        if let Some(split) = model.layer_split() {
            sched.set_op_offload(split.op_offload());
        }
        Ok(Context {
            model,
            sched,
            kv,
            n_ctx,
            n_ubatch: params.n_ubatch,
            n_past: 0,
            steps: Vec::new(),
        })
    }

    /// What op offload (a layer split's CPU layers' mat-muls run on a GPU part for a large
    /// step) has moved so far: mat-muls run and weight bytes uploaded.
    pub fn offload_stats(&self) -> tessera_core::OffloadStats {
        self.sched.offload_stats()
    }

    /// Positions already in the cache.
    pub fn n_past(&self) -> usize {
        self.n_past
    }

    /// Positions the context holds.
    pub fn n_ctx(&self) -> usize {
        self.n_ctx
    }

    /// Forgets the sequence (the cache's contents are overwritten as new tokens come).
    pub fn clear(&mut self) {
        self.n_past = 0;
    }

    /// Keeps only the first `n` positions of the sequence (no-op when fewer are cached).
    pub fn truncate(&mut self, n: usize) {
        self.n_past = self.n_past.min(n);
    }

    /// The model.
    pub fn model(&self) -> &Arc<Model> {
        &self.model
    }

    /// Evaluates `tokens` after those already in the cache. Returns the logits of the last token
    /// (`n_vocab` values), or of every token (`n_vocab` per token, in order) when `all_logits`.
    pub fn eval(&mut self, tokens: &[u32], all_logits: bool) -> Result<Vec<f32>> {
        if tokens.is_empty() {
            return Err(Error::Invalid(
                "nothing to evaluate: the token list is empty".into(),
            ));
        }
        let n_vocab = self.model.config.n_vocab;
        if let Some(&bad) = tokens.iter().find(|&&t| t as usize >= n_vocab) {
            return Err(Error::Invalid(format!(
                "token id {bad} is past the vocabulary of {n_vocab}"
            )));
        }
        if self.n_past + tokens.len() > self.n_ctx {
            return Err(Error::Invalid(format!(
                "{} tokens after {} do not fit the context of {} positions",
                tokens.len(),
                self.n_past,
                self.n_ctx
            )));
        }
        let mut out = Vec::new();
        let chunks: Vec<&[u32]> = tokens.chunks(self.n_ubatch).collect();
        let last = chunks.len() - 1;
        for (i, chunk) in chunks.into_iter().enumerate() {
            let want = all_logits || i == last;
            let logits = self.eval_batch(chunk, all_logits, want)?;
            out.extend_from_slice(&logits);
        }
        Ok(out)
    }

    /// Evaluates one batch; with `want` false its logits are not read and its work is left
    /// queued (see [`Scheduler::compute_queued`]): the next batch's first layers then run
    /// while a device still computes this one's last, and the batch whose logits are read
    /// waits for all of it.
    fn eval_batch(&mut self, tokens: &[u32], all_logits: bool, want: bool) -> Result<Vec<f32>> {
        let n = tokens.len();
        let p0 = self.n_past;
        let padded = (p0 + n).div_ceil(KV_PAD) * KV_PAD;
        let ring = self.kv.window_cells();
        let shape = StepShape {
            n_tokens: n,
            n_kv: padded.min(self.kv.n_ctx()),
            n_kv_window: ring.map_or(0, |r| padded.min(r)),
            all_logits: all_logits && n > 1,
            n_groups: 1,
        };
        let idx = match self.steps.iter().position(|s| s.shape == shape) {
            Some(i) => i,
            None => {
                let src = StepSource {
                    cfg: &self.model.config,
                    weights: &self.model.weights,
                    kv: &self.kv,
                    n_ctx: self.n_ctx,
                };
                let (mut graph, io, _) = forward::build(&src, shape)?;
                // Planning may place the new graph in memory that queued work still uses.
                self.sched.synchronize()?;
                let plan = match self.model.layer_split() {
                    Some(split) => {
                        let hints = split.hints(&graph);
                        self.sched.plan_hinted(&mut graph, &hints)?
                    }
                    None => self.sched.plan(&mut graph)?,
                };
                tessera::meta::check_plan(self.sched.devices(), &graph, &plan)?;
                log::debug!(
                    "new step graph {:?}: {} tensors, {} splits",
                    shape,
                    graph.len(),
                    plan.splits.len()
                );
                // Keep the prompt graph and the decode graph; drop older shapes.
                if self.steps.len() >= 2 {
                    self.steps.remove(0);
                }
                self.steps.push(Step {
                    shape,
                    graph,
                    plan,
                    io,
                });
                self.steps.len() - 1
            }
        };
        let started = std::time::Instant::now();
        {
            let step = &self.steps[idx];
            let g = &step.graph;
            let ids: Vec<i32> = tokens.iter().map(|&t| t as i32).collect();
            let pos: Vec<i32> = (0..n).map(|i| (p0 + i) as i32).collect();
            let rows: Vec<i64> = (0..n).map(|i| (p0 + i) as i64).collect();
            let mut mask = vec![f16::NEG_INFINITY; shape.n_kv * n];
            for (i, row) in mask.chunks_mut(shape.n_kv).enumerate() {
                // Token i sits at position p0 + i and sees every cell up to it.
                row[..p0 + i + 1].fill(f16::ZERO);
            }
            // Queued on the stream of the device each input lives on, ahead of the step: no
            // round trip per input.
            let sched = &mut self.sched;
            let plan = &step.plan;
            let mut set = |id, bytes: &[u8]| set(sched, plan, g, id, bytes);
            set(step.io.tokens, bytemuck::cast_slice(&ids))?;
            set(step.io.pos, bytemuck::cast_slice(&pos))?;
            set(step.io.global.rows, bytemuck::cast_slice(&rows))?;
            set(step.io.global.mask, &f16_bytes(&mask))?;
            if let (Some(w), Some(ring), Some(window)) =
                (step.io.window, ring, self.model.config.max_window())
            {
                let (rows, mask) = window_inputs(p0, n, ring, window, shape.n_kv_window);
                set(w.rows, bytemuck::cast_slice(&rows))?;
                set(w.mask, &f16_bytes(&mask))?;
            }
        }
        let step = &self.steps[idx];
        let inputs = started.elapsed();
        if !want {
            self.sched.compute_queued(&step.graph, &step.plan)?;
            self.n_past += n;
            return Ok(Vec::new());
        }
        let count = step.graph.get(step.io.logits).nelements();
        // Read straight into the f32s returned (no second pass over n_vocab values a token).
        let mut logits = vec![0f32; count];
        self.sched.compute_read(
            &step.graph,
            &step.plan,
            step.io.logits,
            bytemuck::cast_slice_mut(&mut logits),
        )?;
        self.n_past += n;
        log::trace!(
            "step of {n} tokens: host us from its start: inputs queued {}, computed and logits read {}",
            inputs.as_micros(),
            started.elapsed().as_micros()
        );
        Ok(logits)
    }
}

/// The rows and mask of the sliding-window layers for `n` tokens from position `p0`: position
/// p lives in cell p mod `ring`; after the step's writes, cell c holds the latest position
/// below p0 + n congruent to c, and token p sees it when that position is at most p and fewer
/// than `window` behind it (llama.cpp's standard sliding window). `n_kv` cells are attended.
fn window_inputs(
    p0: usize,
    n: usize,
    ring: usize,
    window: usize,
    n_kv: usize,
) -> (Vec<i64>, Vec<f16>) {
    let rows = (p0..p0 + n).map(|p| (p % ring) as i64).collect();
    let end = p0 + n; // one past the last position written
    let mut mask = vec![f16::NEG_INFINITY; n_kv * n];
    for c in 0..n_kv.min(end) {
        // The latest position q < end with q = c (mod ring).
        let q = c + (end - 1 - c) / ring * ring;
        for (i, row) in mask.chunks_mut(n_kv).enumerate() {
            let p = p0 + i;
            if q <= p && p - q < window {
                row[c] = f16::ZERO;
            }
        }
    }
    (rows, mask)
}

pub(crate) fn f16_bytes(v: &[f16]) -> Vec<u8> {
    v.iter().flat_map(|h| h.to_le_bytes()).collect()
}

/// Writes an input tensor through the backend of the device `plan` placed it on, ordered with
/// its stream (`bytes` is pageable memory: the copy has taken it when this returns).
pub(crate) fn set(
    sched: &mut Scheduler,
    plan: &SchedPlan,
    g: &Graph,
    id: tessera_core::TensorId,
    bytes: &[u8],
) -> Result<()> {
    let d = g.data_or_err(id)?;
    let dev = plan
        .placement
        .get(id.index())
        .copied()
        .flatten()
        .unwrap_or(0);
    sched
        .backend_mut(dev)
        .set_async(d.buffer.as_ref(), d.offset, bytes)
}
