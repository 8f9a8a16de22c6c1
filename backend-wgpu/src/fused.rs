//! Fused dispatches: op sequences of a Llama block run as one dispatch each, when the
//! intermediate results are read by nothing else (the destination of the last op is written,
//! the intermediates never are).
//!
//! - `rms_norm(x) * w`, w one f32 row broadcast over x's rows, read only by mul_mats that run as
//!   the integer-dot mat-vec (alone or fused as below; a Llama block's Q, K and V, or gate and
//!   up, for one token): no dispatch of its own; each of those mat-vecs reads x and w and
//!   normalizes its column itself (NORM in `shaders/mat_vec_q.wgsl`). Nothing that
//!   runs until those mat-vecs are done may write x or w. Mat-vecs of several columns that
//!   read them pre-quantized (PQ) have one dispatch normalize and quantize the columns into
//!   the scratch, at the norm's place, for all of them (`quant_cols.wgsl`), where nothing
//!   that runs before the last of them uses the scratch; else each quantizes its own.
//! - else `rms_norm(x) * w` as one norm dispatch: the norm shader multiplies as it stores (MUL
//!   in `shaders/norm.wgsl`); with a residual added right after (a post-norm, as Gemma's), it
//!   adds that too (ADD).
//! - `r + W x`, a residual add right after a mul_mat that runs as the integer-dot mat-vec: the
//!   mat-vec adds `r` as it stores (ADD in `shaders/mat_vec_q.wgsl`).
//! - `swiglu(W_gate x, W_up x)` for one token, both weights of one type and shape, running as
//!   the integer-dot mat-vec: one dispatch computes both products of each row and stores
//!   `silu(gate) * up` (GLU in `mat_vec_q`).
//! - `glu(mul_mat_id(W_gate, x, ids), mul_mat_id(W_up, x, ids))` (a MoE layer's experts),
//!   both experts of one type, shape and layout: one mul_mat_id mat-vec dispatch computes both
//!   products of each selected expert's rows and stores the activation (ID with GLU in
//!   `shaders/mat_vec_q.wgsl`, or in `shaders/mat_vec.wgsl` for the types only it reads), for
//!   any number of tokens.
//! - three mul_mats of one token by the same vector, the last two as PAIR below and the first
//!   with weights of their type and row length (a Llama block's Q, K and V): one mat-vec
//!   dispatch whose first workgroups compute Q and the rest K and V (QKV in `mat_vec_q`),
//!   unless the adapter binds fewer than 8 storage buffers. Where
//!   the rope of Q and K and the stores of K and V into their caches follow (as below) and
//!   read the three products alone (straight or through a reshape), the same dispatch also
//!   rotates Q and K and stores the rotated Q and, at the cache row, K and V (ROPE in
//!   `mat_vec_q`; `rope(q)` must come right before `rope(k)`): adjacent-pair rope
//!   (`RopeMode::Normal`) only, F16 or F32 caches whose rows start at word-aligned bytes, an
//!   i32 position and an i32 or i64 cache row (a row past the cache's end is not written),
//!   with an even ROWS and where the adapter binds 10 storage buffers. NEOX rope, or products
//!   read by anything else, keep the rope dispatch below.
//! - two mul_mats of one token by the same vector with weights of one type and shape (a
//!   Llama block's K and V): one mat-vec dispatch computes both (PAIR in `mat_vec_q`).
//! - two mul_mats of a prompt (several columns) by the same activations, with weights of one
//!   type and row length in one buffer, that run as the same cooperative-matrix mat-mat (a
//!   Llama block's K and V, or gate and up): one mat-mat dispatch over both (MMPAIR in
//!   `mat_mat_coop.wgsl`), so that the smaller products fill the GPU together.
//! - `rope(q)`, `rope(k)`, then `set_rows` of the rotated K and of V into their F16 or F32
//!   caches at the same rows (a Llama block between its projections and attention): one
//!   dispatch rotates Q and writes the rotated K and V straight into the caches (KV in
//!   `shaders/rope.wgsl`; without Q where no rope of Q comes right before). Q/K norms before
//!   the ropes (Qwen 3's) keep their own dispatches.
//! - a MoE router's soft_max, top_k, get_rows and the normalization of the selected scores
//!   (a fusion `MoeRouter`): one dispatch, a workgroup a token (OP 4 in `shaders/moe.wgsl`).
//! - the weighted sum of a MoE layer's experts' outputs over the slots, with the residual add
//!   after it (`MoeWeightedSum`): one dispatch (OP 5 in `shaders/moe.wgsl`).
//!
//! A fused result is the unfused ops' result up to float rounding (the conformance cases
//! RMS_NORM_MUL, RMS_NORM_MUL_ADD, RMS_NORM_MUL_MAT, SWIGLU_MUL_MAT, MUL_MAT_ADD_NORM,
//! ROPE_KV_ATTN, QKV_ROPE_KV_ATTN, MOE_GLU, MOE_ROUTER and MOE_FFN check it
//! against the CPU, `tests/fusion.rs` against the unfused dispatches). Fusion is on unless
//! [`crate::WgpuOptions::fusion`] is off ([`crate::WgpuBackend::set_fusion`] per backend).

use std::cell::RefCell;
use std::collections::{HashMap, HashSet};

use tessera_core::fusion::{
    GluMulMatIds, GluMulMats, Group, Matcher, MoeRouter, MoeWeightedSum, MulMatAdd, MulMats,
    RmsNormMul, RmsNormMulAdd, RopeKv,
};
use tessera_core::{DType, Error, GluOp, Graph, Op, Result, RopeMode, TensorId};

use crate::context::Gpu;
use crate::keys::{Key, SecondMatrix};
use crate::ops::{self, desc, Launch, PlanOut};
use crate::shader::Variant;

