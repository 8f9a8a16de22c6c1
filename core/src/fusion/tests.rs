//! The matcher on a Llama block's decode graph, built the way llm builds it.

use super::{Group, Matcher};
use crate::op::{RopeMode, RopeParams};
use crate::{DType, Graph, TensorId};

/// One Llama block for `tokens` tokens: the groups a backend is offered at its nodes.
fn block(tokens: usize) -> (Graph, Vec<TensorId>) {
    block_with(tokens, Rope::Plain)
}

/// How a test block's ropes rotate.
#[derive(Clone, Copy, PartialEq)]
enum Rope {
    Plain,
    /// Llama 3's: frequency factors (one tensor for Q and K) and a magnitude.
    Factors,
    /// Q's rope and K's with factors of their own tensors.
    OwnFactors,
    /// The plain rotation of heads normed first (Qwen 3's Q/K norms).
    QkNorm,
}

/// [`block`] with ropes of kind `rope`.
fn block_with(tokens: usize, rope: Rope) -> (Graph, Vec<TensorId>) {
    let (d, hd, heads, kv_heads, ff, ctx) = (64, 16, 4, 2, 96, 32);
    let mut g = Graph::new();
    let x = g.input("x", DType::F32, &[d, tokens]).unwrap();
    let w_in = g.input("attn_norm", DType::F32, &[d]).unwrap();
    let wq = g.input("wq", DType::Q4_0, &[d, hd * heads]).unwrap();
    let wk = g.input("wk", DType::Q4_0, &[d, hd * kv_heads]).unwrap();
    let wv = g.input("wv", DType::Q4_0, &[d, hd * kv_heads]).unwrap();
    let wo = g.input("wo", DType::Q4_0, &[hd * heads, d]).unwrap();
    let w_ffn = g.input("ffn_norm", DType::F32, &[d]).unwrap();
    let wg = g.input("wg", DType::Q4_0, &[d, ff]).unwrap();
    let wu = g.input("wu", DType::Q4_0, &[d, ff]).unwrap();
    let wd = g.input("wd", DType::Q4_0, &[ff, d]).unwrap();
    let pos = g.input("pos", DType::I32, &[tokens]).unwrap();
    let rows = g.input("rows", DType::I64, &[tokens]).unwrap();
    let kc = g
        .input("k_cache", DType::F16, &[hd * kv_heads, ctx])
        .unwrap();
    let vc = g
        .input("v_cache", DType::F16, &[hd * kv_heads, ctx])
        .unwrap();
    let mask = g.input("mask", DType::F16, &[ctx, tokens]).unwrap();

    let n = g.rms_norm(x, 1e-5).unwrap();
    let h = g.mul(n, w_in).unwrap();
    let q = g.mul_mat(wq, h).unwrap();
    let k = g.mul_mat(wk, h).unwrap();
    let v = g.mul_mat(wv, h).unwrap();
    let q = g.reshape(q, &[hd, heads, tokens]).unwrap();
    let k = g.reshape(k, &[hd, kv_heads, tokens]).unwrap();
    let (q, k) = if rope == Rope::QkNorm {
        let wqn = g.input("attn_q_norm", DType::F32, &[hd]).unwrap();
        let wkn = g.input("attn_k_norm", DType::F32, &[hd]).unwrap();
        let qn = g.rms_norm(q, 1e-6).unwrap();
        let qn = g.mul(qn, wqn).unwrap();
        let kn = g.rms_norm(k, 1e-6).unwrap();
        (qn, g.mul(kn, wkn).unwrap())
    } else {
        (q, k)
    };
    let mut rp = RopeParams::new(hd, RopeMode::Normal, 10000.0, 1.0);
    let (fq, fk) = match rope {
        Rope::Plain | Rope::QkNorm => (None, None),
        Rope::Factors => {
            let f = g.input("rope_freqs", DType::F32, &[hd / 2]).unwrap();
            (Some(f), Some(f))
        }
        Rope::OwnFactors => (
            Some(g.input("q_freqs", DType::F32, &[hd / 2]).unwrap()),
            Some(g.input("k_freqs", DType::F32, &[hd / 2]).unwrap()),
        ),
    };
    if matches!(rope, Rope::Factors | Rope::OwnFactors) {
        rp.attn_factor = 1.2;
    }
    let q = g.rope_ext(q, pos, fq, rp).unwrap();
    let k = g.rope_ext(k, pos, fk, rp).unwrap();
    let k2 = g.reshape(k, &[hd * kv_heads, tokens]).unwrap();
    let kc2 = g.set_rows(kc, k2, rows).unwrap();
    let vc2 = g.set_rows(vc, v, rows).unwrap();
    let kv = g.reshape(kc2, &[hd, kv_heads, ctx]).unwrap();
    let kv = g.permute(kv, [0, 2, 1, 3]).unwrap();
    let vv = g.reshape(vc2, &[hd, kv_heads, ctx]).unwrap();
    let vv = g.permute(vv, [0, 2, 1, 3]).unwrap();
    let qp = g.permute(q, [0, 2, 1, 3]).unwrap();
    let a = g
        .flash_attn_ext(qp, kv, vv, Some(mask), 0.25, 0.0, 0.0)
        .unwrap();
    let a = g.reshape(a, &[hd * heads, tokens]).unwrap();
    let o = g.mul_mat(wo, a).unwrap();
    let x2 = g.add(o, x).unwrap();
    let n2 = g.rms_norm(x2, 1e-5).unwrap();
    let h2 = g.mul(n2, w_ffn).unwrap();
    let gate = g.mul_mat(wg, h2).unwrap();
    let up = g.mul_mat(wu, h2).unwrap();
    let s = g.swiglu_split(gate, up).unwrap();
    let down = g.mul_mat(wd, s).unwrap();
    let out = g.add(down, x2).unwrap();
    g.set_output(out);
    let nodes = g.ids().collect();
    (g, nodes)
}

