//! Expert parallelism: the experts of a mixture-of-experts layer split whole over the parts
//! (each part's `*_exps` weights hold a run of experts: a split along axis 2), the router and
//! its choices mirrored.
//!
//! Every part runs `mul_mat_id` over the rows routed to the experts it holds and leaves the
//! others 0 (its node's `first` is the id of its first expert), so each row of the result is
//! computed on exactly one part and 0 on the others: the result is PARTIAL. That stays true
//! through what a MoE layer does next, without summing: a GLU of two such results of the same
//! routing is 0 where both are (silu(0) * 0 = gelu(0) * 0 = 0) and the part's own value where
//! they are not, the down projection's `mul_mat_id` reads its part's rows only, and the
//! weighting by the router's probabilities and the sum over the slots are linear. The layer's
//! output is then summed over the parts once, where the residual needs it: one all-reduce per
//! layer, as for a tensor-parallel feed-forward, and no expert's weights ever move.

use tessera_core::graph::Graph;
use tessera_core::op::Op;
use tessera_core::tensor::{Tensor, TensorId};

use crate::split::SplitState;

/// The axis of a `[k, m, n_expert]` expert weight that an expert split cuts.
pub(crate) const EXPERT_AXIS: usize = 2;

/// The ids that route node `id`'s rows when it is an expert product: a `mul_mat_id`, or a GLU
/// of two of one routing.
fn routing(g: &Graph, id: TensorId) -> Option<TensorId> {
    let t = g.get(id);
    match &t.op {
        Op::MulMatId { .. } => t.src.get(2).copied(),
        Op::Glu { .. } if t.src.len() == 2 => {
            let a = routing(g, t.src[0])?;
            (routing(g, t.src[1])? == a).then_some(a)
        }
        _ => None,
    }
}

/// Whether node `id`, with partial sources, keeps its result partial because they are expert
/// products (see the module's rules): a mul_mat_id over split experts of rows that are an
/// expert product of the same routing, or a GLU of two expert products of one routing.
pub(crate) fn keeps_partial(g: &Graph, id: TensorId, eff: &[SplitState]) -> bool {
    let t = g.get(id);
    let p = |i: usize| matches!(eff.get(i), Some(SplitState::Partial));
    match &t.op {
        Op::MulMatId { .. } => {
            let experts_split = eff
                .first()
                .and_then(SplitState::as_split)
                .is_some_and(|x| x.axis == EXPERT_AXIS);
            experts_split
                && p(1)
                && matches!(eff.get(2), Some(SplitState::Mirrored))
                && routing(g, t.src[1]) == t.src.get(2).copied()
        }
        Op::Glu { .. } => p(0) && p(1) && routing(g, id).is_some(),
        _ => false,
    }
}

/// The op a part runs for node `t`: a `mul_mat_id` over split experts learns the id of its
/// part's first expert (past the node's own first); every other op is as it is.
pub(crate) fn part_op(t: &Tensor, src0: Option<&SplitState>, j: usize) -> Op {
    match (&t.op, src0.and_then(SplitState::as_split)) {
        (Op::MulMatId { first }, Some(x)) if x.axis == EXPERT_AXIS => Op::MulMatId {
            first: first + x.single_range(j).unwrap_or(0),
        },
        (op, _) => op.clone(),
    }
}
