//! Many sequences evaluated together: one KV cache shared by every sequence ([`Cells`]) and one
//! graph per step over the tokens of all the sequences that step carries.
//!
//! Batching is a matter of the step's inputs: each token brings its own position, the cache
//! cell it is written to, and a mask row that lets it see only the cells of its own sequence at
//! positions up to its own. The output head runs only on the tokens whose logits are wanted
//! (the last of each sequence, as a rule), picked by [`Head::LogitsOf`]. A sequence may join,
//! leave, be truncated or share another's prefix between any two steps, so a server runs
//! continuous batching by calling [`BatchContext::decode`] once per step with whatever its
//! sequences need: a chunk of a prompt, or the one token each decoding sequence sampled.

use std::sync::Arc;

use half::f16;
use tessera_core::{Buffer, DType, DeviceKind, Error, Graph, Result, SchedPlan, Scheduler};

use crate::context::{f16_bytes, set, KV_PAD};
use crate::forward::{self, Head, StepIo, StepShape, StepSource};
use crate::kv_cache::{Cells, KvCache, SeqId};
use crate::model::Model;

/// Settings of a [`BatchContext`].
#[derive(Clone, Debug)]
pub struct BatchParams {
    /// Positions one sequence may hold (0: the smaller of the model's training context and
    /// 4096).
    pub n_ctx: usize,
    /// Sequences the cache is sized for: it holds `n_ctx * n_seq` cells, shared by all.
    pub n_seq: usize,
    /// Most tokens evaluated in one graph (a larger step is cut into graphs of this).
    pub n_ubatch: usize,
    /// KV cache element type (F16 as llama.cpp, or F32).
    pub kv_type: DType,
    /// Cells per page: the cache is handed to sequences in pages of this many cells (see
    /// [`Cells`]), so that a step's attention visits only each sequence's own pages. A
    /// multiple of the attention kernels' key tiles (32 to 256 keys, by backend and head size)
    /// lets them skip other sequences' pages whole; the cache holds `n_seq` sequences of `n_ctx`
    /// positions in whole pages. 1 hands out single cells.
    pub page_cells: usize,
}

impl Default for BatchParams {
    fn default() -> Self {
        BatchParams {
            n_ctx: 0,
            n_seq: 1,
            n_ubatch: 512,
            kv_type: DType::F16,
            page_cells: 256,
        }
    }
}

/// Which logits a sequence's tokens of a step give back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Output {
    /// None (a prompt chunk that is not the prompt's end).
    None,
    /// The last token's.
    Last,
    /// Every token's, in order.
    All,
}

/// The tokens one sequence brings to a step.
#[derive(Clone, Copy, Debug)]
pub struct SeqTokens<'a> {
    /// The sequence.
    pub seq: SeqId,
    /// Its next tokens (evaluated after the positions it holds).
    pub tokens: &'a [u32],
    /// Which logits come back.
    pub output: Output,
}

struct Step {
    key: (StepShape, Head),
    graph: Graph,
    plan: SchedPlan,
    io: StepIo,
}

/// Step graphs kept for reuse: decode steps differ only in how many sequences they carry.
const MAX_GRAPHS: usize = 8;

/// A group of [`BatchContext::decode_groups`] whose logits wait in a buffer of their own: its
/// entries, each token's entry and whether it gives an output, the tokens that do, and the
/// logits' bytes.
struct InFlight {
    n: usize,
    chunk: Vec<(usize, bool)>,
    wanted: Vec<i32>,
    bytes: usize,
}

/// Every token of a step, in order: (entry, token, whether its output comes back).
fn flat_tokens(batch: &[SeqTokens], head: Head) -> Vec<(usize, u32, bool)> {
    let mut flat = Vec::new();
    for (e, b) in batch.iter().enumerate() {
        let n = b.tokens.len();
        for (i, &t) in b.tokens.iter().enumerate() {
            let want = match (head, b.output) {
                (Head::Hidden, _) | (_, Output::All) => true,
                (_, Output::Last) => i + 1 == n,
                (_, Output::None) => false,
            };
            flat.push((e, t, want));
        }
    }
    flat
}

