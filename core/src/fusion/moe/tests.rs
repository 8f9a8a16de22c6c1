//! The matcher on a MoE layer's router and expert FFN, built the way llm builds them.

use super::super::{Group, Matcher};
use super::RouterNorm;
use crate::op::UnaryOp;
use crate::{DType, GluOp, Graph, TensorId};

/// How the test layer routes (llm's `Routing` and `norm_weights`).
#[derive(Clone, Copy, PartialEq)]
enum Route {
    /// soft_max, top_k, get_rows (Qwen 2 MoE, OLMoE).
    SoftMax,
    /// soft_max, top_k, get_rows, sum_rows, clamp, div (Mixtral, Qwen 3 MoE).
    SoftMaxNorm,
    /// top_k of biased logits, get_rows, soft_max over the selected (gpt-oss).
    TopKSoftMax,
}

/// What the test layer does after the experts' sum.
#[derive(Clone, Copy, PartialEq)]
enum After {
    /// The residual add.
    Residual,
    /// A shared expert (Qwen 2 MoE) whose output joins the sum, then the residual.
    Shared,
}

/// A MoE layer's FFN for `tokens` tokens and its residual add; `probs_read` makes one more
/// node read the router's probabilities.
fn moe_layer(
    tokens: usize,
    route: Route,
    after: After,
    probs_read: bool,
) -> (Graph, Vec<TensorId>) {
    let (d, ff, ne, nu) = (64, 32, 8, 3);
    let mut g = Graph::new();
    let x = g.input("x", DType::F32, &[d, tokens]).unwrap();
    let cur = g.input("cur", DType::F32, &[d, tokens]).unwrap();
    let router = g.input("router", DType::F32, &[d, ne]).unwrap();
    let mut logits = g.mul_mat(router, cur).unwrap();
    if route == Route::TopKSoftMax {
        let bias = g.input("router_b", DType::F32, &[ne]).unwrap();
        logits = g.add(logits, bias).unwrap();
    }
    let scores = match route {
        Route::TopKSoftMax => logits,
        _ => g.soft_max_ext(logits, None, 1.0, 0.0).unwrap(),
    };
    if probs_read {
        let extra = g.scale(scores, 2.0).unwrap();
        g.set_output(extra);
    }
    let selected = g.top_k(scores, nu).unwrap();
    let s3 = g.reshape(scores, &[1, ne, tokens]).unwrap();
    let mut weights = g.get_rows(s3, selected).unwrap();
    if route == Route::TopKSoftMax {
        let w = g.reshape(weights, &[nu, tokens]).unwrap();
        let w = g.soft_max_ext(w, None, 1.0, 0.0).unwrap();
        weights = g.reshape(w, &[1, nu, tokens]).unwrap();
    }
    if route == Route::SoftMaxNorm {
        let w = g.reshape(weights, &[nu, tokens]).unwrap();
        let sum = g.sum_rows(w).unwrap();
        let sum = g.clamp(sum, 6.103_515_6e-5, f32::INFINITY).unwrap();
        let w = g.div(w, sum).unwrap();
        weights = g.reshape(w, &[1, nu, tokens]).unwrap();
    }
    let x3 = g.reshape(cur, &[d, 1, tokens]).unwrap();
    let wg = g.input("wg", DType::Q4_0, &[d, ff, ne]).unwrap();
    let wu = g.input("wu", DType::Q4_0, &[d, ff, ne]).unwrap();
    let wd = g.input("wd", DType::Q4_0, &[ff, d, ne]).unwrap();
    let gate = g.mul_mat_id(wg, x3, selected).unwrap();
    let up = g.mul_mat_id(wu, x3, selected).unwrap();
    let act = g.glu_split(gate, up, GluOp::Swiglu).unwrap();
    let down = g.mul_mat_id(wd, act, selected).unwrap();
    let weighted = g.mul(down, weights).unwrap();
    let nb = g.get(weighted).nb;
    let mut out = g.view(weighted, &[d, tokens], &[nb[2]], 0).unwrap();
    for e in 1..nu {
        let slot = g.view(weighted, &[d, tokens], &[nb[2]], e * nb[1]).unwrap();
        out = g.add(out, slot).unwrap();
    }
    if after == After::Shared {
        let ws = g.input("w_shexp", DType::F32, &[d, d]).unwrap();
        let shared = g.mul_mat(ws, cur).unwrap();
        let wsg = g.input("w_shexp_gate", DType::F32, &[d]).unwrap();
        let sg = g.mul_mat(wsg, cur).unwrap();
        let sg = g.unary(sg, UnaryOp::Sigmoid).unwrap();
        let shared = g.mul(shared, sg).unwrap();
        out = g.add(out, shared).unwrap();
    }
    let y = g.add(x, out).unwrap();
    g.set_output(y);
    let nodes: Vec<TensorId> = g.ids().collect();
    (g, nodes)
}