/// The first group offered at each node, walking the nodes as a backend that takes every
/// group would.
fn walk(g: &Graph, nodes: &[TensorId]) -> Vec<&'static str> {
    let m = Matcher::new(g, nodes);
    let mut names = Vec::new();
    let mut i = 0;
    while i < nodes.len() {
        match m.candidates(i).first() {
            Some(grp) => {
                names.push(grp.name());
                i = grp.last() + 1;
            }
            None => i += 1,
        }
    }
    names
}

#[test]
fn a_llama_block_is_six_groups() {
    let (g, nodes) = block(1);
    assert_eq!(
        walk(&g, &nodes),
        [
            "rms_norm_mul",
            "mul_mats_rope_kv",
            "attn_mul_mat",
            "mul_mat_add",
            "rms_norm_mul",
            "glu_mul_mats",
            "mul_mat_add"
        ]
    );
}

#[test]
fn candidates_come_most_ambitious_first() {
    let (g, nodes) = block(1);
    let m = Matcher::new(&g, &nodes);
    let i = nodes
        .iter()
        .position(|&n| g.get(n).name.is_empty() && g.get(n).op == crate::Op::MulMat)
        .unwrap();
    let names: Vec<_> = m.candidates(i).iter().map(Group::name).collect();
    assert_eq!(names, ["mul_mats_rope_kv", "mul_mats", "mul_mats"]);
    let Group::MulMats(pair) = &m.candidates(i)[2] else {
        panic!("not a run of mul_mats")
    };
    assert_eq!(pair.mats.len(), 2);
    assert!(pair.more_follow, "V follows Q and K");
    // A backend that declines the first two gets the pair, standing for two nodes.
    let mut offered = 0;
    let taken = m
        .fuse_at(i, |grp| {
            offered += 1;
            Ok::<_, ()>(matches!(grp, Group::MulMats(r) if r.mats.len() == 2))
        })
        .unwrap();
    assert_eq!((offered, taken), (3, Some(2)));
}