/// What a fusion looks at: the device, the graph, and the groups core's matcher finds among
/// the nodes of this compute.
pub(crate) struct Fuser<'a> {
    /// The device.
    pub gpu: &'a Gpu,
    /// The graph.
    pub graph: &'a Graph,
    /// The nodes to run, in order.
    pub nodes: &'a [TensorId],
    /// The groups of the nodes.
    matcher: Matcher<'a>,
    /// The products `m = rms_norm(x) * w` left to the mat-vecs that read them (NORM), by m.
    norms: RefCell<HashMap<TensorId, Norm>>,
    /// The products m of `norms` already quantized into the scratch for all their readers
    /// (mat-vecs that read their columns pre-quantized, PQ).
    quantized: RefCell<HashSet<TensorId>>,
}

/// An `rms_norm(x) * w` that the mat-vecs reading it compute.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Norm {
    /// The rows normalized.
    x: TensorId,
    /// The weights multiplied in (one f32 row).
    w: TensorId,
    /// The norm's epsilon.
    eps: f32,
}

impl<'a> Fuser<'a> {
    /// A fuser of `nodes` of `graph`.
    pub fn new(gpu: &'a Gpu, graph: &'a Graph, nodes: &'a [TensorId]) -> Self {
        Fuser {
            gpu,
            graph,
            nodes,
            matcher: Matcher::new(graph, nodes),
            norms: RefCell::new(HashMap::new()),
            quantized: RefCell::new(HashSet::new()),
        }
    }

    /// The fused launches at `nodes[i]` and how many nodes they stand for (`None`: none
    /// applies): the first group the matcher offers there that these kernels take, else a
    /// mat-vec by a norm left to it. Called for the nodes in order.
    pub fn try_fuse(&self, i: usize) -> Result<Option<(Vec<Launch>, usize)>> {
        let mut launches = Vec::new();
        let taken = self.matcher.fuse_at(i, |group| {
            let fused = self.take(group)?;
            let took = fused.is_some();
            launches = fused.unwrap_or_default();
            Ok::<_, Error>(took)
        })?;
        match taken {
            Some(n) => Ok(Some((launches, n))),
            None => self.mat_vec_norm(i),
        }
    }

    /// The launches of `group` where these kernels take it.
    fn take(&self, group: &Group) -> Result<Option<Vec<Launch>>> {
        match group {
            Group::RmsNormMul(n) => match self.norm_into_mat_vecs(n)? {
                Some(l) => Ok(Some(l)),
                None => self.rms_norm_mul(n),
            },
            Group::GluMulMats(m) => self.gate_up_swiglu(m),
            Group::GluMulMatIds(m) => self.experts_gate_up(m),
            Group::RopeKv(r) => self.rope_kv(r),
            Group::MulMatAdd(m) => self.mat_vec_add(m),
            Group::MulMats(m) if m.mats.len() == 3 => self.q_kv(m),
            Group::MulMats(m) => match self.mat_vec_pair(m)? {
                Some(l) => Ok(Some(l)),
                None => self.mat_mat_pair(m),
            },
            Group::RmsNormMulAdd(n) => self.rms_norm_mul_add(n),
            Group::MoeRouter(r) => self.moe_router(r),
            Group::MoeWeightedSum(s) => self.moe_weighted_sum(s),
            Group::RopeSetRows(_) | Group::AllReduceAdd(_) | Group::AttnMulMat(_) => Ok(None),
        }
    }

    /// Whether the memory of `a` and `b` does not overlap, or (`same_ok`) is the same bytes
    /// laid out alike: a fused dispatch that writes `a` while reading `b` then reads no value
    /// another invocation has overwritten.
    fn apart(&self, a: TensorId, b: TensorId, same_ok: bool) -> bool {
        let g = self.graph;
        let (Some(da), Some(db)) = (g.data(a), g.data(b)) else {
            return false;
        };
        let (ta, tb) = (g.get(a), g.get(b));
        if !std::ptr::addr_eq(
            std::sync::Arc::as_ptr(&da.buffer),
            std::sync::Arc::as_ptr(&db.buffer),
        ) {
            return true;
        }
        if same_ok && da.offset == db.offset && ta.nb == tb.nb && ta.ne == tb.ne {
            return true;
        }
        let span = |off: usize, t: &tessera_core::Tensor| {
            let last: usize = (0..4).map(|k| (t.ne[k].max(1) - 1) * t.nb[k]).sum();
            (off, off + last + t.dtype.type_size())
        };
        let (a0, a1) = span(da.offset, ta);
        let (b0, b1) = span(db.offset, tb);
        a1 <= b0 || b1 <= a0
    }

    /// Whether `rms_norm(x) * w` is in the form the norm kernels take: w one row broadcast over
    /// x's rows, all f32.
    fn norm_fits(&self, n: &RmsNormMul) -> bool {
        let g = self.graph;
        let (tr, tm, tw) = (g.get(n.norm), g.get(n.mul), g.get(n.w));
        tw.dtype == DType::F32
            && tm.dtype == DType::F32
            && tr.dtype == DType::F32
            && g.get(n.x).dtype == DType::F32
            && tm.ne == tr.ne
            && tw.ne == [tr.ne[0], 1, 1, 1]
    }

