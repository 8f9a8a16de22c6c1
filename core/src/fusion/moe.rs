//! The groups of a mixture-of-experts layer's router and of the sum of its experts' outputs.

use super::Matcher;
use crate::dtype::DType;
use crate::graph::Graph;
use crate::op::{BinaryOp, Op};
use crate::tensor::TensorId;

/// How a router normalizes the scores of the experts it selected into their weights.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum RouterNorm {
    /// The selected scores are the weights.
    None,
    /// `soft_max(s * scale)` over the selected scores (gpt-oss): the soft_max node.
    SoftMax {
        /// The soft_max node over the selected scores.
        node: TensorId,
        /// Its scale.
        scale: f32,
    },
    /// `s / clamp(sum(s), min, max)` (Mixtral, Qwen 3 MoE): the sum_rows, the clamp and the div.
    Sum {
        /// The sum_rows of the selected scores (read by the clamp alone).
        sum: TensorId,
        /// The clamp of the sum (read by the div alone).
        clamp: TensorId,
        /// The div: the weights.
        div: TensorId,
        /// The clamp's lower bound.
        min: f32,
        /// The clamp's upper bound.
        max: f32,
    },
}

/// A router's selection: from the experts' scores of each token (`soft_max(logits * scale)`
/// where the group starts with the soft_max, else the scores as they are) the `top_k` experts,
/// then their scores (`get_rows` of a reshape of the scores to `[1, n_expert, n]`) normalized as
/// [`RouterNorm`] says. The group hands on two results: the ids (the top_k node) and the weights
/// ([`MoeRouter::weights`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MoeRouter {
    /// The soft_max over all the experts' logits and its scale, where the group starts with it
    /// (its result is read by the top_k and the reshape alone).
    pub soft_max: Option<(TensorId, f32)>,
    /// What the group reads: the logits the soft_max reads, or the scores the top_k reads
    /// (`[n_expert, n]`).
    pub logits: TensorId,
    /// The top_k node: the selected ids (`[n_used, n]`, i32), read by what follows.
    pub top_k: TensorId,
    /// The get_rows of the selected scores.
    pub get_rows: TensorId,
    /// The normalization of the selected scores.
    pub norm: RouterNorm,
    /// The node that holds the weights (`n_used` values a token): the get_rows, the soft_max
    /// over the selected or the div.
    pub weights: TensorId,
    /// Experts selected per token.
    pub n_used: usize,
    /// The node index of the weights' node.
    pub last: usize,
}

impl MoeRouter {
    /// The experts and tokens `(n_expert, n)` of a router in the layout the backends' router
    /// kernels read: f32 scores `[n_expert, n]`, i32 ids `[n_used, n]` and f32 weights of
    /// `n_used` values a token; `None` for other types or shapes.
    pub fn f32_rows(&self, g: &Graph) -> Option<(usize, usize)> {
        let (tl, tk, tw) = (g.get(self.logits), g.get(self.top_k), g.get(self.weights));
        let n = tl.ne[1];
        let fits = tl.dtype == DType::F32
            && tk.dtype == DType::I32
            && tw.dtype == DType::F32
            && tl.ne[2] == 1
            && tl.ne[3] == 1
            && tk.ne == [self.n_used, n, 1, 1]
            && tw.nelements() == self.n_used * n;
        fits.then_some((tl.ne[0], n))
    }

    /// The group's settings as the backends' router kernels read them: the modes (whether a
    /// soft_max over all the experts comes first; the normalization: 0 none, 1 soft_max over
    /// the selected, 2 a division by the clamped sum) and the constants (the first soft_max's
    /// scale, the second's, the clamp's lower and upper bounds).
    pub fn kernel_settings(&self) -> ([u32; 2], [f32; 4]) {
        let (mut modes, mut consts) = ([0u32; 2], [0f32; 4]);
        if let Some((_, scale)) = self.soft_max {
            modes[0] = 1;
            consts[0] = scale;
        }
        match self.norm {
            RouterNorm::None => {}
            RouterNorm::SoftMax { scale, .. } => {
                modes[1] = 1;
                consts[1] = scale;
            }
            RouterNorm::Sum { min, max, .. } => {
                modes[1] = 2;
                consts[2] = min;
                consts[3] = max;
            }
        }
        (modes, consts)
    }
}

