//! The mixture-of-experts ops: mul_mat_id over every weight type (one or several rows per
//! token, one to many tokens), add_id, argsort and top_k; and the router and expert FFN of a
//! MoE layer as the model runner composes them (soft_max, top_k, get_rows, sum_rows, div,
//! mul_mat_id, swiglu, mul), so that a backend is checked on the chain as well as on each op.

use tessera_core::{DType, GluOp, Op, Result, TensorId};

use super::ne_str;
use crate::case::{Case, CaseGraph, Tolerance};
use crate::init::Init;

/// One mul_mat_id case (ggml's test-backend-ops names).
#[derive(Clone, Copy)]
pub(super) struct MulMatId {
    pub(super) type_a: DType,
    pub(super) type_b: DType,
    /// Experts.
    pub(super) n_mats: usize,
    /// Experts used per token.
    pub(super) n_used: usize,
    /// One row per token shared by its experts (true), or one row per expert slot.
    pub(super) b: bool,
    pub(super) m: usize,
    /// Tokens.
    pub(super) n: usize,
    pub(super) k: usize,
}

impl MulMatId {
    pub(super) fn case(self) -> Case {
        let MulMatId {
            type_a,
            type_b,
            n_mats,
            n_used,
            b,
            m,
            n,
            k,
        } = self;
        let flops = 2.0 * (m * n * k * n_used) as f64;
        Case::new(
            "MUL_MAT_ID",
            format!("type_a={type_a},type_b={type_b},n_mats={n_mats},n_used={n_used},b={b},m={m},n={n},k={k}"),
            &[type_a, type_b, DType::I32],
            Tolerance::MATMUL,
            move |g| {
                let a = g.leaf(type_a, &[k, m, n_mats])?;
                let rows = if b { 1 } else { n_used };
                let x = g.leaf(type_b, &[k, rows, n])?;
                let ids = g.input(DType::I32, &[n_used, n], Init::UniqueIndices(n_mats))?;
                g.mul_mat_id(a, x, ids)
            },
        )
        .with_flops(flops)
    }
}

/// Expert ids [n_used, n_tok] of `n_mats` experts (at least n_used + 2, and 4) with uneven
/// loads, as a router picks them: the top n_used of logits in which expert 0 is every token's
/// first choice, expert n_mats - 1 no token's, and the quarter of the experts after 0 is
/// favoured over the rest.
fn routed_ids(g: &mut CaseGraph, n_mats: usize, n_used: usize, n_tok: usize) -> Result<TensorId> {
    let q = n_mats / 4;
    let hot = g.input(DType::F32, &[1, n_tok], Init::Uniform(4.0, 5.0))?;
    let liked = g.input(DType::F32, &[q, n_tok], Init::Uniform(0.0, 3.0))?;
    let rest = g.input(
        DType::F32,
        &[n_mats - 2 - q, n_tok],
        Init::Uniform(-1.0, 1.0),
    )?;
    let cold = g.input(DType::F32, &[1, n_tok], Init::Uniform(-5.0, -4.0))?;
    let l = g.concat(hot, liked, 0)?;
    let l = g.concat(l, rest, 0)?;
    let l = g.concat(l, cold, 0)?;
    g.top_k(l, n_used)
}

/// mul_mat_id of a prompt's tokens (many (slot, token) pairs per expert: backends group them
/// by expert) routed by [`routed_ids`].
fn mul_mat_id_routed(
    type_a: DType,
    [n_mats, n_used]: [usize; 2],
    b: bool,
    [m, n, k]: [usize; 3],
) -> Case {
    Case::new(
        "MUL_MAT_ID",
        format!("type_a={type_a},type_b=f32,n_mats={n_mats},n_used={n_used},b={b},m={m},n={n},k={k},routing=uneven"),
        &[type_a, DType::F32, DType::I32],
        Tolerance::MATMUL,
        move |g| {
            let a = g.leaf(type_a, &[k, m, n_mats])?;
            let x = g.leaf(DType::F32, &[k, if b { 1 } else { n_used }, n])?;
            let ids = routed_ids(g, n_mats, n_used, n)?;
            g.mul_mat_id(a, x, ids)
        },
    )
    .with_flops(2.0 * (m * n * k * n_used) as f64)
}