    /// `m = rms_norm(x) * w` read only by later mul_mats by m (as src1) that run as the
    /// integer-dot mat-vec, alone or fused (ADD, GLU, PAIR): no dispatch; each of those
    /// mat-vecs computes the norm of its column (NORM). Every node that runs from m on to the
    /// node after m's last reader must keep apart from x and w, which are read in m's stead.
    fn norm_into_mat_vecs(&self, n: &RmsNormMul) -> Result<Option<Vec<Launch>>> {
        let g = self.graph;
        if !self.norm_fits(n) || g.get(n.w).nb[0] != 4 {
            return Ok(None);
        }
        let (j, m) = (n.last, n.mul);
        let want = self.matcher.uses()[m.index()] as usize;
        let (mut found, mut last) = (0, j);
        for (k, &node) in self.nodes.iter().enumerate().skip(j + 1) {
            if found == want {
                break;
            }
            let t = g.get(node);
            if !t.src.contains(&m) {
                continue;
            }
            if t.op != Op::MulMat || t.src[0] == m || self.mat_vec_q_plan(node).is_none() {
                return Ok(None);
            }
            found += 1;
            last = k;
        }
        if found == 0 || found != want {
            return Ok(None);
        }
        let end = self.matcher.next_running(last + 1).map_or(last, |(k, _)| k);
        let apart = self.nodes[j + 1..=end].iter().all(|&node| {
            let t = g.get(node);
            t.op == Op::None
                || t.op.is_view()
                || (self.apart(node, n.x, false) && self.apart(node, n.w, false))
        });
        if !apart {
            return Ok(None);
        }
        let norm = Norm {
            x: n.x,
            w: n.w,
            eps: n.eps,
        };
        self.norms.borrow_mut().insert(m, norm);
        Ok(Some(self.quantize_for_readers(m, norm, j, last)?))
    }

    /// Where the mul_mats by `m = rms_norm(x) * w` (the nodes after `j` to `last` that read it)
    /// read their columns pre-quantized (PQ): the one dispatch that normalizes and quantizes
    /// them for all of those readers, provided nothing that runs between uses the scratch it
    /// leaves them in (else each reader quantizes its own: `Fuser::mat_vec_launches`).
    fn quantize_for_readers(
        &self,
        m: TensorId,
        n: Norm,
        j: usize,
        last: usize,
    ) -> Result<Vec<Launch>> {
        let g = self.graph;
        let mut pq = false;
        for &node in &self.nodes[j + 1..=last] {
            let t = g.get(node);
            if t.op == Op::None || t.op.is_view() {
                continue;
            }
            let Ok(plans) = ops::plan(self.gpu, g, node) else {
                return Ok(Vec::new());
            };
            let reads_m = t.src.contains(&m);
            if plans
                .iter()
                .any(|p| p.bind.iter().any(|b| b.scratch) || (!reads_m && ops::reads_quantized(p)))
            {
                return Ok(Vec::new());
            }
            pq |= reads_m && plans.iter().any(ops::reads_quantized);
        }
        if !pq {
            return Ok(Vec::new());
        }
        let q = ops::quant_cols_plan(self.gpu, g, m, m, Some((n.x, n.w, n.eps)));
        self.quantized.borrow_mut().insert(m);
        Ok(vec![ops::to_launch(self.gpu, g, m, q)?])
    }

    /// The launches of mat-vec plan `out` for node `id` ([`Fuser::launch`]); where it reads its
    /// columns pre-quantized (PQ), the dispatch that quantizes them first (normalizing them
    /// where they are an `rms_norm(x) * w` left to the mat-vecs), unless that norm's dispatch
    /// quantized them for all its readers already.
    fn mat_vec_launches(&self, id: TensorId, out: PlanOut) -> Result<Vec<Launch>> {
        if !ops::reads_quantized(&out) {
            return Ok(vec![self.launch(id, out)?]);
        }
        let (g, col) = (self.graph, out.bind[2].id);
        let mut v = Vec::with_capacity(2);
        if !self.quantized.borrow().contains(&col) {
            let norm = self.norms.borrow().get(&col).map(|n| (n.x, n.w, n.eps));
            let q = ops::quant_cols_plan(self.gpu, g, id, col, norm);
            v.push(ops::to_launch(self.gpu, g, id, q)?);
        }
        let out = ops::read_quantized(g, id, out);
        v.push(ops::to_launch(self.gpu, g, id, out)?);
        Ok(v)
    }

    /// `rms_norm(x) * w` as one norm dispatch (MUL).
    fn rms_norm_mul(&self, n: &RmsNormMul) -> Result<Option<Vec<Launch>>> {
        let g = self.graph;
        let (m, w) = (n.mul, n.w);
        let (tm, tw) = (g.get(m), g.get(w));
        if !self.norm_fits(n) || !self.apart(m, n.x, true) {
            return Ok(None);
        }
        let Some(mut out) = self.single_plan(n.norm) else {
            return Ok(None);
        };
        if let Key::Norm(k) = &mut out.variant.key {
            k.mul = true;
        }
        out.bind[0].id = m;
        out.bind.push(ops::Bind::whole(w));
        out.params.desc[0] = desc(tm);
        out.params.desc[2] = desc(tw);
        Ok(Some(vec![ops::to_launch(self.gpu, g, m, out)?]))
    }

    /// `rms_norm(x) * w + r` as one norm dispatch (MUL, ADD): r f32 of the result's shape; the
    /// result apart from x and r, or exactly one of them (each value is read before it is
    /// written, by the same invocation).
    fn rms_norm_mul_add(&self, n: &RmsNormMulAdd) -> Result<Option<Vec<Launch>>> {
        let g = self.graph;
        let (add, r, w) = (n.add, n.residual, n.norm.w);
        let (ta, tr, tw) = (g.get(add), g.get(r), g.get(w));
        let fits = self.norm_fits(&n.norm)
            && ta.dtype == DType::F32
            && tr.dtype == DType::F32
            && ta.ne == g.get(n.norm.mul).ne
            && tr.ne == ta.ne
            && self.apart(add, n.norm.x, true)
            && self.apart(add, r, true)
            && self.apart(add, w, false);
        if !fits {
            return Ok(None);
        }
        let Some(mut out) = self.single_plan(n.norm.norm) else {
            return Ok(None);
        };
        if let Key::Norm(k) = &mut out.variant.key {
            k.mul = true;
            k.add = true;
        }
        out.bind[0].id = add;
        out.bind.extend([ops::Bind::whole(w), ops::Bind::whole(r)]);
        out.params.desc[0] = desc(ta);
        out.params.desc[2] = desc(tw);
        out.params.desc[3] = desc(tr);
        Ok(Some(vec![ops::to_launch(self.gpu, g, add, out)?]))
    }