/// Appends each wanted row of `vals` (one per `wanted` token, in order) to its entry's output
/// (`chunk[i].0` for token i).
fn spread(vals: &[f32], chunk: &[(usize, bool)], wanted: &[i32], out: &mut [Vec<f32>]) {
    if wanted.is_empty() {
        return;
    }
    let width = vals.len() / wanted.len();
    for (row, &i) in vals.chunks(width).zip(wanted) {
        out[chunk[i as usize].0].extend_from_slice(row);
    }
}

/// The attention groups of a graph over `chunk`'s tokens ([`StepShape::n_groups`]): one per
/// entry when every entry brings equally many tokens (each sequence's rows then get kernel
/// blocks of their own), else one.
fn attention_groups(chunk: &[(usize, u32, bool)]) -> usize {
    let mut runs: Vec<usize> = Vec::new();
    for (i, &(e, _, _)) in chunk.iter().enumerate() {
        if i > 0 && chunk[i - 1].0 == e {
            *runs.last_mut().expect("a run was started") += 1;
        } else {
            runs.push(1);
        }
    }
    if runs.len() > 1 && runs.iter().all(|&r| r == runs[0]) {
        runs.len()
    } else {
        1
    }
}

/// Magic and version of a saved sequence.
const SEQ_MAGIC: &[u8; 8] = b"TSKVSEQ1";

/// Evaluates tokens of many sequences against a model, in one graph per step.
pub struct BatchContext {
    model: Arc<Model>,
    sched: Scheduler,
    kv: KvCache,
    cells: Cells,
    n_ctx: usize,
    n_ubatch: usize,
    steps: Vec<Step>,
    /// Where the logits of a group in flight wait for the host ([`BatchContext::decode_groups`]):
    /// one buffer per group but the last, on the device of the step's logits.
    held: Vec<Arc<dyn Buffer>>,
}

impl BatchContext {
    /// A context for `model` on the model's device (the CPU runs what the device cannot).
    pub fn new(model: Arc<Model>, params: BatchParams) -> Result<Self> {
        let cfg = &model.config;
        let n_ctx = if params.n_ctx == 0 {
            cfg.n_ctx_train.min(4096)
        } else {
            params.n_ctx
        };
        if params.n_ubatch == 0 || params.n_seq == 0 || params.page_cells == 0 {
            return Err(Error::Invalid(
                "the batch size, the sequence count and the page size must be at least 1".into(),
            ));
        }
        // Each sequence's n_ctx positions in whole pages, and whole KV_PAD blocks, as the
        // one-sequence context: mask rows are then whole words.
        let page = params.page_cells;
        let n_cells = n_ctx
            .div_ceil(page)
            .checked_mul(page)
            .and_then(|c| c.checked_mul(params.n_seq))
            .ok_or(Error::Overflow("KV cells"))?
            .div_ceil(KV_PAD)
            * KV_PAD;
        // Split by layers, each layer's cells live on its part and the scheduler runs each
        // layer's nodes there (as the one-sequence context does); the CPU runs what no part can.
        let (kv, mut devices) = match model.layer_split() {
            Some(split) => (
                KvCache::new_shared_split(cfg, split, n_cells, params.kv_type)?,
                split.parts().to_vec(),
            ),
            None => {
                let device = model.device().clone();
                let kv = KvCache::new_shared(
                    cfg,
                    device.as_ref(),
                    n_cells,
                    params.kv_type,
                    model.sharding(),
                )?;
                (kv, vec![device])
            }
        };
        if !devices.iter().any(|d| d.kind() == DeviceKind::Cpu) {
            devices.push(model.fallback().clone());
        }
        let mut sched = Scheduler::new(devices)?;
        if let Some(split) = model.layer_split() {
            sched.set_op_offload(split.op_offload());
        }
        Ok(BatchContext {
            sched,
            kv,
            cells: Cells::with_pages(n_cells, page),
            n_ctx,
            n_ubatch: params.n_ubatch,
            steps: Vec::new(),
            held: Vec::new(),
            model,
        })
    }

    /// The model.
    pub fn model(&self) -> &Arc<Model> {
        &self.model
    }

    /// Positions one sequence may hold.
    pub fn n_ctx(&self) -> usize {
        self.n_ctx
    }

    /// Most tokens in one graph.
    pub fn n_ubatch(&self) -> usize {
        self.n_ubatch
    }

    /// The cells and which sequences hold them.
    pub fn cells(&self) -> &Cells {
        &self.cells
    }

