//! Fusion: the groups of nodes that one kernel can compute, found once, on the graph.
//!
//! A backend that fuses asks a [`Matcher`] at each node it is about to run for the groups that
//! start there ([`Matcher::candidates`]), most ambitious first, and takes the first one it has
//! a kernel for ([`Matcher::fuse_at`]). The matcher knows only the graph: which ops feed
//! which, in what order the nodes run, and which intermediate results nothing else reads. What
//! a backend's kernels can take (types, layouts, alignment, memory that must not overlap,
//! adapter limits) is the backend's to check when it is offered a group; a group it declines
//! costs nothing, and the next candidate is offered. So a new pattern (a GELU-gated FFN, a
//! post-norm, a Q/K norm, a bias add) is one new [`Group`] variant here, plus the kernels of
//! the backends that want it.
//!
//! The rules every group keeps:
//! - Its nodes run one after another: between two of them only nodes that run nothing (leaves
//!   and views) may stand, looking at most [`WINDOW`] nodes ahead. A backend that takes a group
//!   skips every node up to [`Group::last`].
//! - Every intermediate result (one that the group computes and does not hand on) is read by
//!   the group alone and is not a graph output, so no kernel of the backend has to write it.
//! - A fused result equals the unfused ops' result up to float rounding: the conformance cases
//!   of each group check that on every backend.

use crate::graph::Graph;
use crate::op::{BinaryOp, GluOp, Op, RopeParams};
use crate::tensor::TensorId;

mod moe;
pub use moe::{MoeRouter, MoeWeightedSum, RouterNorm};

/// How many nodes ahead the matcher looks for the next node of a group (past leaves and views).
pub const WINDOW: usize = 8;

/// `rms_norm(x) * w`: the norm and the product right after it (a block's input norm).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RmsNormMul {
    /// The rms_norm node (read by the mul alone).
    pub norm: TensorId,
    /// The mul node: the group's result.
    pub mul: TensorId,
    /// The rows normalized.
    pub x: TensorId,
    /// The weights multiplied in (the mul's second operand).
    pub w: TensorId,
    /// The norm's epsilon.
    pub eps: f32,
    /// The node index of the mul.
    pub last: usize,
}

/// `r + W x`: a mul_mat and the add of a residual right after it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MulMatAdd {
    /// The mul_mat node (read by the add alone).
    pub mul_mat: TensorId,
    /// The add node: the group's result.
    pub add: TensorId,
    /// The add's other operand.
    pub residual: TensorId,
    /// The node index of the add.
    pub last: usize,
}

/// `glu(W_gate x, W_up x)`: two mul_mats of one vector and the gated activation of their
/// results (a block's gate/up projections and SwiGLU or GeGLU).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GluMulMats {
    /// The gate's mul_mat (read by the glu alone).
    pub gate: TensorId,
    /// The up projection's mul_mat (read by the glu alone).
    pub up: TensorId,
    /// The glu node: the group's result.
    pub glu: TensorId,
    /// The activation.
    pub op: GluOp,
    /// The vector both multiply.
    pub x: TensorId,
    /// The node index of the glu.
    pub last: usize,
}

/// `glu(mul_mat_id(W_gate, x, ids), mul_mat_id(W_up, x, ids))`: the gate and up projections
/// of the experts a router picked (a MoE layer's) and their gated activation (SwiGLU or GeGLU).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GluMulMatIds {
    /// The gate's mul_mat_id (read by the glu alone).
    pub gate: TensorId,
    /// The up projection's mul_mat_id (read by the glu alone; the same rows, ids and first
    /// expert as the gate's).
    pub up: TensorId,
    /// The glu node: the group's result.
    pub glu: TensorId,
    /// The activation.
    pub op: GluOp,
    /// The rows both multiply.
    pub x: TensorId,
    /// The expert ids both read.
    pub ids: TensorId,
    /// The node index of the glu.
    pub last: usize,
}