    /// The launch of plan `out` for node `id`: an integer-dot mat-vec by a product
    /// `rms_norm(x) * w` left to it ([`Fuser::norm_into_mat_vecs`]) reads x and w and computes
    /// the norm (NORM).
    fn launch(&self, id: TensorId, out: PlanOut) -> Result<Launch> {
        ops::to_launch(self.gpu, self.graph, id, self.with_norm(out))
    }

    /// Plan `out`, made to compute the norm (NORM) where it is an integer-dot mat-vec by a
    /// product `rms_norm(x) * w` left to it.
    fn with_norm(&self, out: PlanOut) -> PlanOut {
        if out.variant.mat_vec_q().is_some() {
            if let Some(n) = self.norms.borrow().get(&out.bind[2].id) {
                return ops::mat_vec_q_norm(self.gpu, self.graph, out, n.x, n.w, n.eps);
            }
        }
        out
    }

    /// A mul_mat by a product `rms_norm(x) * w` left to the mat-vecs that no other fusion
    /// took: one mat-vec dispatch that computes the norm (NORM).
    fn mat_vec_norm(&self, i: usize) -> Result<Option<(Vec<Launch>, usize)>> {
        let m = self.nodes[i];
        let tm = self.graph.get(m);
        if tm.op != Op::MulMat || !self.norms.borrow().contains_key(&tm.src[1]) {
            return Ok(None);
        }
        // Checked when the norm was left to the mat-vecs.
        let out = self.mat_vec_q_plan(m).ok_or_else(|| Error::Unsupported {
            backend: self.gpu.name.clone(),
            what: format!(
                "MUL_MAT of '{}' by an rms_norm left to it (no integer-dot mat-vec)",
                self.graph.label(m)
            ),
        })?;
        Ok(Some((self.mat_vec_launches(m, out)?, 1)))
    }

    /// The one launch of node `id`'s plan (`None`: it has several, or none, or is not
    /// supported).
    fn single_plan(&self, id: TensorId) -> Option<PlanOut> {
        let mut plans = ops::plan(self.gpu, self.graph, id).ok()?;
        (plans.len() == 1).then(|| plans.remove(0))
    }

    /// The plan of mul_mat `m` when it runs as one integer-dot mat-vec dispatch (whole
    /// weights in one binding).
    fn mat_vec_q_plan(&self, m: TensorId) -> Option<PlanOut> {
        let tm = self.graph.get(m);
        if tm.op != Op::MulMat || tm.dtype != DType::F32 {
            return None;
        }
        let out = self.single_plan(m)?;
        (out.variant.mat_vec_q().is_some() && out.bind[1].skip == 0).then_some(out)
    }

    /// The mat-vec plans of mul_mats `a` and `b` (of one vector) when both multiply one
    /// token by unbatched weights of one type and shape, and one variant reads both (the same
    /// A4, Y4 and shape): what a dispatch over both weight matrices needs.
    fn mat_vec_q_pair(&self, a: TensorId, b: TensorId) -> Option<(PlanOut, PlanOut)> {
        let g = self.graph;
        let (ta, tb) = (g.get(a), g.get(b));
        let (wa, wb, tx) = (g.get(ta.src[0]), g.get(tb.src[0]), g.get(ta.src[1]));
        let fits = tx.ne[1] == 1
            && tx.ne[2] == 1
            && tx.ne[3] == 1
            && wa.ne[2] == 1
            && wa.ne[3] == 1
            && wa.dtype == wb.dtype
            && wa.ne == wb.ne;
        if !fits {
            return None;
        }
        let (pa, pb) = (self.mat_vec_q_plan(a)?, self.mat_vec_q_plan(b)?);
        (pa.variant == pb.variant).then_some((pa, pb))
    }

    /// `r + W x` (an add right after a mul_mat that runs as the integer-dot mat-vec): one
    /// mat-vec dispatch that adds `r` as it stores (ADD).
    fn mat_vec_add(&self, m: &MulMatAdd) -> Result<Option<Vec<Launch>>> {
        let g = self.graph;
        let (a, r) = (m.add, m.residual);
        let (tm, ta, tr) = (g.get(m.mul_mat), g.get(a), g.get(r));
        let fits = ta.dtype == DType::F32
            && tr.dtype == DType::F32
            && tr.ne == tm.ne
            && ta.ne == tm.ne
            && self.apart(a, r, true)
            && self.apart(a, tm.src[1], false);
        if !fits {
            return Ok(None);
        }
        let Some(mut out) = self.mat_vec_q_plan(m.mul_mat) else {
            return Ok(None);
        };
        out.variant = out.variant.with_mat_vec_q(|k| k.add = true);
        out.bind[0].id = a;
        out.bind.push(ops::Bind::whole(r));
        out.params.desc[0] = desc(ta);
        out.params.desc[3] = desc(tr);
        Ok(Some(self.mat_vec_launches(a, out)?))
    }