    /// A new, empty sequence.
    pub fn add_seq(&mut self) -> SeqId {
        self.cells.add_seq()
    }

    /// Forgets a sequence, freeing the cells only it held.
    pub fn remove_seq(&mut self, seq: SeqId) -> Result<()> {
        self.cells.remove_seq(seq)
    }

    /// Keeps the first `n` positions of a sequence.
    pub fn truncate(&mut self, seq: SeqId, n: usize) -> Result<()> {
        self.cells.truncate(seq, n)
    }

    /// Makes `dst` hold `src`'s first `n` positions, sharing their cells.
    pub fn copy_prefix(&mut self, src: SeqId, dst: SeqId, n: usize) -> Result<()> {
        self.cells.copy_prefix(src, dst, n)
    }

    /// Positions a sequence holds.
    pub fn seq_len(&self, seq: SeqId) -> Result<usize> {
        self.cells.seq_len(seq)
    }

    /// Evaluates one step: each sequence's tokens after the positions it holds. Returns, per
    /// entry, the logits its [`Output`] asks for (`n_vocab` per token). On an error no
    /// sequence keeps the step's positions.
    pub fn decode(&mut self, batch: &[SeqTokens]) -> Result<Vec<Vec<f32>>> {
        self.check(batch)?;
        let before: Vec<(SeqId, usize)> = batch
            .iter()
            .map(|b| Ok((b.seq, self.cells.seq_len(b.seq)?)))
            .collect::<Result<_>>()?;
        let r = self.decode_checked(batch, Head::LogitsOf(0));
        if r.is_err() {
            for &(seq, n) in &before {
                self.cells.truncate(seq, n)?;
            }
        }
        r
    }

    /// Evaluates one step of each group of sequences, as [`BatchContext::decode`] on each group
    /// in turn would, and returns each group's outputs.
    ///
    /// On a model split by layers the groups are in flight together: a group's work is queued
    /// and the next group's starts on the first part while a later part still runs the
    /// previous group's layers, so that the parts work on different groups at once (the host
    /// waits once, after the last group). A group whose tokens do not fit one graph
    /// ([`BatchParams::n_ubatch`]), or any group of a model not split by layers, runs as
    /// [`BatchContext::decode`] does. On an error no sequence keeps the positions of any group.
    pub fn decode_groups(&mut self, groups: &[&[SeqTokens]]) -> Result<Vec<Vec<Vec<f32>>>> {
        let mut before: Vec<(SeqId, usize)> = Vec::new();
        for g in groups {
            for b in g.iter() {
                if !before.iter().any(|&(s, _)| s == b.seq) {
                    before.push((b.seq, self.cells.seq_len(b.seq)?));
                }
            }
        }
        let r = self.decode_groups_checked(groups);
        if r.is_err() {
            for &(seq, n) in &before {
                self.cells.truncate(seq, n)?;
            }
        }
        r
    }