/// Two or three mul_mats of the same vector, one right after another (a block's Q, K and V;
/// or K and V; or gate and up of a prompt), optionally followed by the rope and cache stores
/// of Q, K and V ([`RopeKv`]) where three products feed exactly those.
#[derive(Clone, Debug, PartialEq)]
pub struct MulMats {
    /// The mul_mat nodes, in the order they run (2 or 3).
    pub mats: Vec<TensorId>,
    /// The vector (or activations) they all multiply.
    pub x: TensorId,
    /// Whether one more mul_mat of the same vector runs right after the last.
    pub more_follow: bool,
    /// The rope and cache stores of the three products, which read them alone (each straight
    /// or through a reshape read by nothing else): the group then ends with those.
    pub rope_kv: Option<RopeKv>,
    /// The node index of the group's last node (the last mul_mat, or the rope_kv's last).
    pub last: usize,
}

/// The step between a block's projections and its attention: `rope(k)` and the stores of the
/// rotated K and of V into their caches at the same rows, with `rope(q)` where it comes right
/// before `rope(k)` with the same positions and parameters.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RopeKv {
    /// The rope of Q (its result is what attention reads), where it comes right before K's.
    pub q: Option<TensorId>,
    /// The rope of K (read by the reshape alone).
    pub k: TensorId,
    /// The set_rows of the rotated K (its source: a reshape of `k` read by it alone).
    pub set_k: TensorId,
    /// The set_rows of V at the same rows.
    pub set_v: TensorId,
    /// The rope's parameters.
    pub params: RopeParams,
    /// The ropes' frequency factors (their third source), where they have them.
    pub factors: Option<TensorId>,
    /// The per-head norms of Q and K that the ropes read, where the group starts with them.
    pub norms: Option<QkNorms>,
    /// The node index of the set_rows of V.
    pub last: usize,
}

/// `rms_norm(q) * wq` and `rms_norm(k) * wk` over each head's row, right before the ropes of a
/// [`RopeKv`] that read them alone (Qwen 3's and Gemma 3's Q/K norms): the group then starts at
/// the norm of Q, and the ropes rotate the normed rows.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct QkNorms {
    /// The norm of Q's heads and its product with weights.
    pub q: RmsNormMul,
    /// The norm of K's heads and its product with weights (the same epsilon as Q's).
    pub k: RmsNormMul,
}

/// `set_rows(cache, reshape(rope(k)), idx)`: the rotated K stored straight into its cache.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RopeSetRows {
    /// The rope (read by the reshape alone).
    pub rope: TensorId,
    /// The rope's frequency factors (its third source), where it has them.
    pub factors: Option<TensorId>,
    /// The set_rows (its source: a reshape of the rope read by it alone).
    pub set: TensorId,
    /// The node index of the set_rows.
    pub last: usize,
}

/// `all_reduce(x) + r`, and optionally `rms_norm(all_reduce(x) + r) * w` after it, in a part
/// graph of a meta device (the residual add and the next block's norm after a sharded
/// projection).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AllReduceAdd {
    /// The all_reduce node (it sums `x` in place; nothing reads the node).
    pub reduce: TensorId,
    /// The summed tensor, read by the all_reduce and the add alone.
    pub x: TensorId,
    /// The add node.
    pub add: TensorId,
    /// The add's other operand.
    pub residual: TensorId,
    /// The norm of the sum and its product with weights, where they follow.
    pub norm: Option<RmsNormMul>,
    /// The node index of the group's last node.
    pub last: usize,
}

/// `W reshape(flash_attn_ext(..))`: attention whose result, through a reshape, is read next
/// by a mul_mat (a block's output projection). The group is the attention node alone: a
/// backend may write the result in the form the mul_mat reads best.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AttnMulMat {
    /// The flash_attn_ext node.
    pub attn: TensorId,
    /// The reshape of its result.
    pub reshape: TensorId,
    /// The mul_mat by the reshape.
    pub mul_mat: TensorId,
    /// The node index of the attention (the group's only node).
    pub last: usize,
}

/// `rms_norm(x) * w + r`: a norm applied to a block's branch output before it joins the
/// residual (Gemma's post-attention and post-feed-forward norms).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RmsNormMulAdd {
    /// The norm and its product with weights (the product read by the add alone).
    pub norm: RmsNormMul,
    /// The add node: the group's result.
    pub add: TensorId,
    /// The add's other operand.
    pub residual: TensorId,
    /// The node index of the add.
    pub last: usize,
}