    /// `swiglu(W_gate x, W_up x)` (or geglu) for one token: one mat-vec dispatch over both
    /// weight matrices (GLU).
    fn gate_up_swiglu(&self, m: &GluMulMats) -> Result<Option<Vec<Launch>>> {
        let g = self.graph;
        let (gate, up, s) = (m.gate, m.up, m.glu);
        let Some((mut out, pu)) = self.mat_vec_q_pair(gate, up) else {
            return Ok(None);
        };
        let (tg, ts) = (g.get(gate), g.get(s));
        if ts.dtype != DType::F32 || ts.ne != tg.ne || !self.apart(s, tg.src[1], false) {
            return Ok(None);
        }
        out.variant = second_matrix_variant(out.variant, Some(m.op));
        out.bind[0].id = s;
        out.bind.push(pu.bind[1]);
        out.params.desc[0] = desc(ts);
        out.params.desc[3] = desc(g.get(g.get(up).src[0]));
        Ok(Some(vec![self.launch(s, out)?]))
    }

    /// The experts' gate and up mul_mat_ids and their glu (a MoE layer's) as one mul_mat_id
    /// mat-vec dispatch (GLU in `mat_vec`), where its result keeps apart from what it reads.
    fn experts_gate_up(&self, m: &GluMulMatIds) -> Result<Option<Vec<Launch>>> {
        let g = self.graph;
        let reads = [m.x, m.ids, g.get(m.gate).src[0], g.get(m.up).src[0]];
        if !reads.iter().all(|&r| self.apart(m.glu, r, false)) {
            return Ok(None);
        }
        match ops::mul_mat_id_glu(self.gpu, g, m.gate, m.up, m.glu, m.op) {
            Some(out) => Ok(Some(vec![self.launch(m.glu, out)?])),
            None => Ok(None),
        }
    }

    /// A MoE router's selection as one dispatch (OP 4 of `moe.wgsl`), where its results keep
    /// apart from the scores when several tokens run (one token's workgroup reads all its
    /// scores before it writes).
    fn moe_router(&self, r: &MoeRouter) -> Result<Option<Vec<Launch>>> {
        let g = self.graph;
        let several = g.get(r.logits).ne[1] > 1;
        if several
            && !(self.apart(r.weights, r.logits, false) && self.apart(r.top_k, r.logits, false))
        {
            return Ok(None);
        }
        match ops::router_plan(g, r) {
            Some(out) => Ok(Some(vec![ops::to_launch(self.gpu, g, r.weights, out)?])),
            None => Ok(None),
        }
    }

    /// The weighted sum of a MoE layer's experts' outputs (and the residual add after it) as
    /// one dispatch (OP 5 of `moe.wgsl`), where its result keeps apart from what it reads (the
    /// residual may be the result's own bytes).
    fn moe_weighted_sum(&self, s: &MoeWeightedSum) -> Result<Option<Vec<Launch>>> {
        let g = self.graph;
        let res_ok = s.residual.is_none_or(|(_, r)| self.apart(s.out, r, true));
        if !res_ok || !self.apart(s.out, s.down, false) || !self.apart(s.out, s.weights, false) {
            return Ok(None);
        }
        match ops::weighted_sum_plan(g, s) {
            Some(out) => Ok(Some(vec![ops::to_launch(self.gpu, g, s.out, out)?])),
            None => Ok(None),
        }
    }

    /// The PAIR plan of mul_mats `a` and `b` (one token by the same vector, with weights of
    /// one type and shape) when they may run as one mat-vec dispatch: bindings dst (a), a's
    /// weights, the vector, b's weights, b (the norm not yet applied).
    fn pair_plan(&self, a: TensorId, b: TensorId) -> Option<PlanOut> {
        let g = self.graph;
        let (mut out, pb) = self.mat_vec_q_pair(a, b)?;
        let (ta, tb) = (g.get(a), g.get(b));
        let x = ta.src[1];
        let fits = tb.dtype == DType::F32
            && tb.ne == ta.ne
            && tb.nb[0] == 4
            && self.apart(a, x, false)
            && self.apart(b, x, false)
            && self.apart(a, b, false);
        if !fits {
            return None;
        }
        out.variant = second_matrix_variant(out.variant, None);
        out.bind.push(pb.bind[1]);
        out.bind.push(pb.bind[0]);
        out.params.desc[3] = desc(g.get(tb.src[0]));
        out.params.desc[4] = desc(tb);
        Some(out)
    }

    /// Two mul_mats of one token by the same vector, with weights of one type and shape, as
    /// one mat-vec dispatch (PAIR).
    fn mat_vec_pair(&self, m: &MulMats) -> Result<Option<Vec<Launch>>> {
        let (a, b) = (m.mats[0], m.mats[1]);
        let Some(out) = self.pair_plan(a, b) else {
            return Ok(None);
        };
        Ok(Some(vec![self.launch(a, out)?]))
    }