#[test]
fn a_result_read_twice_is_not_fused_away() {
    let (mut g, _) = block(1);
    // The swiglu's gate is read by one more node: no glu group, the gate must be written.
    let gate = g
        .ids()
        .find(|&n| g.get(n).op == crate::Op::MulMat && g.get(g.get(n).src[0]).name == "wg")
        .unwrap();
    let extra = g.scale(gate, 2.0).unwrap();
    g.set_output(extra);
    let nodes: Vec<TensorId> = g.ids().collect();
    let walked = walk(&g, &nodes);
    assert!(!walked.contains(&"glu_mul_mats"), "{walked:?}");
    // Gate and up still pair as two mul_mats of one vector.
    assert_eq!(
        walked.iter().filter(|&&n| n == "mul_mats").count(),
        1,
        "{walked:?}"
    );
}

#[test]
fn a_prompt_block_offers_the_same_groups() {
    let (g, nodes) = block(7);
    assert_eq!(walk(&g, &nodes).len(), 7);
}

#[test]
fn ropes_with_frequency_factors_fuse_and_carry_them() {
    let (g, nodes) = block_with(1, Rope::Factors);
    let walked = walk(&g, &nodes);
    assert_eq!(walked[1], "mul_mats_rope_kv", "{walked:?}");
    let m = Matcher::new(&g, &nodes);
    let f = g.ids().find(|&n| g.get(n).name == "rope_freqs");
    let i = nodes
        .iter()
        .position(|&n| matches!(g.get(n).op, crate::Op::Rope(_)))
        .unwrap();
    let groups = m.candidates(i);
    let Some(Group::RopeKv(r)) = groups.first() else {
        panic!(
            "no rope_kv at Q's rope: {:?}",
            groups.iter().map(Group::name).collect::<Vec<_>>()
        )
    };
    assert!(r.q.is_some());
    assert_eq!(r.factors, f);
    assert_eq!(r.params.attn_factor, 1.2);
    // At K's rope: the rope_kv without Q's, and the rope_set_rows, both with the factors.
    for grp in m.candidates(i + 1) {
        match grp {
            Group::RopeKv(r) => assert_eq!((r.q, r.factors), (None, f)),
            Group::RopeSetRows(r) => assert_eq!(r.factors, f),
            other => panic!("unexpected group {}", other.name()),
        }
    }
}

#[test]
fn q_and_k_norms_join_the_rope_kv_step() {
    for tokens in [1, 5] {
        let (g, nodes) = block_with(tokens, Rope::QkNorm);
        let walked = walk(&g, &nodes);
        assert_eq!(walked[1], "mul_mats_qk_norm_rope_kv", "{walked:?}");
        assert_eq!(walked.len(), 7, "{walked:?}");
        // A backend that declines the products with the norms gets them alone, then the
        // norms with the ropes and stores as one group at Q's norm.
        let m = Matcher::new(&g, &nodes);
        let i = nodes
            .iter()
            .position(|&n| matches!(g.get(n).op, crate::Op::RmsNorm { .. }) && n != nodes[0])
            .unwrap();
        let i = nodes[i..]
            .iter()
            .position(|&n| g.get(n).op == crate::Op::RmsNorm { eps: 1e-6 })
            .unwrap()
            + i;
        let groups = m.candidates(i);
        let Some(Group::RopeKv(r)) = groups.first() else {
            panic!("{:?}", groups.iter().map(Group::name).collect::<Vec<_>>())
        };
        let n = r.norms.expect("the norms are part of the step");
        assert_eq!(n.q.norm, nodes[i]);
        assert_eq!(g.get(n.k.w).name, "attn_k_norm");
        assert_eq!(g.get(r.k).src[0], n.k.mul);
        assert_eq!(groups[1].name(), "rms_norm_mul");
    }
}

#[test]
fn ropes_with_different_factors_are_not_one_rope_kv() {
    let (g, nodes) = block_with(1, Rope::OwnFactors);
    let m = Matcher::new(&g, &nodes);
    let i = nodes
        .iter()
        .position(|&n| matches!(g.get(n).op, crate::Op::Rope(_)))
        .unwrap();
    // Q's rope pairs with nothing; K's still stores itself with its own factors.
    assert!(m
        .candidates(i)
        .iter()
        .all(|grp| !matches!(grp, Group::RopeKv(r) if r.q.is_some())));
    let k_freqs = g.ids().find(|&n| g.get(n).name == "k_freqs");
    assert!(m
        .candidates(i + 1)
        .iter()
        .any(|grp| matches!(grp, Group::RopeKv(r) if r.factors == k_freqs)));
}