/// A group of nodes that one kernel can compute (see the module's rules).
#[derive(Clone, Debug, PartialEq)]
pub enum Group {
    /// See [`RmsNormMul`].
    RmsNormMul(RmsNormMul),
    /// See [`RmsNormMulAdd`].
    RmsNormMulAdd(RmsNormMulAdd),
    /// See [`MulMatAdd`].
    MulMatAdd(MulMatAdd),
    /// See [`GluMulMats`].
    GluMulMats(GluMulMats),
    /// See [`GluMulMatIds`].
    GluMulMatIds(GluMulMatIds),
    /// See [`MulMats`].
    MulMats(MulMats),
    /// See [`RopeKv`].
    RopeKv(RopeKv),
    /// See [`RopeSetRows`].
    RopeSetRows(RopeSetRows),
    /// See [`AllReduceAdd`].
    AllReduceAdd(AllReduceAdd),
    /// See [`AttnMulMat`].
    AttnMulMat(AttnMulMat),
    /// See [`MoeRouter`].
    MoeRouter(MoeRouter),
    /// See [`MoeWeightedSum`].
    MoeWeightedSum(MoeWeightedSum),
}

impl Group {
    /// The node index of the group's last node: a backend that takes the group goes on after it.
    pub fn last(&self) -> usize {
        match self {
            Group::RmsNormMul(g) => g.last,
            Group::RmsNormMulAdd(g) => g.last,
            Group::MulMatAdd(g) => g.last,
            Group::GluMulMats(g) => g.last,
            Group::GluMulMatIds(g) => g.last,
            Group::MulMats(g) => g.last,
            Group::RopeKv(g) => g.last,
            Group::RopeSetRows(g) => g.last,
            Group::AllReduceAdd(g) => g.last,
            Group::AttnMulMat(g) => g.last,
            Group::MoeRouter(g) => g.last,
            Group::MoeWeightedSum(g) => g.last,
        }
    }

    /// The group's name, for logs and tests.
    pub fn name(&self) -> &'static str {
        match self {
            Group::RmsNormMul(_) => "rms_norm_mul",
            Group::RmsNormMulAdd(_) => "rms_norm_mul_add",
            Group::MulMatAdd(_) => "mul_mat_add",
            Group::GluMulMats(_) => "glu_mul_mats",
            Group::GluMulMatIds(_) => "glu_mul_mat_ids",
            Group::MulMats(g) if g.rope_kv.is_some_and(|r| r.norms.is_some()) => {
                "mul_mats_qk_norm_rope_kv"
            }
            Group::MulMats(g) if g.rope_kv.is_some() => "mul_mats_rope_kv",
            Group::MulMats(_) => "mul_mats",
            Group::RopeKv(g) if g.norms.is_some() => "qk_norm_rope_kv",
            Group::RopeKv(_) => "rope_kv",
            Group::RopeSetRows(_) => "rope_set_rows",
            Group::AllReduceAdd(g) if g.norm.is_some() => "all_reduce_add_norm",
            Group::AllReduceAdd(_) => "all_reduce_add",
            Group::AttnMulMat(_) => "attn_mul_mat",
            Group::MoeRouter(_) => "moe_router",
            Group::MoeWeightedSum(g) if g.residual.is_some() => "moe_weighted_sum_add",
            Group::MoeWeightedSum(_) => "moe_weighted_sum",
        }
    }
}

/// Finds the groups of a graph's nodes (see the module's documentation).
pub struct Matcher<'g> {
    graph: &'g Graph,
    nodes: &'g [TensorId],
    uses: Vec<u32>,
}

impl<'g> Matcher<'g> {
    /// A matcher over `nodes` (in the order they run) of `graph`.
    pub fn new(graph: &'g Graph, nodes: &'g [TensorId]) -> Self {
        Matcher {
            graph,
            nodes,
            uses: graph.reader_counts(),
        }
    }