    /// Two mul_mats of several columns by the same activations, with unbatched weights of one
    /// type and row length that run as the same cooperative-matrix mat-mat variant, as one
    /// dispatch over both (MMPAIR): a's row tiles, then b's. Both weight matrices must lie in
    /// one buffer within one storage binding. Bindings: dst (a), the memory of both weight
    /// matrices, the activations, dst again (unused), b. Where a third such mul_mat follows b
    /// (a Llama block's Q, K and V), a runs alone and b pairs with it (K and V: the smaller
    /// two).
    fn mat_mat_pair(&self, m: &MulMats) -> Result<Option<Vec<Launch>>> {
        let g = self.graph;
        let (a, b, x) = (m.mats[0], m.mats[1], m.x);
        if m.more_follow {
            return Ok(None);
        }
        let (ta, tb) = (g.get(a), g.get(b));
        let (Some(mut out), Some(pb)) = (self.single_plan(a), self.single_plan(b)) else {
            return Ok(None);
        };
        let (wa, wb, tx) = (g.get(ta.src[0]), g.get(tb.src[0]), g.get(x));
        let unbatched = |t: &tessera_core::Tensor| t.ne[2] == 1 && t.ne[3] == 1;
        // The bindings it adds (b's weights share a's, b is the fifth) are within the six
        // every mul_mat pipeline already binds.
        let fits = out.variant.mat_mat().is_some_and(|k| k.coop)
            && out.variant == pb.variant
            && wa.ne[0] == wb.ne[0]
            && unbatched(wa)
            && unbatched(wb)
            && unbatched(tx)
            && ta.dtype == DType::F32
            && tb.dtype == DType::F32
            && self.apart(a, x, false)
            && self.apart(b, x, false)
            && self.apart(a, b, false);
        if !fits {
            return Ok(None);
        }
        let (Some([ga, gy, 1]), Some([gb, _, 1])) = (out.groups_3d, pb.groups_3d) else {
            return Ok(None);
        };
        let Some((first, span, da, db)) = self.one_binding(ta.src[0], tb.src[0]) else {
            return Ok(None);
        };
        out.variant = mat_mat_pair_variant(out.variant);
        out.bind[1] = ops::Bind {
            id: first,
            skip: 0,
            span: Some(span),
            scratch: false,
        };
        out.bind.extend([out.bind[0], pb.bind[0]]);
        out.params.u[3] = da;
        out.params.h[0] = db;
        out.params.desc[3] = pb.params.desc[1];
        out.params.desc[4] = pb.params.desc[0];
        out.groups_3d = Some([ga + gb, gy, 1]);
        Ok(Some(vec![self.launch(a, out)?]))
    }

    /// Whether tensors `a` and `b` lie in one buffer within one storage binding of it: the
    /// one that starts first, the bytes from its start to the other's end, and the byte
    /// offsets of `a` and `b` from that start.
    fn one_binding(&self, a: TensorId, b: TensorId) -> Option<(TensorId, usize, u32, u32)> {
        let g = self.graph;
        let (da, db) = (g.data(a)?, g.data(b)?);
        if !std::ptr::addr_eq(
            std::sync::Arc::as_ptr(&da.buffer),
            std::sync::Arc::as_ptr(&db.buffer),
        ) {
            return None;
        }
        let (ea, eb) = (da.offset + g.get(a).nbytes(), db.offset + g.get(b).nbytes());
        let (lo, hi) = (da.offset.min(db.offset), ea.max(eb));
        let first = if da.offset <= db.offset { a } else { b };
        // A window may start up to one offset alignment below `lo` and needs 8 bytes past `hi`.
        let align = self.gpu.limits.min_storage_buffer_offset_alignment as usize;
        let fits = (hi - lo + align + 8) as u64 <= self.gpu.max_binding();
        let off = |o: usize| u32::try_from(o - lo).ok();
        fits.then_some((first, hi - lo, off(da.offset)?, off(db.offset)?))
    }

    /// A mul_mat Q followed by a PAIR of mul_mats K and V by the same vector, Q's weights of
    /// K's type and row length (any number of rows), as one mat-vec dispatch (QKV): Q's
    /// workgroups first, then those of K and V. Bindings: dst (Q), Wq, the vector, Wk, K, the
    /// norm weights (NORM; else dst again), Wv, V. With the rope and cache stores after them
    /// in the group, the same dispatch runs those too (ROPE, [`Fuser::with_rope`]).
    fn q_kv(&self, m: &MulMats) -> Result<Option<Vec<Launch>>> {
        let g = self.graph;
        let (q, k, v) = (m.mats[0], m.mats[1], m.mats[2]);
        let Some(pair) = self.pair_plan(k, v) else {
            return Ok(None);
        };
        let (tq, tk, tv) = (g.get(q), g.get(k), g.get(v));
        let (wq, wk, wv) = (g.get(tq.src[0]), g.get(tk.src[0]), g.get(tv.src[0]));
        let x = m.x;
        let limit = self.gpu.limits.max_storage_buffers_per_shader_stage as usize;
        let fits = limit >= crate::shader::QKV_BINDINGS
            && wq.dtype == wk.dtype
            && wq.ne[0] == wk.ne[0]
            && wq.ne[2] == 1
            && wq.ne[3] == 1
            && wv.nb == wk.nb
            && tv.nb == tk.nb
            && tq.nb[0] == 4
            && self.apart(q, x, false)
            && self.apart(q, k, false)
            && self.apart(q, v, false);
        if !fits {
            return Ok(None);
        }
        let Some(pq) = self.mat_vec_q_plan(q) else {
            return Ok(None);
        };
        let (mq, mk) = (tq.ne[0], tk.ne[0]);
        let Some(mut out) = ops::mat_vec_q_reshaped(self.gpu, g, q, pq, mq + mk) else {
            return Ok(None);
        };
        if out.variant.mat_vec_q().map(|k| k.a4) != pair.variant.mat_vec_q().map(|k| k.a4) {
            return Ok(None);
        }
        let rows = out.variant.mat_vec_q().map_or(1, |k| k.rows) as usize;
        let (gq, groups) = (mq.div_ceil(rows), mq.div_ceil(rows) + mk.div_ceil(rows));
        out.variant = second_matrix_variant(out.variant, None).with_mat_vec_q(|k| k.qkv = true);
        out.groups = groups;
        out.params.u[0] = groups as u32;
        out.params.u[3] = gq as u32;
        out.params.desc[3] = pair.params.desc[1];
        out.params.desc[4] = pair.params.desc[0];
        out.bind.truncate(3);
        out.bind.extend([pair.bind[1], pair.bind[0]]);
        let mut out = self.with_norm(out);
        while out.bind.len() < ops::NORM_W_BINDING + 1 {
            out.bind.push(out.bind[0]);
        }
        out.bind.extend([pair.bind[3], pair.bind[4]]);
        if let Some(r) = &m.rope_kv {
            if !self.rope_kv_fits(r) || !self.rope_follows_qkv(r, [q, k, v], &out) {
                return Ok(None);
            }
            out = self.with_rope(out, r);
        }
        Ok(Some(vec![ops::to_launch(self.gpu, g, q, out)?]))
    }