/// The first group offered at each node, walking the nodes as a backend that takes every group
/// would.
fn walk(g: &Graph, nodes: &[TensorId]) -> Vec<Group> {
    let m = Matcher::new(g, nodes);
    let mut groups = Vec::new();
    let mut i = 0;
    while i < nodes.len() {
        match m.candidates(i).first() {
            Some(grp) => {
                i = grp.last() + 1;
                groups.push(grp.clone());
            }
            None => i += 1,
        }
    }
    groups
}

fn names(groups: &[Group]) -> Vec<&'static str> {
    groups.iter().map(Group::name).collect()
}

#[test]
fn a_moe_layer_routes_and_sums_in_one_group_each() {
    for tokens in [1, 4] {
        for route in [Route::SoftMax, Route::SoftMaxNorm, Route::TopKSoftMax] {
            let (g, nodes) = moe_layer(tokens, route, After::Residual, false);
            let groups = walk(&g, &nodes);
            let want: &[&str] = match route {
                Route::TopKSoftMax => &[
                    "mul_mat_add",
                    "moe_router",
                    "glu_mul_mat_ids",
                    "moe_weighted_sum_add",
                ],
                _ => &["moe_router", "glu_mul_mat_ids", "moe_weighted_sum_add"],
            };
            assert_eq!(names(&groups), want);
            let r = groups
                .iter()
                .find_map(|grp| match grp {
                    Group::MoeRouter(r) => Some(*r),
                    _ => None,
                })
                .unwrap();
            assert_eq!(r.n_used, 3);
            assert_eq!(g.get(r.get_rows).src[1], r.top_k);
            assert_eq!(r.soft_max.is_some(), route != Route::TopKSoftMax);
            match (route, r.norm) {
                (Route::SoftMax, RouterNorm::None) => assert_eq!(r.weights, r.get_rows),
                (Route::SoftMaxNorm, RouterNorm::Sum { div, min, .. }) => {
                    assert_eq!(r.weights, div);
                    assert_eq!(min, 6.103_515_6e-5);
                }
                (Route::TopKSoftMax, RouterNorm::SoftMax { node, scale }) => {
                    assert_eq!(r.weights, node);
                    assert_eq!(scale, 1.0);
                }
                _ => panic!("the router's normalization is not the layer's"),
            }
            let Some(Group::MoeWeightedSum(s)) = groups.last() else {
                panic!("no weighted sum");
            };
            assert_eq!(s.n_used, 3);
            assert_eq!(g.get(s.mul).src[..], [s.down, s.weights]);
            let (add, res) = s.residual.unwrap();
            assert_eq!(
                (s.out, g.get(add).src[..].to_vec()),
                (add, vec![res, s.sum])
            );
        }
    }
}

#[test]
fn a_shared_expert_keeps_the_residual_out_of_the_sum() {
    let (g, nodes) = moe_layer(1, Route::SoftMax, After::Shared, false);
    let groups = walk(&g, &nodes);
    // The shared expert's two mul_mats of the layer's input follow the sum.
    assert_eq!(
        names(&groups),
        [
            "moe_router",
            "glu_mul_mat_ids",
            "moe_weighted_sum",
            "mul_mats"
        ]
    );
    let Some(Group::MoeWeightedSum(s)) = groups.get(2) else {
        panic!("no weighted sum");
    };
    assert_eq!((s.out, s.residual), (s.sum, None));
}

#[test]
fn probabilities_read_elsewhere_stay_out_of_the_router() {
    let (g, nodes) = moe_layer(2, Route::SoftMaxNorm, After::Residual, true);
    let groups = walk(&g, &nodes);
    let Some(Group::MoeRouter(r)) = groups.first() else {
        panic!("no router group");
    };
    // The soft_max runs alone; the group starts at the top_k, over its probabilities.
    assert_eq!(r.soft_max, None);
    assert_eq!(g.get(r.top_k).src[0], r.logits);
    assert!(matches!(g.get(r.logits).op, crate::Op::SoftMax { .. }));
}

#[test]
fn a_slot_read_twice_is_no_weighted_sum() {
    let (mut g, _) = moe_layer(1, Route::SoftMax, After::Residual, false);
    let mul = g
        .ids()
        .find(|&n| g.get(n).op == crate::Op::Binary(crate::op::BinaryOp::Mul))
        .unwrap();
    let view = g
        .ids()
        .find(|&n| g.get(n).src.first() == Some(&mul))
        .unwrap();
    let extra = g.scale(view, 2.0).unwrap();
    g.set_output(extra);
    let nodes: Vec<TensorId> = g.ids().collect();
    assert_eq!(names(&walk(&g, &nodes)), ["moe_router", "glu_mul_mat_ids"]);
}