    /// The graph.
    pub fn graph(&self) -> &'g Graph {
        self.graph
    }

    /// The nodes, in the order they run.
    pub fn nodes(&self) -> &'g [TensorId] {
        self.nodes
    }

    /// How many readers each tensor has, by index, a graph output counting as one
    /// ([`Graph::reader_counts`]).
    pub fn uses(&self) -> &[u32] {
        &self.uses
    }

    /// Whether `id` has exactly one reader and is no graph output.
    pub fn single_use(&self, id: TensorId) -> bool {
        self.uses[id.index()] == 1
    }

    /// The next node from `nodes[j]` on that runs something (past leaves and views, at most
    /// [`WINDOW`] ahead), with its index.
    pub fn next_running(&self, j: usize) -> Option<(usize, TensorId)> {
        self.graph.next_computed(self.nodes, j, WINDOW)
    }

    /// Offers the groups that start at `nodes[i]` to `take`, most ambitious first, until it
    /// takes one (returns `Ok(true)`): the number of nodes that group stands for, or `None`
    /// when none was taken.
    pub fn fuse_at<E>(
        &self,
        i: usize,
        mut take: impl FnMut(&Group) -> Result<bool, E>,
    ) -> Result<Option<usize>, E> {
        for g in self.candidates(i) {
            if take(&g)? {
                return Ok(Some(g.last() + 1 - i));
            }
        }
        Ok(None)
    }

    /// Every group that starts at `nodes[i]`, most ambitious first.
    pub fn candidates(&self, i: usize) -> Vec<Group> {
        let mut out = Vec::new();
        let Some(&id) = self.nodes.get(i) else {
            return out;
        };
        match self.graph.get(id).op {
            Op::RmsNorm { .. } => {
                out.extend(self.qk_norm_rope_kv(i).map(Group::RopeKv));
                if let Some(n) = self.rms_norm_mul(i) {
                    out.extend(self.rms_norm_mul_add(n).map(Group::RmsNormMulAdd));
                    out.push(Group::RmsNormMul(n));
                }
            }
            Op::MulMat => {
                out.extend(self.glu_mul_mats(i).map(Group::GluMulMats));
                out.extend(self.mul_mat_add(i).map(Group::MulMatAdd));
                out.extend(self.mul_mats(i).into_iter().map(Group::MulMats));
            }
            Op::MulMatId { .. } => out.extend(self.glu_mul_mat_ids(i).map(Group::GluMulMatIds)),
            Op::Rope(_) => {
                out.extend(self.rope_kv(i).into_iter().map(Group::RopeKv));
                out.extend(self.rope_set_rows(i).map(Group::RopeSetRows));
            }
            Op::AllReduce => {
                out.extend(self.all_reduce_add(i).into_iter().map(Group::AllReduceAdd))
            }
            Op::FlashAttnExt { .. } => out.extend(self.attn_mul_mat(i).map(Group::AttnMulMat)),
            Op::SoftMax { .. } | Op::TopK(_) => {
                out.extend(self.moe_router(i).map(Group::MoeRouter))
            }
            Op::Binary(BinaryOp::Mul) => out.extend(
                self.moe_weighted_sum(i)
                    .into_iter()
                    .map(Group::MoeWeightedSum),
            ),
            _ => {}
        }
        out
    }

    /// `rms_norm(x) * w` at `nodes[i]`.
    fn rms_norm_mul(&self, i: usize) -> Option<RmsNormMul> {
        let g = self.graph;
        let norm = self.nodes[i];
        let tn = g.get(norm);
        let Op::RmsNorm { eps } = tn.op else {
            return None;
        };
        if !self.single_use(norm) {
            return None;
        }
        let (last, mul) = self.next_running(i + 1)?;
        let tm = g.get(mul);
        if tm.op != Op::Binary(BinaryOp::Mul) || tm.src.len() != 2 || tm.src[0] != norm {
            return None;
        }
        Some(RmsNormMul {
            norm,
            mul,
            x: tn.src[0],
            w: tm.src[1],
            eps,
            last,
        })
    }

    /// `rms_norm(x) * w + r` (or `r + ...`) continuing the norm group `n`.
    fn rms_norm_mul_add(&self, n: RmsNormMul) -> Option<RmsNormMulAdd> {
        let g = self.graph;
        if !self.single_use(n.mul) {
            return None;
        }
        let (last, add) = self.next_running(n.last + 1)?;
        let ta = g.get(add);
        if ta.op != Op::Binary(BinaryOp::Add) || ta.src.len() != 2 {
            return None;
        }
        let residual = match (ta.src[0] == n.mul, ta.src[1] == n.mul) {
            (true, false) => ta.src[1],
            (false, true) => ta.src[0],
            _ => return None,
        };
        Some(RmsNormMulAdd {
            norm: n,
            add,
            residual,
            last,
        })
    }

    /// `r + W x` at `nodes[i]`.
    fn mul_mat_add(&self, i: usize) -> Option<MulMatAdd> {
        let g = self.graph;
        let mul_mat = self.nodes[i];
        if g.get(mul_mat).op != Op::MulMat || !self.single_use(mul_mat) {
            return None;
        }
        let (last, add) = self.next_running(i + 1)?;
        let ta = g.get(add);
        if ta.op != Op::Binary(BinaryOp::Add) || ta.src.len() != 2 {
            return None;
        }
        let residual = match (ta.src[0] == mul_mat, ta.src[1] == mul_mat) {
            (true, false) => ta.src[1],
            (false, true) => ta.src[0],
            _ => return None,
        };
        Some(MulMatAdd {
            mul_mat,
            add,
            residual,
            last,
        })
    }

    /// `glu(a, b)` of the two nodes from `nodes[i]` on, in either order, both read by the glu
    /// alone: (gate, up, glu, activation, the glu's node index).
    fn glu_pair(&self, i: usize) -> Option<(TensorId, TensorId, TensorId, GluOp, usize)> {
        let g = self.graph;
        let a = self.nodes[i];
        let (jb, b) = self.next_running(i + 1)?;
        let (last, glu) = self.next_running(jb + 1)?;
        let tg = g.get(glu);
        let Op::Glu { op, swapped: false } = tg.op else {
            return None;
        };
        if tg.src.len() != 2 {
            return None;
        }
        let (gate, up) = (tg.src[0], tg.src[1]);
        let pair = (gate == a && up == b) || (gate == b && up == a);
        (pair && self.single_use(gate) && self.single_use(up)).then_some((gate, up, glu, op, last))
    }

    /// `glu(W_gate x, W_up x)` at `nodes[i]` (the two mul_mats in either order).
    fn glu_mul_mats(&self, i: usize) -> Option<GluMulMats> {
        let g = self.graph;
        let (gate, up, glu, op, last) = self.glu_pair(i)?;
        let (tga, tup) = (g.get(gate), g.get(up));
        let fits = tga.op == Op::MulMat && tup.op == Op::MulMat && tga.src[1] == tup.src[1];
        fits.then_some(GluMulMats {
            gate,
            up,
            glu,
            op,
            x: tga.src[1],
            last,
        })
    }

    /// `glu(mul_mat_id(W_gate, x, ids), mul_mat_id(W_up, x, ids))` at `nodes[i]` (the two
    /// mul_mat_ids in either order, of the same rows, ids and first expert).
    fn glu_mul_mat_ids(&self, i: usize) -> Option<GluMulMatIds> {
        let g = self.graph;
        let (gate, up, glu, op, last) = self.glu_pair(i)?;
        let (tga, tup) = (g.get(gate), g.get(up));
        let fits = matches!(tga.op, Op::MulMatId { .. })
            && tup.op == tga.op
            && tga.src[1..] == tup.src[1..];
        fits.then_some(GluMulMatIds {
            gate,
            up,
            glu,
            op,
            x: tga.src[1],
            ids: tga.src[2],
            last,
        })
    }

    /// The runs of mul_mats of one vector at `nodes[i]`: three with their rope and cache
    /// stores, three, then the first two.
    fn mul_mats(&self, i: usize) -> Vec<MulMats> {
        let g = self.graph;
        let first = self.nodes[i];
        let x = g.get(first).src[1];
        let by_x = |n: TensorId| {
            let t = g.get(n);
            t.op == Op::MulMat && t.src[1] == x
        };
        let mut run = vec![(i, first)];
        while run.len() < 3 {
            match self.next_running(run[run.len() - 1].0 + 1) {
                Some((j, n)) if by_x(n) => run.push((j, n)),
                _ => break,
            }
        }
        let follows = |j: usize| self.next_running(j + 1).is_some_and(|(_, n)| by_x(n));
        let mut out = Vec::new();
        if run.len() == 3 {
            let mats: Vec<TensorId> = run.iter().map(|&(_, n)| n).collect();
            let last = run[2].0;
            let rope_kv = self
                .next_running(last + 1)
                .and_then(|(j, _)| self.qk_norm_rope_kv(j).or_else(|| self.rope_kv_at(j, true)))
                .filter(|r| self.takes_qkv(r, [mats[0], mats[1], mats[2]]));
            if let Some(r) = rope_kv {
                out.push(MulMats {
                    mats: mats.clone(),
                    x,
                    more_follow: false,
                    rope_kv: Some(r),
                    last: r.last,
                });
            }
            out.push(MulMats {
                mats,
                x,
                more_follow: follows(last),
                rope_kv: None,
                last,
            });
        }
        if run.len() >= 2 {
            out.push(MulMats {
                mats: vec![run[0].1, run[1].1],
                x,
                more_follow: run.len() == 3,
                rope_kv: None,
                last: run[1].0,
            });
        }
        out
    }

    /// Whether the rope and cache stores `r` read the products `qkv` alone (each straight or
    /// through a reshape read by nothing else), with the rope of Q included.
    fn takes_qkv(&self, r: &RopeKv, qkv: [TensorId; 3]) -> bool {
        let g = self.graph;
        let Some(q) = r.q else {
            return false;
        };
        let takes = |t: TensorId, of: TensorId| {
            self.single_use(of)
                && (t == of
                    || (g.get(t).op == Op::Reshape && g.get(t).src[0] == of && self.single_use(t)))
        };
        let (q_in, k_in) = match r.norms {
            Some(n) => (n.q.x, n.k.x),
            None => (g.get(q).src[0], g.get(r.k).src[0]),
        };
        takes(q_in, qkv[0]) && takes(k_in, qkv[1]) && takes(g.get(r.set_v).src[1], qkv[2])
    }

    /// The rope_kv steps at `nodes[i]`: with the rope of Q where it is there, then without it
    /// (the rope at `i` taken as K's).
    fn rope_kv(&self, i: usize) -> Vec<RopeKv> {
        [true, false]
            .into_iter()
            .filter_map(|with_q| self.rope_kv_at(i, with_q))
            .collect()
    }

    /// The rope_kv step at `nodes[i]`, the rope there being Q's (`with_q`) or K's.
    fn rope_kv_at(&self, i: usize, with_q: bool) -> Option<RopeKv> {
        let g = self.graph;
        let first = self.nodes[i];
        let tf = g.get(first);
        let Op::Rope(params) = tf.op else {
            return None;
        };
        let (q, jk, k) = if with_q {
            let (j, k) = self.next_running(i + 1)?;
            // Same parameters, positions and factors.
            let tk = g.get(k);
            if tk.op != tf.op || tk.src[1..] != tf.src[1..] {
                return None;
            }
            (Some(first), j, k)
        } else {
            (None, i, first)
        };
        let (jsk, set_k) = self.next_running(jk + 1)?;
        if !self.stores_rotated(set_k, k) {
            return None;
        }
        let (last, set_v) = self.next_running(jsk + 1)?;
        let tsv = g.get(set_v);
        if tsv.op != Op::SetRows || tsv.src[2] != g.get(set_k).src[2] {
            return None;
        }
        Some(RopeKv {
            q,
            k,
            set_k,
            set_v,
            params,
            factors: tf.src.get(2).copied(),
            norms: None,
            last,
        })
    }

    /// The rope_kv step with the norms of Q's and K's heads before it ([`QkNorms`]) at
    /// `nodes[i]`: `rms_norm(q) * wq`, `rms_norm(k) * wk`, then a rope_kv step (with the rope
    /// of Q) whose ropes read those products alone.
    fn qk_norm_rope_kv(&self, i: usize) -> Option<RopeKv> {
        let g = self.graph;
        let q = self.rms_norm_mul(i)?;
        let (jk, _) = self.next_running(q.last + 1)?;
        let k = self.rms_norm_mul(jk)?;
        let (jr, _) = self.next_running(k.last + 1)?;
        let r = self.rope_kv_at(jr, true)?;
        let reads =
            |rope: TensorId, n: &RmsNormMul| g.get(rope).src[0] == n.mul && self.single_use(n.mul);
        let fits = k.eps == q.eps && r.q.is_some_and(|rq| reads(rq, &q)) && reads(r.k, &k);
        fits.then_some(RopeKv {
            norms: Some(QkNorms { q, k }),
            ..r
        })
    }

    /// Whether node `s` is a set_rows of a reshape of the rope `k`, the reshape read by it
    /// alone and `k` by the reshape alone.
    fn stores_rotated(&self, s: TensorId, k: TensorId) -> bool {
        let g = self.graph;
        let ts = g.get(s);
        if ts.op != Op::SetRows || !self.single_use(k) {
            return false;
        }
        let rows = ts.src[1];
        let tr = g.get(rows);
        tr.op == Op::Reshape && tr.src[0] == k && self.single_use(rows)
    }

    /// `set_rows(cache, reshape(rope(k)), idx)` at `nodes[i]`.
    fn rope_set_rows(&self, i: usize) -> Option<RopeSetRows> {
        let rope = self.nodes[i];
        let tr = self.graph.get(rope);
        if !matches!(tr.op, Op::Rope(_)) {
            return None;
        }
        let factors = tr.src.get(2).copied();
        let (last, set) = self.next_running(i + 1)?;
        self.stores_rotated(set, rope).then_some(RopeSetRows {
            rope,
            factors,
            set,
            last,
        })
    }

    /// `all_reduce(x) + r` at `nodes[i]`, with the norm after it and then without.
    fn all_reduce_add(&self, i: usize) -> Vec<AllReduceAdd> {
        let g = self.graph;
        let reduce = self.nodes[i];
        let tr = g.get(reduce);
        let mut out = Vec::new();
        if tr.op != Op::AllReduce {
            return out;
        }
        let x = tr.src[0];
        let Some((ja, add)) = self.next_running(i + 1) else {
            return out;
        };
        let ta = g.get(add);
        let fits = ta.op == Op::Binary(BinaryOp::Add)
            && ta.src.len() == 2
            && ta.src.contains(&x)
            && ta.src[0] != ta.src[1]
            && self.uses[x.index()] == 2
            && self.uses[reduce.index()] == 0;
        if !fits {
            return out;
        }
        let residual = if ta.src[0] == x { ta.src[1] } else { ta.src[0] };
        let plain = AllReduceAdd {
            reduce,
            x,
            add,
            residual,
            norm: None,
            last: ja,
        };
        let norm = self
            .next_running(ja + 1)
            .and_then(|(j, n)| (g.get(n).src.first() == Some(&add)).then_some(j))
            .and_then(|j| self.rms_norm_mul(j));
        if let Some(n) = norm {
            out.push(AllReduceAdd {
                norm: Some(n),
                last: n.last,
                ..plain
            });
        }
        out.push(plain);
        out
    }

    /// `W reshape(flash_attn_ext(..))` at `nodes[i]`.
    fn attn_mul_mat(&self, i: usize) -> Option<AttnMulMat> {
        let g = self.graph;
        let attn = self.nodes[i];
        let (_, mul_mat) = self.next_running(i + 1)?;
        let tm = g.get(mul_mat);
        if tm.op != Op::MulMat {
            return None;
        }
        let reshape = tm.src[1];
        let tr = g.get(reshape);
        (tr.op == Op::Reshape && tr.src[0] == attn).then_some(AttnMulMat {
            attn,
            reshape,
            mul_mat,
            last: i,
        })
    }
}

#[cfg(test)]
mod tests;