/// The experts' gate and up of rows of `k` values into `ff` each (`[k, ff]`), `n_used` of
/// `n_expert` experts (src0 holding `first..first + n_expert`) per token of `n_tok`, and their
/// gated activation `op`.
pub(super) fn moe_glu(
    type_a: DType,
    [k, ff]: [usize; 2],
    n_expert: usize,
    n_used: usize,
    n_tok: usize,
    op: GluOp,
    first: usize,
) -> Case {
    let name = format!(
        "type={type_a},k={k},ff={ff},n_expert={n_expert},n_used={n_used},n_tokens={n_tok},op={},first={first}",
        op.name()
    );
    Case::new(
        "MOE_GLU",
        name,
        &[type_a, DType::F32, DType::I32],
        Tolerance::MATMUL,
        move |g| {
            // Small rows keep the gate's sums near 1, where SiLU and GELU differ most.
            let x = g.input(DType::F32, &[k, 1, n_tok], Init::Uniform(-0.125, 0.125))?;
            let n_ids = if first > 0 { 2 * n_expert } else { n_expert };
            let ids = g.input(DType::I32, &[n_used, n_tok], Init::UniqueIndices(n_ids))?;
            let gate_w = g.leaf(type_a, &[k, ff, n_expert])?;
            let up_w = g.leaf(type_a, &[k, ff, n_expert])?;
            let gate = g.mul_mat_id(gate_w, x, ids)?;
            let up = g.mul_mat_id(up_w, x, ids)?;
            for p in [gate, up] {
                g.get_mut(p).op = Op::MulMatId { first };
            }
            g.glu_split(gate, up, op)
        },
    )
    .with_flops(4.0 * (k * ff * n_used * n_tok) as f64)
}

/// How a MoE layer's router turns its logits into weights (llm's `Routing` and `norm_weights`).
#[derive(Clone, Copy, Debug)]
pub(super) enum Routing {
    /// soft_max over the experts, top_k, the selected probabilities (Qwen 2 MoE, OLMoE).
    SoftMax,
    /// As [`Routing::SoftMax`], renormalized: divided by their sum, floored (Mixtral, Qwen 3
    /// MoE).
    SoftMaxNorm,
    /// top_k of the logits, soft_max over the selected (gpt-oss).
    TopKSoftMax,
}

impl Routing {
    fn name(self) -> &'static str {
        match self {
            Routing::SoftMax => "softmax",
            Routing::SoftMaxNorm => "softmax_norm",
            Routing::TopKSoftMax => "topk_softmax",
        }
    }
}