/// `sum_e w[e, t] * down[:, e, t]`: the experts' outputs `down` (`[d, n_used, n]`) weighted by
/// the router's weights `w` (`[1, n_used, n]`), then the chain of adds of the slots' views
/// (`view(e = 0) + view(1) + ... + view(n_used - 1)`, in that order); optionally followed by the
/// add of a residual.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MoeWeightedSum {
    /// The mul node (read by the slots' views alone).
    pub mul: TensorId,
    /// The experts' outputs.
    pub down: TensorId,
    /// The weights.
    pub weights: TensorId,
    /// The last add of the slots: the sum (`[d, n]`).
    pub sum: TensorId,
    /// The add of a residual to the sum (read by it alone) and the residual, where it follows.
    pub residual: Option<(TensorId, TensorId)>,
    /// The node the group writes: the residual add where there is one, else the sum.
    pub out: TensorId,
    /// Experts per token (at least 2).
    pub n_used: usize,
    /// The node index of `out`.
    pub last: usize,
}

impl Matcher<'_> {
    /// The router's selection at `nodes[i]` (its soft_max, or its top_k).
    pub(super) fn moe_router(&self, i: usize) -> Option<MoeRouter> {
        let g = self.graph;
        let first = self.nodes[i];
        let tf = g.get(first);
        let (soft_max, jt, top_k) = match tf.op {
            Op::SoftMax { scale, max_bias } if tf.src.len() == 1 && max_bias == 0.0 => {
                let (jt, top_k) = self.next_running(i + 1)?;
                let tk = g.get(top_k);
                if !matches!(tk.op, Op::TopK(_)) || tk.src[0] != first {
                    return None;
                }
                (Some((first, scale)), jt, top_k)
            }
            Op::TopK(_) => (None, i, first),
            _ => return None,
        };
        let Op::TopK(n_used) = g.get(top_k).op else {
            return None;
        };
        let scores = g.get(top_k).src[0];
        let ts = g.get(scores);
        let (jg, get_rows) = self.next_running(jt + 1)?;
        let tg = g.get(get_rows);
        if tg.op != Op::GetRows || tg.src[1] != top_k {
            return None;
        }
        let r = tg.src[0];
        let tr = g.get(r);
        let reshaped = tr.op == Op::Reshape
            && tr.src[0] == scores
            && tr.ne == [1, ts.ne[0], ts.ne[1], ts.ne[2]]
            && ts.ne[3] == 1
            && self.single_use(r);
        // The probabilities are the group's own: read by the top_k and the reshape alone.
        if !reshaped || (soft_max.is_some() && self.uses[scores.index()] != 2) {
            return None;
        }
        let logits = match soft_max {
            Some((s, _)) => g.get(s).src[0],
            None => scores,
        };
        let plain = MoeRouter {
            soft_max,
            logits,
            top_k,
            get_rows,
            norm: RouterNorm::None,
            weights: get_rows,
            n_used,
            last: jg,
        };
        Some(self.router_norm(plain).unwrap_or(plain))
    }

    /// The router `r` (ending at its get_rows) with the normalization that follows the
    /// get_rows, where one does: a soft_max or a sum_rows, clamp and div over a reshape of it
    /// to `[n_used, n]`.
    fn router_norm(&self, r: MoeRouter) -> Option<MoeRouter> {
        let g = self.graph;
        if !self.single_use(r.get_rows) {
            return None;
        }
        let (j, node) = self.next_running(r.last + 1)?;
        let tn = g.get(node);
        let w = *tn.src.first()?;
        let tw = g.get(w);
        let tg = g.get(r.get_rows);
        let flat = tw.op == Op::Reshape
            && tw.src[0] == r.get_rows
            && tw.ne == [tg.ne[1], tg.ne[2], tg.ne[3], 1];
        if !flat {
            return None;
        }
        match tn.op {
            Op::SoftMax { scale, max_bias }
                if tn.src.len() == 1 && max_bias == 0.0 && self.single_use(w) =>
            {
                Some(MoeRouter {
                    norm: RouterNorm::SoftMax { node, scale },
                    weights: node,
                    last: j,
                    ..r
                })
            }
            Op::SumRows if self.uses[w.index()] == 2 && self.single_use(node) => {
                let (jc, clamp) = self.next_running(j + 1)?;
                let tc = g.get(clamp);
                let Op::Clamp { min, max } = tc.op else {
                    return None;
                };
                if tc.src[0] != node || !self.single_use(clamp) {
                    return None;
                }
                let (jd, div) = self.next_running(jc + 1)?;
                let td = g.get(div);
                if td.op != Op::Binary(BinaryOp::Div) || td.src[..] != [w, clamp] {
                    return None;
                }
                Some(MoeRouter {
                    norm: RouterNorm::Sum {
                        sum: node,
                        clamp,
                        div,
                        min,
                        max,
                    },
                    weights: div,
                    last: jd,
                    ..r
                })
            }
            _ => None,
        }
    }

    /// The weighted sum of the experts' outputs at `nodes[i]` (the mul): with the residual add
    /// that follows, then without.
    pub(super) fn moe_weighted_sum(&self, i: usize) -> Vec<MoeWeightedSum> {
        let Some(plain) = self.weighted_sum_at(i) else {
            return Vec::new();
        };
        let g = self.graph;
        let residual = self
            .next_running(plain.last + 1)
            .filter(|_| self.single_use(plain.sum))
            .and_then(|(j, add)| {
                let ta = g.get(add);
                if ta.op != Op::Binary(BinaryOp::Add) || ta.src.len() != 2 {
                    return None;
                }
                let r = match (ta.src[0] == plain.sum, ta.src[1] == plain.sum) {
                    (true, false) => ta.src[1],
                    (false, true) => ta.src[0],
                    _ => return None,
                };
                Some(MoeWeightedSum {
                    residual: Some((add, r)),
                    out: add,
                    last: j,
                    ..plain
                })
            });
        residual.into_iter().chain([plain]).collect()
    }

    /// `mul(down, w)` at `nodes[i]` and the chain of adds of its slots' views after it.
    fn weighted_sum_at(&self, i: usize) -> Option<MoeWeightedSum> {
        let g = self.graph;
        let mul = self.nodes[i];
        let tm = g.get(mul);
        if tm.op != Op::Binary(BinaryOp::Mul) || tm.src.len() != 2 {
            return None;
        }
        let (down, weights) = (tm.src[0], tm.src[1]);
        let (td, tw) = (g.get(down), g.get(weights));
        let [d, n_used, n, one] = td.ne;
        let fits = one == 1
            && n_used >= 2
            && tw.ne == [1, n_used, n, 1]
            && tm.ne == td.ne
            && self.uses[mul.index()] as usize == n_used;
        if !fits {
            return None;
        }
        // The view of slot e: `[d, n]` rows of the mul's slot e.
        let slot = |v: TensorId, e: usize| {
            let tv = g.get(v);
            tv.op == Op::View
                && tv.src[0] == mul
                && tv.view_src == Some(mul)
                && tv.view_offset == e * tm.nb[1]
                && tv.ne == [d, n, 1, 1]
                && tv.nb[..2] == [tm.nb[0], tm.nb[2]]
                && self.single_use(v)
        };
        let (mut j, mut sum) = (i, TensorId(u32::MAX));
        for e in 1..n_used {
            let (ja, add) = self.next_running(j + 1)?;
            let ta = g.get(add);
            if ta.op != Op::Binary(BinaryOp::Add) || ta.src.len() != 2 {
                return None;
            }
            let chained = if e == 1 {
                slot(ta.src[0], 0)
            } else {
                ta.src[0] == sum && self.single_use(sum)
            };
            if !chained || !slot(ta.src[1], e) {
                return None;
            }
            (j, sum) = (ja, add);
        }
        Some(MoeWeightedSum {
            mul,
            down,
            weights,
            sum,
            residual: None,
            out: sum,
            n_used,
            last: j,
        })
    }
}

#[cfg(test)]
mod tests;