    /// Whether the rope and cache stores `r` after the Q, K and V products `qkv` of one token
    /// whose QKV plan is `out` are in the form the QKV mat-vec runs them itself (ROPE): Q's
    /// rope included, the plain rotation (no frequency factors), adjacent pairs, a contiguous
    /// rotated Q, word-aligned cache rows, ROWS even, an adapter that binds
    /// [`crate::shader::QKV_ROPE_BINDINGS`] storage buffers, and the caches and the rotated Q
    /// apart from everything the dispatch reads.
    fn rope_follows_qkv(&self, r: &RopeKv, qkv: [TensorId; 3], out: &PlanOut) -> bool {
        let g = self.graph;
        let Some(qr) = r.q else {
            return false;
        };
        let (tq, tk, tsk, tsv) = (g.get(qr), g.get(r.k), g.get(r.set_k), g.get(r.set_v));
        let (pos, idx) = (tq.src[1], tsk.src[2]);
        let mut reads = vec![out.bind[2].id, pos, idx];
        if out.variant.mat_vec_q().is_some_and(|k| k.norm) {
            reads.push(out.bind[ops::NORM_W_BINDING].id);
        }
        let hd = tk.ne[0];
        let limit = self.gpu.limits.max_storage_buffers_per_shader_stage as usize;
        limit >= crate::shader::QKV_ROPE_BINDINGS
            && r.params.is_plain()
            && r.factors.is_none()
            && r.params.mode == RopeMode::Normal
            && tq.is_contiguous()
            && tq.ne[2] == 1
            && hd.is_multiple_of(2)
            && r.params.n_dims <= hd
            && g.get(qkv[0]).ne[0] == tq.ne[0] * tq.ne[1]
            && g.get(qkv[1]).ne[0] == hd * tk.ne[1]
            && tsk.ne[0] == g.get(qkv[1]).ne[0]
            && g.get(pos).dtype == DType::I32
            && out.variant.mat_vec_q().is_some_and(|k| k.rows % 2 == 0)
            && tsk.nb[0] == tsk.dtype.type_size()
            && tsv.nb == tsk.nb
            && tsv.ne == tsk.ne
            && ops::aligned(self.gpu, g, r.set_k, 0, 4)
            && ops::aligned(self.gpu, g, r.set_v, 0, 4)
            && [qr, r.set_k, r.set_v]
                .iter()
                .all(|&w| reads.iter().all(|&x| self.apart(w, x, false)))
    }

    /// The QKV plan `out` made to run the rope and cache stores `r` that follow it, with the
    /// rope of Q (ROPE): bindings the rotated Q (for Q's product), Wq, the vector, Wk, the K
    /// cache (for K's), the norm weights (NORM; else the rotated Q), Wv, the V cache (for V's),
    /// the positions, the cache rows. `r` has the rope of Q ([`Fuser::rope_follows_qkv`]).
    fn with_rope(&self, mut out: PlanOut, r: &RopeKv) -> PlanOut {
        let g = self.graph;
        let qr = r.q.expect("rope_follows_qkv checked the rope of Q");
        let (tq, tsk) = (g.get(qr), g.get(r.set_k));
        let norm = out.variant.mat_vec_q().is_some_and(|k| k.norm);
        out.variant = qkv_rope_variant(out.variant, tsk.dtype);
        out.bind[0] = ops::Bind::whole(qr);
        out.bind[4] = ops::Bind::whole(r.set_k);
        if !norm {
            out.bind[ops::NORM_W_BINDING] = out.bind[0];
        }
        out.bind[7] = ops::Bind::whole(r.set_v);
        out.bind
            .extend([tq.src[1], tsk.src[2]].map(ops::Bind::whole));
        out.params.desc[4] = desc(tsk);
        out.params.g[0] = r.params.freq_base.log2();
        out.params.g[1] = r.params.freq_scale;
        out.params.h[2] = r.params.n_dims as u32;
        out.params.h[3] = g.get(r.k).ne[0] as u32;
        out
    }