    fn decode_groups_checked(&mut self, groups: &[&[SeqTokens]]) -> Result<Vec<Vec<Vec<f32>>>> {
        let tokens = |g: &[SeqTokens]| g.iter().map(|b| b.tokens.len()).sum::<usize>();
        let in_flight = self.model.layer_split().is_some()
            && groups.len() > 1
            && groups.iter().all(|g| tokens(g) <= self.n_ubatch);
        if !in_flight {
            return groups
                .iter()
                .map(|g| {
                    self.check(g)?;
                    self.decode_checked(g, Head::LogitsOf(0))
                })
                .collect();
        }
        let mut outs: Vec<Vec<Vec<f32>>> = Vec::with_capacity(groups.len());
        // Groups but the last: queued, their logits copied on their device to a buffer of
        // their own (the next group's step may reuse the memory they are computed in).
        let mut pending: Vec<InFlight> = Vec::new();
        let (last, first) = groups.split_last().expect("more than one group");
        for (k, g) in first.iter().enumerate() {
            self.check(g)?;
            let chunk = flat_tokens(g, Head::LogitsOf(0));
            let (idx, wanted) = self.queue_inputs(g, &chunk, Head::LogitsOf(0))?;
            let step = &self.steps[idx];
            self.sched.compute_queued(&step.graph, &step.plan)?;
            let id = step.io.logits;
            let bytes = step.graph.get(id).nbytes();
            let dev = step
                .plan
                .placement
                .get(id.index())
                .copied()
                .flatten()
                .ok_or_else(|| Error::Invalid("the step's logits have no device".into()))?;
            let device = self.sched.devices()[dev].clone();
            if self.held.len() <= k {
                self.held.push(device.buffer_type().alloc(bytes)?);
            }
            if self.held[k].size() < bytes || !device.can_use_buffer(self.held[k].as_ref()) {
                self.held[k] = device.buffer_type().alloc(bytes)?;
            }
            let data = step.graph.data_or_err(id)?;
            self.sched.backend_mut(dev).copy_async(
                data.buffer.as_ref(),
                data.offset,
                self.held[k].as_ref(),
                0,
                bytes,
            )?;
            let chunk: Vec<(usize, bool)> = chunk.iter().map(|&(e, _, w)| (e, w)).collect();
            pending.push(InFlight {
                n: g.len(),
                chunk,
                wanted,
                bytes,
            });
        }
        // The last group waits for everything queued before it.
        self.check(last)?;
        let mut last_out = vec![Vec::new(); last.len()];
        let chunk = flat_tokens(last, Head::LogitsOf(0));
        self.ubatch(last, &chunk, Head::LogitsOf(0), &mut last_out)?;
        for (k, f) in pending.into_iter().enumerate() {
            let mut vals = vec![0f32; f.bytes / 4];
            self.held[k].get(0, bytemuck::cast_slice_mut(&mut vals))?;
            let mut out = vec![Vec::new(); f.n];
            spread(&vals, &f.chunk, &f.wanted, &mut out);
            outs.push(out);
        }
        outs.push(last_out);
        Ok(outs)
    }

    /// The hidden states after the output norm of `tokens` evaluated after the positions `seq`
    /// holds: `n_embd` values per token, in order (what embeddings pool).
    pub fn hidden(&mut self, seq: SeqId, tokens: &[u32]) -> Result<Vec<f32>> {
        let batch = [SeqTokens {
            seq,
            tokens,
            output: Output::All,
        }];
        self.check(&batch)?;
        let n = self.cells.seq_len(seq)?;
        let r = self.decode_checked(&batch, Head::Hidden);
        if r.is_err() {
            self.cells.truncate(seq, n)?;
        }
        Ok(r?.remove(0))
    }

    fn check(&self, batch: &[SeqTokens]) -> Result<()> {
        let n_vocab = self.model.config.n_vocab;
        let mut total = 0usize;
        for (i, b) in batch.iter().enumerate() {
            if batch[..i].iter().any(|o| o.seq == b.seq) {
                return Err(Error::Invalid(format!(
                    "sequence {} appears twice in one step",
                    b.seq
                )));
            }
            if let Some(&bad) = b.tokens.iter().find(|&&t| t as usize >= n_vocab) {
                return Err(Error::Invalid(format!(
                    "token id {bad} is past the vocabulary of {n_vocab}"
                )));
            }
            let len = self.cells.seq_len(b.seq)?;
            if len + b.tokens.len() > self.n_ctx {
                return Err(Error::Invalid(format!(
                    "{} tokens after {len} do not fit the context of {} positions",
                    b.tokens.len(),
                    self.n_ctx
                )));
            }
            total += b.tokens.len();
        }
        if total == 0 {
            return Err(Error::Invalid(
                "nothing to evaluate: the step has no tokens".into(),
            ));
        }
        if total > self.cells.n_free() {
            return Err(Error::Invalid(format!(
                "the step's {total} tokens need more than the {} free KV cells",
                self.cells.n_free()
            )));
        }
        Ok(())
    }

    fn decode_checked(&mut self, batch: &[SeqTokens], head: Head) -> Result<Vec<Vec<f32>>> {
        let flat = flat_tokens(batch, head);
        let mut out = vec![Vec::new(); batch.len()];
        for chunk in flat.chunks(self.n_ubatch) {
            self.ubatch(batch, chunk, head, &mut out)?;
        }
        Ok(out)
    }