/// A MoE layer's routing as the model runner builds it (the fusion matcher's `MoeRouter`), and
/// the weighted sum of the selected experts' outputs over the slots plus the residual (its
/// `MoeWeightedSum`): `n_tok` tokens pick `n_used` of `n_expert` experts whose outputs (rows of
/// `m` values, a table per token) are gathered by the ids, so that a wrong id or weight shows
/// in the result. `ties`: every logit appears twice (experts j and j + n_expert / 2), so that
/// the selection must break ties as top_k does (the lower index first).
pub(super) fn moe_route(
    routing: Routing,
    [n_expert, n_used, n_tok]: [usize; 3],
    ties: bool,
    residual: bool,
) -> Case {
    let m = 48;
    let name = format!(
        "routing={},n_expert={n_expert},n_used={n_used},n_tokens={n_tok},ties={ties},residual={residual}",
        routing.name()
    );
    Case::new(
        "MOE_ROUTE",
        name,
        &[DType::F32, DType::I32],
        Tolerance::SOFT_MAX,
        move |g| {
            let logits = if ties {
                let half = g.input(DType::F32, &[n_expert / 2, n_tok], Init::Uniform(-4.0, 4.0))?;
                g.concat(half, half, 0)?
            } else {
                g.input(DType::F32, &[n_expert, n_tok], Init::Uniform(-4.0, 4.0))?
            };
            let scores = match routing {
                Routing::TopKSoftMax => logits,
                _ => g.soft_max_ext(logits, None, 1.0, 0.0)?,
            };
            let selected = g.top_k(scores, n_used)?;
            let s3 = g.reshape(scores, &[1, n_expert, n_tok])?;
            let mut weights = g.get_rows(s3, selected)?;
            match routing {
                Routing::SoftMax => {}
                Routing::SoftMaxNorm => {
                    let w = g.reshape(weights, &[n_used, n_tok])?;
                    let sum = g.sum_rows(w)?;
                    let sum = g.clamp(sum, 6.103_515_6e-5, f32::INFINITY)?;
                    let w = g.div(w, sum)?;
                    weights = g.reshape(w, &[1, n_used, n_tok])?;
                }
                Routing::TopKSoftMax => {
                    let w = g.reshape(weights, &[n_used, n_tok])?;
                    let w = g.soft_max_ext(w, None, 1.0, 0.0)?;
                    weights = g.reshape(w, &[1, n_used, n_tok])?;
                }
            }
            let outputs = g.leaf(DType::F32, &[m, n_expert, n_tok])?;
            let down = g.get_rows(outputs, selected)?;
            let weighted = g.mul(down, weights)?;
            let nb = g.get(weighted).nb;
            let mut sum = g.view(weighted, &[m, n_tok], &[nb[2]], 0)?;
            for e in 1..n_used {
                let slot = g.view(weighted, &[m, n_tok], &[nb[2]], e * nb[1])?;
                sum = g.add(sum, slot)?;
            }
            if residual {
                let r = g.leaf(DType::F32, &[m, n_tok])?;
                sum = g.add(r, sum)?;
            }
            Ok(sum)
        },
    )
}