#[test]
fn a_post_norm_joins_the_residual_in_one_group() {
    // x + rms_norm(W y) * w, the residual on either side of the add: the norm, its weight and
    // the add are one group; read twice, the product stays a plain rms_norm_mul.
    for residual_first in [true, false] {
        let mut g = Graph::new();
        let x = g.input("x", DType::F32, &[64, 1]).unwrap();
        let y = g.input("y", DType::F32, &[64, 1]).unwrap();
        let w = g.input("post_norm", DType::F32, &[64]).unwrap();
        let n = g.rms_norm(y, 1e-6).unwrap();
        let m = g.mul(n, w).unwrap();
        let out = if residual_first {
            g.add(x, m)
        } else {
            g.add(m, x)
        }
        .unwrap();
        g.set_output(out);
        let nodes: Vec<TensorId> = g.ids().collect();
        assert_eq!(walk(&g, &nodes), ["rms_norm_mul_add"]);
        let i = nodes.iter().position(|&t| t == n).unwrap();
        let Group::RmsNormMulAdd(grp) = &Matcher::new(&g, &nodes).candidates(i)[0] else {
            panic!("not a post-norm group")
        };
        assert_eq!((grp.add, grp.residual, grp.norm.mul), (out, x, m));
        let again = g.scale(m, 2.0).unwrap();
        g.set_output(again);
        let nodes: Vec<TensorId> = g.ids().collect();
        assert_eq!(walk(&g, &nodes), ["rms_norm_mul"]);
    }
}

/// The experts' FFN of a MoE layer as llm builds it for `tokens` tokens: gate and up
/// mul_mat_ids of one row per token by the selected experts, their glu, the down mul_mat_id.
fn moe_ffn(tokens: usize, gate_read_twice: bool) -> (Graph, Vec<TensorId>) {
    let (d, ff, n_expert, n_used) = (64, 96, 8, 2);
    let mut g = Graph::new();
    let x = g.input("x", DType::F32, &[d, 1, tokens]).unwrap();
    let ids = g.input("ids", DType::I32, &[n_used, tokens]).unwrap();
    let wg = g.input("wg", DType::Q4_0, &[d, ff, n_expert]).unwrap();
    let wu = g.input("wu", DType::Q4_0, &[d, ff, n_expert]).unwrap();
    let wd = g.input("wd", DType::Q4_0, &[ff, d, n_expert]).unwrap();
    let gate = g.mul_mat_id(wg, x, ids).unwrap();
    let up = g.mul_mat_id(wu, x, ids).unwrap();
    let act = g.glu_split(gate, up, crate::GluOp::Swiglu).unwrap();
    let down = g.mul_mat_id(wd, act, ids).unwrap();
    g.set_output(down);
    if gate_read_twice {
        let extra = g.scale(gate, 2.0).unwrap();
        g.set_output(extra);
    }
    let nodes: Vec<TensorId> = g.ids().collect();
    (g, nodes)
}

#[test]
fn the_experts_gate_and_up_are_one_group() {
    for tokens in [1, 5] {
        let (g, nodes) = moe_ffn(tokens, false);
        assert_eq!(walk(&g, &nodes), ["glu_mul_mat_ids"]);
        let m = Matcher::new(&g, &nodes);
        let i = nodes
            .iter()
            .position(|&n| matches!(g.get(n).op, crate::Op::MulMatId { .. }))
            .unwrap();
        let Some(Group::GluMulMatIds(grp)) = m.candidates(i).first().cloned() else {
            panic!("no expert glu group");
        };
        assert_eq!(g.get(grp.glu).src[..], [grp.gate, grp.up]);
        assert_eq!(g.get(grp.gate).src[1..], [grp.x, grp.ids]);
        assert_eq!(grp.op, crate::GluOp::Swiglu);
    }
    // A gate read by one more node must be written: no group.
    let (g, nodes) = moe_ffn(1, true);
    assert!(walk(&g, &nodes).is_empty());
}