    /// One graph over `chunk`'s tokens; appends the outputs to `out`.
    fn ubatch(
        &mut self,
        batch: &[SeqTokens],
        chunk: &[(usize, u32, bool)],
        head: Head,
        out: &mut [Vec<f32>],
    ) -> Result<()> {
        let (idx, wanted) = self.queue_inputs(batch, chunk, head)?;
        let step = &self.steps[idx];
        let g = &step.graph;
        let count = g.get(step.io.logits).nelements();
        let mut vals = vec![0f32; count];
        self.sched.compute_read(
            g,
            &step.plan,
            step.io.logits,
            bytemuck::cast_slice_mut(&mut vals),
        )?;
        let chunk: Vec<(usize, bool)> = chunk.iter().map(|&(e, _, w)| (e, w)).collect();
        spread(&vals, &chunk, &wanted, out);
        Ok(())
    }

    /// Takes the cells of `chunk`'s tokens and queues the inputs of their step graph; returns
    /// the graph's index and the tokens (indices in `chunk`) whose outputs it gives.
    fn queue_inputs(
        &mut self,
        batch: &[SeqTokens],
        chunk: &[(usize, u32, bool)],
        head: Head,
    ) -> Result<(usize, Vec<i32>)> {
        let n = chunk.len();
        let mut ids = Vec::with_capacity(n);
        let mut pos = Vec::with_capacity(n);
        let mut rows = Vec::with_capacity(n);
        let mut seq_pos = Vec::with_capacity(n);
        for &(e, t, _) in chunk {
            let seq = batch[e].seq;
            let p = self.cells.seq_len(seq)?;
            pos.push(p as i32);
            seq_pos.push((seq, p));
            rows.push(self.cells.push(seq)? as i64);
            ids.push(t as i32);
        }
        let n_kv = (self.cells.used_end().div_ceil(KV_PAD) * KV_PAD).min(self.cells.len());
        let window = self.model.config.max_window();
        let wanted: Vec<i32> = (0..n).filter(|&i| chunk[i].2).map(|i| i as i32).collect();
        let head = match head {
            Head::Hidden => Head::Hidden,
            // A chunk whose tokens all lead into a later one: the head still needs a row.
            _ if wanted.is_empty() => Head::LogitsOf(1),
            _ => Head::LogitsOf(wanted.len()),
        };
        let shape = StepShape {
            n_tokens: n,
            n_kv,
            n_kv_window: if window.is_some() { n_kv } else { 0 },
            all_logits: head == Head::Hidden,
            n_groups: attention_groups(chunk),
        };
        let idx = self.step((shape, head))?;
        let step = &self.steps[idx];
        let g = &step.graph;
        let mut mask = Vec::with_capacity(n * n_kv);
        self.cells.mask_rows(&seq_pos, None, n_kv, &mut mask);
        // Each input through the backend of the device the plan placed it on.
        let sched = &mut self.sched;
        let plan = &step.plan;
        let mut set = |id, bytes: &[u8]| set(sched, plan, g, id, bytes);
        set(step.io.tokens, bytemuck::cast_slice(&ids))?;
        set(step.io.pos, bytemuck::cast_slice(&pos))?;
        set(step.io.global.rows, bytemuck::cast_slice(&rows))?;
        set(step.io.global.mask, &f16_bytes(&mask))?;
        if let Some(w) = step.io.window {
            let mut wmask: Vec<f16> = Vec::with_capacity(n * n_kv);
            self.cells.mask_rows(&seq_pos, window, n_kv, &mut wmask);
            set(w.rows, bytemuck::cast_slice(&rows))?;
            set(w.mask, &f16_bytes(&wmask))?;
        }
        if let Some(o) = step.io.out_ids {
            let picked: &[i32] = if wanted.is_empty() { &[0] } else { &wanted };
            set(o, bytemuck::cast_slice(picked))?;
        }
        Ok((idx, wanted))
    }