/// Every case of the family.
pub(super) fn cases(v: &mut Vec<Case>) {
    let base = MulMatId {
        type_a: DType::F32,
        type_b: DType::F32,
        n_mats: 4,
        n_used: 2,
        b: false,
        m: 32,
        n: 1,
        k: 256,
    };
    // Every weight type, decode (one token) and a small prompt (tokens share experts).
    let mut types = vec![DType::F32, DType::F16, DType::BF16];
    types.extend(DType::QUANTIZED);
    for t in types {
        for n in [1, 9] {
            v.push(
                MulMatId {
                    type_a: t,
                    n,
                    b: true,
                    ..base
                }
                .case(),
            );
        }
    }
    // Shapes: one row per slot, f16 rows, many experts few used, every expert used, odd rows,
    // rows long enough for the k-quants' staged mat-vec geometry (CUDA).
    for (n_mats, n_used, b, m, n, k) in [
        (4usize, 2usize, false, 32usize, 3usize, 256usize),
        (8, 2, true, 35, 17, 256),
        (32, 4, true, 64, 33, 512),
        (4, 4, true, 16, 5, 256),
        (8, 1, true, 33, 1, 256),
        (2, 2, false, 7, 2, 64),
        (4, 2, false, 64, 2, 4096),
    ] {
        for (type_a, type_b) in [
            (DType::F32, DType::F32),
            (DType::F16, DType::F16),
            (DType::Q4_0, DType::F32),
            (DType::Q4_K, DType::F32),
        ] {
            if type_a.is_quantized() && !k.is_multiple_of(type_a.block_size()) {
                continue;
            }
            v.push(
                MulMatId {
                    type_a,
                    type_b,
                    n_mats,
                    n_used,
                    b,
                    m,
                    n,
                    k,
                }
                .case(),
            );
        }
    }

    // Decode: one to a few tokens, top 2 to 8 of 8 to 128 experts, over the types MoE files
    // hold their experts in (the k-quants, Q8_0, the i-quants and MXFP4 of gpt-oss).
    for (n_mats, n_used, n) in [
        (8usize, 2usize, 1usize),
        (8, 2, 4),
        (32, 4, 3),
        (64, 8, 1),
        (128, 8, 2),
    ] {
        for type_a in [
            DType::F16,
            DType::Q4_0,
            DType::Q8_0,
            DType::Q4_K,
            DType::Q6_K,
            DType::IQ4_XS,
            DType::MXFP4,
        ] {
            v.push(
                MulMatId {
                    type_a,
                    n_mats,
                    n_used,
                    b: true,
                    m: 64,
                    n,
                    k: 256,
                    ..base
                }
                .case(),
            );
        }
    }
    // More (slot, token) pairs than one launch's grid takes on CUDA (65535): launches in parts.
    v.push(
        MulMatId {
            type_a: DType::Q4_0,
            n_mats: 16,
            n_used: 8,
            b: true,
            m: 4,
            n: 8200,
            k: 32,
            ..base
        }
        .case(),
    );
    // Every i-quant and ternary type once at decode (the lattice types' grids bound).
    for type_a in DType::QUANTIZED_IQ {
        v.push(
            MulMatId {
                type_a,
                n_mats: 8,
                n_used: 2,
                b: true,
                m: 16,
                n: 2,
                k: 256,
                ..base
            }
            .case(),
        );
    }

    // Prompts: many pairs per expert (grouped by expert where a backend does so), uneven loads
    // (one expert chosen by every token, one by none), one row per token or per slot, rows
    // past a 128-row tile, k of one and of two 256-value stages and of one and a half.
    for (n_mats, n_used, b, m, n, k) in [
        (8usize, 2usize, true, 64usize, 64usize, 256usize),
        (32, 8, true, 200, 300, 512),
        (16, 4, false, 96, 300, 256),
    ] {
        for type_a in [
            DType::F32,
            DType::Q4_0,
            DType::Q8_0,
            DType::Q4_K,
            DType::Q6_K,
        ] {
            v.push(mul_mat_id_routed(type_a, [n_mats, n_used], b, [m, n, k]));
        }
    }
    for type_a in [DType::Q4_0, DType::Q8_0] {
        v.push(mul_mat_id_routed(type_a, [8, 4], true, [32, 64, 384]));
    }
    for type_a in [DType::Q5_K, DType::IQ4_XS, DType::MXFP4] {
        v.push(mul_mat_id_routed(type_a, [8, 2], false, [64, 64, 256]));
    }

    // One part's slice of the experts on a meta device (expert parallelism): src0 holds experts
    // first..first + n_mats of twice as many, rows routed to the others are 0; at decode and
    // for a prompt.
    for (type_a, first, n) in [
        (DType::F32, 4, 5),
        (DType::Q4_0, 3, 5),
        (DType::Q4_K, 1, 5),
        (DType::F32, 2, 64),
        (DType::Q4_K, 4, 64),
        (DType::Q6_K, 3, 100),
    ] {
        let (n_mats, n_used, m, k) = (4, 3, 32, 256);
        v.push(Case::new(
            "MUL_MAT_ID",
            format!("type_a={type_a},type_b=f32,n_mats={n_mats},n_used={n_used},m={m},n={n},k={k},first={first}"),
            &[type_a, DType::F32, DType::I32],
            Tolerance::MATMUL,
            move |g| {
                let a = g.leaf(type_a, &[k, m, n_mats])?;
                let x = g.leaf(DType::F32, &[k, 1, n])?;
                let ids = g.input(DType::I32, &[n_used, n], Init::UniqueIndices(2 * n_mats))?;
                let out = g.mul_mat_id(a, x, ids)?;
                g.get_mut(out).op = Op::MulMatId { first };
                Ok(out)
            },
        ));
    }

    // The experts' gate and up with their gated activation (one fused dispatch where a
    // backend has it: the fusion matcher's glu_mul_mat_ids), SwiGLU and GeGLU, at decode and
    // for a few tokens; and one part's slice of the experts (`first`).
    for (type_a, n_expert, n_used, n_tok, op, first) in [
        (DType::F32, 8, 2, 1, GluOp::Swiglu, 0),
        (DType::F16, 8, 2, 3, GluOp::Geglu, 0),
        (DType::Q4_0, 8, 2, 1, GluOp::Swiglu, 0),
        (DType::Q4_0, 32, 4, 5, GluOp::Geglu, 0),
        (DType::Q8_0, 8, 2, 2, GluOp::Swiglu, 0),
        (DType::Q4_K, 64, 8, 1, GluOp::Swiglu, 0),
        (DType::Q4_K, 8, 2, 3, GluOp::Geglu, 0),
        (DType::Q6_K, 128, 8, 1, GluOp::Swiglu, 0),
        (DType::IQ4_XS, 8, 4, 2, GluOp::Swiglu, 0),
        (DType::MXFP4, 32, 4, 1, GluOp::Swiglu, 0),
        (DType::Q4_K, 4, 3, 5, GluOp::Swiglu, 2),
        // Prompts (where a backend runs gate and up grouped by expert, the glu alone).
        (DType::Q4_K, 16, 4, 64, GluOp::Swiglu, 0),
        (DType::Q6_K, 32, 8, 100, GluOp::Swiglu, 0),
        (DType::Q4_0, 8, 3, 80, GluOp::Geglu, 2),
    ] {
        v.push(moe_glu(
            type_a,
            [256, 96],
            n_expert,
            n_used,
            n_tok,
            op,
            first,
        ));
    }

    // add_id: a bias row per expert.
    for (n, n_used, n_tok, n_rows) in [(64, 2, 1, 4), (35, 4, 9, 8), (128, 1, 3, 32)] {
        v.push(Case::new(
            "ADD_ID",
            format!("n={n},n_used={n_used},n_tokens={n_tok},n_rows={n_rows}"),
            &[DType::F32, DType::I32],
            Tolerance::DEFAULT,
            move |g| {
                let a = g.leaf(DType::F32, &[n, n_used, n_tok])?;
                let b = g.leaf(DType::F32, &[n, n_rows])?;
                let ids = g.input(DType::I32, &[n_used, n_tok], Init::UniqueIndices(n_rows))?;
                g.add_id(a, b, ids)
            },
        ));
    }

    // argsort both ways, and top_k, on short and long rows.
    for ne in [[8, 1, 1, 1], [16, 10, 1, 1], [60, 5, 2, 1], [1025, 3, 1, 1]] {
        for descending in [false, true] {
            v.push(Case::new(
                "ARGSORT",
                format!(
                    "type=f32,ne={},order={}",
                    ne_str(&ne),
                    if descending { "desc" } else { "asc" }
                ),
                &[DType::F32, DType::I32],
                Tolerance::Exact,
                move |g| {
                    let a = g.leaf(DType::F32, &ne)?;
                    g.argsort(a, descending)
                },
            ));
        }
    }
    for (ne, k) in [
        ([8, 5, 1, 1], 1),
        ([8, 5, 1, 1], 2),
        ([60, 7, 1, 1], 4),
        ([64, 3, 2, 1], 8),
        ([128, 4, 1, 1], 8),
        ([1000, 3, 1, 1], 40),
    ] {
        v.push(Case::new(
            "TOP_K",
            format!("type=f32,ne={},k={k}", ne_str(&ne)),
            &[DType::F32, DType::I32],
            Tolerance::Exact,
            move |g| {
                let a = g.leaf(DType::F32, &ne)?;
                g.top_k(a, k)
            },
        ));
    }

    // The router of a MoE layer: soft_max over the experts' logits, the top k, their
    // probabilities, renormalised to sum 1 (Mixtral, Qwen 3 MoE).
    for (n_expert, n_used, n_tok) in [(8, 2, 1), (8, 2, 7), (64, 8, 5), (128, 8, 1)] {
        v.push(Case::new(
            "MOE_ROUTER",
            format!("n_expert={n_expert},n_used={n_used},n_tokens={n_tok}"),
            &[DType::F32],
            Tolerance::SOFT_MAX,
            move |g| {
                let logits = g.input(DType::F32, &[n_expert, n_tok], Init::Uniform(-4.0, 4.0))?;
                let probs = g.soft_max_ext(logits, None, 1.0, 0.0)?;
                let top = g.top_k(probs, n_used)?;
                let probs = g.reshape(probs, &[1, n_expert, n_tok])?;
                let w = g.get_rows(probs, top)?;
                let w = g.reshape(w, &[n_used, n_tok])?;
                let sum = g.sum_rows(w)?;
                g.div(w, sum)
            },
        ));
    }

    // The router as the model runner builds it, each architecture's routing (one dispatch
    // where a backend fuses it, the fusion matcher's moe_router), with the experts' outputs
    // gathered by its ids and summed by its weights (moe_weighted_sum): decode, a few tokens, a
    // prompt; 8 to 512 experts, 1 to 16 of them used; ties in the scores.
    for (n_expert, n_used, n_tok) in [
        (8, 2, 1),
        (8, 2, 7),
        (60, 4, 3),
        (64, 8, 5),
        (128, 8, 1),
        (128, 8, 2),
        (128, 1, 3),
        (32, 16, 2),
        (512, 8, 1),
        (128, 8, 70),
    ] {
        for routing in [Routing::SoftMax, Routing::SoftMaxNorm, Routing::TopKSoftMax] {
            for ties in [false, true] {
                let residual = n_tok != 2;
                v.push(moe_route(
                    routing,
                    [n_expert, n_used, n_tok],
                    ties,
                    residual,
                ));
            }
        }
    }

    // The expert FFN of a MoE layer given its routing: gate and up of each token by its
    // experts, swiglu, down, each expert's output weighted, and the experts summed (one
    // dispatch where a backend fuses it: moe_weighted_sum), with the residual added.
    for (t, n_expert, n_used, n_tok, residual) in [
        (DType::F32, 4, 2, 1, false),
        (DType::Q4_0, 8, 2, 1, true),
        (DType::Q4_0, 8, 2, 6, false),
        (DType::Q4_K, 8, 4, 3, true),
        (DType::Q4_K, 16, 4, 64, false),
        (DType::Q8_0, 8, 2, 100, true),
        (DType::Q4_K, 128, 8, 1, true),
    ] {
        let (d, ff) = (256, 256);
        v.push(Case::new(
            "MOE_FFN",
            format!(
                "type={t},n_expert={n_expert},n_used={n_used},n_tokens={n_tok},residual={residual}"
            ),
            &[t, DType::F32, DType::I32],
            Tolerance::MATMUL,
            move |g| {
                let x = g.leaf(DType::F32, &[d, 1, n_tok])?;
                let ids = g.input(DType::I32, &[n_used, n_tok], Init::UniqueIndices(n_expert))?;
                let w = g.input(DType::F32, &[1, n_used, n_tok], Init::Uniform(0.1, 1.0))?;
                let gate_w = g.leaf(t, &[d, ff, n_expert])?;
                let up_w = g.leaf(t, &[d, ff, n_expert])?;
                let down_w = g.leaf(t, &[ff, d, n_expert])?;
                let gate = g.mul_mat_id(gate_w, x, ids)?;
                let up = g.mul_mat_id(up_w, x, ids)?;
                let act = g.glu_split(gate, up, GluOp::Swiglu)?;
                let down = g.mul_mat_id(down_w, act, ids)?;
                let weighted = g.mul(down, w)?;
                let nb = g.get(weighted).nb;
                let mut sum = g.view(weighted, &[d, n_tok], &[nb[2]], 0)?;
                for e in 1..n_used {
                    let slot = g.view(weighted, &[d, n_tok], &[nb[2]], e * nb[1])?;
                    sum = g.add(sum, slot)?;
                }
                if residual {
                    let r = g.leaf(DType::F32, &[d, n_tok])?;
                    sum = g.add(sum, r)?;
                }
                Ok(sum)
            },
        ));
    }
}