    /// Whether the step between a block's projections and its attention, `r`, is in the form
    /// the fused rope dispatch (KV) runs: f32 rows, F16 or F32 caches of one shape and layout,
    /// one I32 or I64 row index a token, and the outputs apart from what they are made from;
    /// with frequency factors, also the rope of Q, Q and its result contiguous (the factors'
    /// offset takes the place of their strides) and an adapter that binds
    /// [`crate::shader::ROPE_KV_FACTORS_BINDINGS`] storage buffers.
    fn rope_kv_fits(&self, r: &RopeKv) -> bool {
        let g = self.graph;
        // The rope dispatch reads the heads as they are: Q/K norms before it keep their own
        // dispatches.
        if r.norms.is_some() {
            return false;
        }
        if let Some(f) = r.factors {
            let limit = self.gpu.limits.max_storage_buffers_per_shader_stage as usize;
            let Some(q) = r.q else {
                return false;
            };
            let (tq, qs) = (g.get(q), g.get(g.get(q).src[0]));
            if limit < crate::shader::ROPE_KV_FACTORS_BINDINGS
                || !tq.is_contiguous()
                || !qs.is_contiguous()
                || [q, r.set_k, r.set_v]
                    .iter()
                    .any(|&w| !self.apart(w, f, false))
            {
                return false;
            }
        }
        let (k, sk, sv) = (r.k, r.set_k, r.set_v);
        let (tk, tsk, tsv) = (g.get(k), g.get(sk), g.get(sv));
        let (rows, kc, idx) = (tsk.src[1], tsk.src[0], tsk.src[2]);
        let (v, vc) = (tsv.src[1], tsv.src[0]);
        let (tr, tkc, ti, tv, tvc) = (g.get(rows), g.get(kc), g.get(idx), g.get(v), g.get(vc));
        let tokens = tk.ne[2];
        let fits = tk.dtype == DType::F32
            && g.get(tk.src[0]).dtype == DType::F32
            && tk.ne[3] == 1
            && tr.ne == [tk.ne[0] * tk.ne[1], tokens, 1, 1]
            && matches!(tkc.dtype, DType::F16 | DType::F32)
            && tkc.ne[0] == tr.ne[0]
            && tkc.ne[2] == 1
            && tkc.ne[3] == 1
            && matches!(ti.dtype, DType::I32 | DType::I64)
            && ti.ne[0] == tokens
            && ti.nelements() == tokens
            && tv.dtype == DType::F32
            && tv.ne == [tvc.ne[0], tokens, 1, 1]
            && tvc.dtype == tkc.dtype
            && tvc.ne == tkc.ne
            && tvc.nb == tkc.nb
            && tsk.ne == tkc.ne
            && tsv.ne == tvc.ne
            && self.apart(sk, tk.src[0], false)
            && self.apart(sk, v, false)
            && self.apart(sv, tk.src[0], false)
            && self.apart(sv, v, false)
            && self.apart(sk, sv, false);
        fits && r.q.is_none_or(|q| {
            let (tq, qs) = (g.get(q), g.get(g.get(q).src[0]));
            tq.dtype == DType::F32
                && qs.dtype == DType::F32
                && tq.ne[0] == tk.ne[0]
                && tq.ne[2] == tokens
                && tq.ne[3] == 1
                && tq.nb[0] == 4
                && qs.nb[0] == 4
                && self.apart(q, tq.src[0], true)
                && [tk.src[0], v, sk, sv]
                    .iter()
                    .all(|&o| self.apart(q, o, false))
        })
    }

    /// `rope(k)`, `set_rows(k_cache, reshape(rope(k)), idx)`, `set_rows(v_cache, v, idx)`,
    /// and `rope(q)` where it comes right before `rope(k)`: one rope dispatch (KV) that writes
    /// both caches (and the rotated Q).
    fn rope_kv(&self, r: &RopeKv) -> Result<Option<Vec<Launch>>> {
        let g = self.graph;
        if !self.rope_kv_fits(r) {
            return Ok(None);
        }
        let (q, k, sk, sv, rp) = (r.q, r.k, r.set_k, r.set_v, r.params);
        let (tk, tsk, tsv) = (g.get(k), g.get(sk), g.get(sv));
        let (idx, v, tokens) = (tsk.src[2], tsv.src[1], tk.ne[2]);
        let (ti, tv, tkc) = (g.get(idx), g.get(v), g.get(tsk.src[0]));
        let Some(mut out) = self.single_plan(k) else {
            return Ok(None);
        };
        let per_row = rp.n_dims / 2 + tk.ne[0] - rp.n_dims;
        let q_count = q.map_or(0, |q| per_row * g.get(q).ne[1] * tokens);
        let count = (out.params.u[0] as usize + q_count + tv.nelements()).min(u32::MAX as usize);
        // The rope's plan set the blend's parameters where the rotation is not the plain one.
        out.variant = Variant::new(ops::rope_kv_key(
            tkc.dtype,
            !rp.is_plain(),
            r.factors.is_some(),
        ));
        out.params.u[0] = count as u32;
        out.params.desc[0] = desc(g.get(sk));
        out.params.desc[3] = desc(ti);
        out.params.desc[4] = desc(tv);
        out.groups = count.div_ceil(out.variant.key.workgroup_size() as usize);
        out.bind = [sk, tk.src[0], tk.src[1], idx, v, sv]
            .map(ops::Bind::whole)
            .to_vec();
        if let Some(q) = q {
            let (tq, qs) = (g.get(q), g.get(g.get(q).src[0]));
            out.params.u[3] = tq.ne[1] as u32;
            out.params.h = [qs.nb[1], qs.nb[2], tq.nb[1], tq.nb[2]].map(|b| b as u32);
            out.bind.push(ops::Bind::whole(tq.src[0]));
            out.bind.push(ops::Bind::whole(q));
        }
        // The factors' binding (rope_kv_fits checked Q's rope is there): its offset replaces
        // h.x, Q's strides, which the shader then derives from Q's contiguous shape.
        out.bind.extend(r.factors.map(ops::Bind::whole));
        Ok(Some(vec![ops::to_launch(self.gpu, g, sk, out)?]))
    }
}

/// The QKV mat-vec variant `v` with the rope of Q and K and the stores of K and V into caches
/// of type `cache` (F16 or F32) fused in (ROPE in `shaders/mat_vec_q.wgsl`).
pub(crate) fn qkv_rope_variant(v: Variant, cache: DType) -> Variant {
    v.with_mat_vec_q(|k| k.rope = Some(cache))
}

/// The cooperative-matrix mat-mat variant `v` over two weight matrices in one binding (MMPAIR
/// in `shaders/mat_mat_coop.wgsl`).
pub(crate) fn mat_mat_pair_variant(mut v: Variant) -> Variant {
    if let Key::MatMat(k) = &mut v.key {
        k.pair = true;
    }
    v
}

/// An integer-dot mat-vec variant that also multiplies a second weight matrix in src2, read
/// as src0 is (W2, B4 = A4), and stores `silu(first) * second` (`glu`: GLU, the fused gate, up
/// and swiglu) or both products (PAIR).
pub(crate) fn second_matrix_variant(v: Variant, glu: Option<GluOp>) -> Variant {
    v.with_mat_vec_q(|k| k.second = Some(SecondMatrix { glu }))
}