    /// The index of the step graph for `key`, built on first use.
    fn step(&mut self, key: (StepShape, Head)) -> Result<usize> {
        if let Some(i) = self.steps.iter().position(|s| s.key == key) {
            // Most recently used last: the oldest goes first when the list is full.
            let s = self.steps.remove(i);
            self.steps.push(s);
            return Ok(self.steps.len() - 1);
        }
        let src = StepSource {
            cfg: &self.model.config,
            weights: &self.model.weights,
            kv: &self.kv,
            n_ctx: self.n_ctx,
        };
        let (mut graph, io, _) = forward::build_head(&src, key.0, key.1)?;
        // Planning may place the new graph in memory that a group in flight still uses.
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
            "new batch step graph {:?}: {} tensors, {} splits",
            key,
            graph.len(),
            plan.splits.len()
        );
        if self.steps.len() >= MAX_GRAPHS {
            self.steps.remove(0);
        }
        self.steps.push(Step {
            key,
            graph,
            plan,
            io,
        });
        Ok(self.steps.len() - 1)
    }

    /// A sequence's KV state as bytes: its positions' K and V rows of every layer, with a header
    /// that [`BatchContext::restore_seq`] checks against the model and cache it is loaded into.
    pub fn save_seq(&self, seq: SeqId) -> Result<Vec<u8>> {
        self.check_host_cache()?;
        let cells = self.cells.cells_of(seq);
        let mut out = Vec::with_capacity(32 + cells.len() * self.kv.cell_bytes());
        out.extend_from_slice(SEQ_MAGIC);
        for v in [
            self.model.config.n_layer as u64,
            self.kv.cell_bytes() as u64,
            cells.len() as u64,
        ] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        for c in cells {
            self.kv.read_cell(c, &mut out)?;
        }
        Ok(out)
    }

    /// A new sequence holding the positions saved by [`BatchContext::save_seq`].
    pub fn restore_seq(&mut self, bytes: &[u8]) -> Result<SeqId> {
        self.check_host_cache()?;
        let bad = |why: &str| Error::Invalid(format!("not a saved sequence of this model: {why}"));
        if bytes.len() < 32 || &bytes[..8] != SEQ_MAGIC {
            return Err(bad("no header"));
        }
        let field = |i: usize| {
            let mut b = [0u8; 8];
            b.copy_from_slice(&bytes[8 + 8 * i..16 + 8 * i]);
            u64::from_le_bytes(b)
        };
        let cell_bytes = self.kv.cell_bytes();
        if field(0) != self.model.config.n_layer as u64 || field(1) != cell_bytes as u64 {
            return Err(bad("its layers or KV rows differ"));
        }
        let n = usize::try_from(field(2)).map_err(|_| bad("its length"))?;
        let body = &bytes[32..];
        if n.checked_mul(cell_bytes) != Some(body.len()) {
            return Err(bad("its length does not match its cells"));
        }
        if n > self.n_ctx || n > self.cells.n_free() {
            return Err(Error::Invalid(format!(
                "a saved sequence of {n} positions does not fit ({} per sequence, {} cells free)",
                self.n_ctx,
                self.cells.n_free()
            )));
        }
        let seq = self.cells.add_seq();
        for row in body.chunks(cell_bytes) {
            let cell = self.cells.push(seq)?;
            if let Err(e) = self.kv.write_cell(cell, row) {
                self.cells.remove_seq(seq)?;
                return Err(e);
            }
        }
        Ok(seq)
    }

    /// Saving reads the cache's rows at their offsets, which a sharded cache does not keep
    /// (a tensor-parallel model, or a layer split with a tensor-parallel group).
    fn check_host_cache(&self) -> Result<()> {
        let split_sharded = self
            .model
            .layer_split()
            .is_some_and(|s| (0..s.parts().len()).any(|j| s.sharding(j).is_some()));
        if self.model.sharding().is_some() || split_sharded {
            return Err(Error::Unsupported {
                backend: self.model.device().name(),
                what: "saving or restoring a sequence's KV state (the cache is sharded)".into(),
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::attention_groups;

    /// Entries of equal token counts get a group each; unequal ones, or one entry, one group.
    #[test]
    fn attention_groups_follow_equal_entries() {
        let chunk = |entries: &[usize]| -> Vec<(usize, u32, bool)> {
            entries.iter().map(|&e| (e, 7, true)).collect()
        };
        assert_eq!(attention_groups(&chunk(&[0, 1, 2, 3])), 4);
        assert_eq!(attention_groups(&chunk(&[0, 0, 1, 1, 2, 2])), 3);
        assert_eq!(attention_groups(&chunk(&[0, 0, 0, 1])), 1);
        assert_eq!(attention_groups(&chunk(&[0, 1, 1])), 1);
        assert_eq!(attention_groups(&chunk(&[3, 3, 3])), 1);
        assert_eq!(attention_groups(&chunk(&[5])), 1);
    }
}
