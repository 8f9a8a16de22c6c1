//! The mixture-of-experts ops: mul_mat_id, and add_id, argsort and top_k (`moe.wgsl`).
//!
//! mul_mat_id of a batch with many (slot, token) pairs per expert ([`grouped`]) groups them by
//! expert: the bucket op of `moe.wgsl` sorts the pairs by expert on the GPU into the scratch and
//! writes a table of column tiles, then the tiled mat-mat's ID variant (`mat_mat.wgsl`)
//! multiplies each expert's rows by a tile of its pairs' rows at a time, reading the weights
//! once per tile rather than once per pair; the workgroup counts depend only on the shapes.
//! Other batches run as a mat-vec with ID: the integer-dot one of `mat_vec_q.wgsl` for the
//! types it reads, else the float one of `mat_vec.wgsl`.
//!
//! Two fusion groups of a MoE layer have a dispatch here (`moe.wgsl`, taken in `fused.rs`):
//! the router's selection ([`router_plan`], a workgroup a token) and the weighted sum of the
//! experts' outputs with the residual add after it ([`weighted_sum_plan`]).

use tessera_core::fusion::{MoeRouter, MoeWeightedSum};
use tessera_core::{DType, GluOp, Graph, Op, TensorId};

use super::{desc, ew, matmul, per_row, readable_quant, Bind, Node, Params, PlanOut, FLOATS};
use crate::context::Gpu;
use crate::keys::MatMatKey;
use crate::keys::{Key, MatVecKey, MoeKey, MoeKind, MV_ROWS};
use crate::shader::Variant;

/// Longest row argsort and top_k sort in one workgroup's memory (`SORT_MAX` in the shader).
const SORT_MAX: usize = 1024;

/// The fewest (slot, token) pairs per expert held, on average, from which mul_mat_id runs
/// grouped by expert: the mat-vec per pair reads an expert's rows once per pair, the grouped
/// mat-mat once per tile, but computes a whole tile of BN (64) columns in f16 however few
/// pairs it holds; on a large GPU's float units a tile costs about as much as 9 mat-vecs of
/// Q4_K rows read at full bandwidth, so a quarter-full tile is where grouping clearly gains.
const ID_GROUPED_MIN: usize = 16;

/// The most experts held that the grouping takes (`BUCKETS` in `moe.wgsl` less the bucket of
/// the experts not held).
const ID_BUCKETS_MAX: usize = 511;

fn key(op: MoeKind) -> Key {
    Key::Moe(MoeKey { op })
}

/// Why experts of type `a` by rows of type `b` (the experts' rows contiguous: `rows_ok`) do not
/// run as the mul_mat_id mat-vec, if they do not.
fn id_types(a: DType, b: DType, rows_ok: bool) -> Result<(), String> {
    if !(FLOATS.contains(&a) || readable_quant(a)) {
        return Err(format!("expert type {a}"));
    }
    if !matches!(b, DType::F32 | DType::F16) {
        return Err(format!("row type {b}"));
    }
    if a.is_quantized() && !rows_ok {
        return Err("quantized expert rows must be contiguous".into());
    }
    Ok(())
}

/// The mul_mat_id mat-vec of node `id` (its dst [m, n_used, n_tokens]): a workgroup per few
/// rows of the expert each slot of a token picked, the expert read from the ids on the GPU, as
/// the integer-dot mat-vec where the experts' type and alignment allow it, else the float
/// one; `first` is the id of the first expert src0 holds; `glu` with the fused gate and up.
fn id_plan(
    gpu: &Gpu,
    graph: &Graph,
    id: TensorId,
    mut p: Params,
    first: usize,
    glu: Option<GluOp>,
) -> Result<PlanOut, String> {
    let t = graph.get(id);
    let (a, b) = (graph.get(t.src[0]), graph.get(t.src[1]));
    id_types(a.dtype, b.dtype, a.rows_contiguous())?;
    p.u[1] = u32::try_from(first).map_err(|_| "expert id too large".to_string())?;
    let pairs = t.ne[1] * t.ne[2];
    if let Some(key) = matmul::mat_vec_q_id(gpu, graph, t, glu) {
        // The integer-dot mat-vec: the ids in src3, src2 free for the up experts (GLU).
        let groups = t.ne[0].div_ceil(key.rows as usize) * pairs;
        p.u[0] = u32::try_from(groups).map_err(|_| "too many workgroups".to_string())?;
        p.desc[4] = super::desc(graph.get(t.src[2]));
        return Ok(PlanOut {
            variant: Variant::new(Key::MatVecQ(key)),
            bind: vec![
                Bind::whole(id),
                Bind::whole(t.src[0]),
                Bind::whole(t.src[1]),
                Bind::whole(id),
                Bind::whole(t.src[2]),
            ],
            params: p,
            groups,
            groups_3d: None,
        });
    }
    let (aligned, y4) = matmul::wide_loads(gpu, graph, t, 0, 8);
    let key = MatVecKey {
        a: a.dtype,
        b: b.dtype,
        subgroups: gpu.subgroups,
        aligned,
        y4,
        id: true,
        glu,
    };
    let groups = t.ne[0].div_ceil(MV_ROWS as usize) * pairs;
    p.u[0] = u32::try_from(groups).map_err(|_| "too many workgroups".to_string())?;
    p.desc[3] = super::desc(graph.get(t.src[2]));
    Ok(PlanOut {
        variant: Variant::new(Key::MatVec(key)),
        bind: vec![
            Bind::whole(id),
            Bind::whole(t.src[0]),
            Bind::whole(t.src[1]),
            Bind::whole(t.src[2]),
        ],
        params: p,
        groups,
        groups_3d: None,
    })
}

/// The grouped mat-mat's key and tile table size (entries) for mul_mat_id `id` where it runs
/// grouped by expert: at least [`ID_GROUPED_MIN`] pairs per expert held on average, at most
/// [`ID_BUCKETS_MAX`] experts, one expert matrix per index of dim 2, and a table and row tiles
/// that fit the grid.
fn grouped(gpu: &Gpu, graph: &Graph, id: TensorId) -> Option<(MatMatKey, usize)> {
    let t = graph.get(id);
    let (a, b) = (graph.get(t.src[0]), graph.get(t.src[1]));
    let (pairs, experts) = (t.ne[1] * t.ne[2], a.ne[2]);
    let fits = id_types(a.dtype, b.dtype, a.rows_contiguous()).is_ok()
        && a.ne[3] == 1
        && experts <= ID_BUCKETS_MAX
        && pairs >= ID_GROUPED_MIN * experts.max(1);
    if !fits {
        return None;
    }
    let key = matmul::mat_mat_id_key(gpu, graph, t);
    let (bm, bn, _) = key.tile;
    // One entry per BN pairs, plus at most one partly filled tile per bucket with pairs.
    let tiles = pairs.div_ceil(bn as usize) + (experts + 1).min(pairs);
    (tiles <= 65535 && t.ne[0].div_ceil(bm as usize) <= 65535).then_some((key, tiles))
}

/// mul_mat_id grouped by expert ([`grouped`]): the bucket op (one workgroup) writes the pairs
/// by expert and the tile table into the scratch, then the mat-mat's ID variant runs over (row
/// tiles, table entries).
fn grouped_plan(
    n: &Node,
    mut p: Params,
    first: usize,
    mm: MatMatKey,
    tiles: usize,
) -> Result<Vec<PlanOut>, String> {
    let (t, a) = (n.t, n.srcs[0]);
    let pairs = t.ne[1] * t.ne[2];
    let bytes = (pairs + 3 * tiles) * 4;
    if bytes > n.usable {
        return Err(format!("a tile table of {bytes} bytes"));
    }
    let scratch = Bind::scratch(n.id, bytes);
    let mut bp = p;
    bp.u = [
        u32::try_from(first).map_err(|_| "expert id too large".to_string())?,
        a.ne[2] as u32,
        mm.tile.1,
        tiles as u32,
    ];
    bp.h[0] = pairs as u32;
    p.h[0] = pairs as u32;
    let ids = Bind::whole(t.src[2]);
    Ok(vec![
        PlanOut {
            variant: Variant::new(key(MoeKind::Bucket)),
            bind: vec![scratch, ids, ids, ids],
            params: bp,
            groups: 1,
            groups_3d: None,
        },
        PlanOut {
            variant: Variant::new(Key::MatMat(mm)),
            bind: vec![
                Bind::whole(n.id),
                Bind::whole(t.src[0]),
                Bind::whole(t.src[1]),
                scratch,
            ],
            params: p,
            groups: 0,
            groups_3d: Some([t.ne[0].div_ceil(mm.tile.0 as usize) as u32, tiles as u32, 1]),
        },
    ])
}

/// mul_mat_id grouped by expert for long batches ([`grouped_plan`]), else as a mat-vec per
/// selected expert and token ([`id_plan`]).
pub(super) fn mul_mat_id(n: &Node, p: Params, first: usize) -> Result<Vec<PlanOut>, String> {
    if let Some((mm, tiles)) = grouped(n.gpu, n.graph, n.id) {
        return grouped_plan(n, p, first, mm, tiles);
    }
    Ok(vec![id_plan(n.gpu, n.graph, n.id, p, first, None)?])
}

/// The experts' gated FFN input of one dispatch: `op(gate, up)` stored in `glu`'s dst, where
/// `gate` and `up` are mul_mat_ids of the same rows and ids by experts of one type, shape and
/// layout (GLU in `mat_vec`); `None` where they are not, or the plan does not fit, or the batch
/// runs grouped by expert (gate and up then run so, the glu alone).
pub(crate) fn mul_mat_id_glu(
    gpu: &Gpu,
    graph: &Graph,
    gate: TensorId,
    up: TensorId,
    glu: TensorId,
    op: GluOp,
) -> Option<PlanOut> {
    let (tg, tu, ts) = (graph.get(gate), graph.get(up), graph.get(glu));
    let (&Op::MulMatId { first }, &Op::MulMatId { first: up_first }) = (&tg.op, &tu.op) else {
        return None;
    };
    let (wg, wu) = (graph.get(tg.src[0]), graph.get(tu.src[0]));
    let fits = first == up_first
        && tg.src[1..] == tu.src[1..]
        && wg.dtype == wu.dtype
        && wg.ne == wu.ne
        && wg.nb == wu.nb
        && ts.dtype == DType::F32
        && ts.ne == tg.ne
        && ts.is_contiguous()
        && tg.ne == tu.ne;
    if !fits || grouped(gpu, graph, gate).is_some() {
        return None;
    }
    let mut p = Params::default();
    p.desc[0] = super::desc(ts);
    p.desc[1] = super::desc(wg);
    p.desc[2] = super::desc(graph.get(tg.src[1]));
    let mut out = id_plan(gpu, graph, gate, p, first, Some(op)).ok()?;
    out.bind[0] = Bind::whole(glu);
    match &mut out.variant.key {
        Key::MatVecQ(k) => {
            // The up experts in src2, read as the gate's are (16-byte words with A4).
            let align = if k.a4 { 16 } else { 4 };
            if !super::aligned(gpu, graph, tu.src[0], 0, align) {
                return None;
            }
            out.bind[3] = Bind::whole(tu.src[0]);
            out.params.desc[3] = super::desc(wu);
        }
        Key::MatVec(k) => {
            // Whole aligned words (AL) only where the up experts' rows start at word offsets
            // too; the up experts in src3.
            k.aligned &= super::aligned(gpu, graph, tu.src[0], 0, 4);
            out.bind.push(Bind::whole(tu.src[0]));
            out.params.desc[4] = super::desc(wu);
        }
        _ => return None,
    }
    Some(out)
}

/// add_id: one invocation per element.
pub(super) fn add_id(n: &Node, p: Params) -> Result<Vec<PlanOut>, String> {
    let t = n.t;
    let k = key(MoeKind::AddId);
    Ok(ew(
        k,
        vec![n.id, t.src[0], t.src[1], t.src[2]],
        p,
        t.nelements(),
    ))
}

/// argsort and top_k: one workgroup sorts each row.
pub(super) fn sort(n: &Node, mut p: Params) -> Result<Vec<PlanOut>, String> {
    let t = n.t;
    let s = n.srcs[0];
    if s.dtype != DType::F32 {
        return Err(format!("type {}", s.dtype));
    }
    if s.ne[0] > SORT_MAX {
        return Err(format!("rows of {} values (at most {SORT_MAX})", s.ne[0]));
    }
    let rows = s.nrows();
    p.u[0] = rows as u32;
    p.u[1] = u32::from(!matches!(t.op, Op::Argsort { descending: false }));
    p.u[2] = (s.ne[0].max(1) as u32).next_power_of_two();
    let k = key(MoeKind::Sort);
    Ok(per_row(k, vec![n.id, t.src[0], n.id, n.id], p, rows))
}

/// The most experts the router's dispatch selects among (`sv` in the shader).
const ROUTER_MAX_EXPERTS: usize = 1024;

/// The router's selection ([`MoeRouter`]) as one dispatch, a workgroup a token (OP 4): f32
/// scores of at most [`ROUTER_MAX_EXPERTS`] experts a token, at most 32 selected. Bindings:
/// the weights (as `[n_used, n]`), the scores, the ids. `None` where it does not take the
/// group.
pub(crate) fn router_plan(graph: &Graph, r: &MoeRouter) -> Option<PlanOut> {
    let (n_expert, n) = r.f32_rows(graph)?;
    if n_expert > ROUTER_MAX_EXPERTS || r.n_used > 32 {
        return None;
    }
    let (tl, tk, tw) = (
        graph.get(r.logits),
        graph.get(r.top_k),
        graph.get(r.weights),
    );
    let mut p = Params::default();
    let mut dw = desc(tw);
    // The get_rows's [1, n_used, n] read as [n_used, n].
    if tw.ne[0] == 1 && tw.ne[1] == r.n_used {
        dw = [r.n_used as u32, n as u32, 1, 1, dw[5], dw[6], dw[7], dw[7]];
    }
    p.desc[0] = dw;
    p.desc[1] = desc(tl);
    p.desc[2] = desc(tk);
    let (modes, consts) = r.kernel_settings();
    p.u[..2].copy_from_slice(&modes);
    p.f[..4].copy_from_slice(&consts);
    Some(PlanOut {
        variant: Variant::new(key(MoeKind::Router)),
        bind: [r.weights, r.logits, r.top_k, r.weights]
            .into_iter()
            .map(Bind::whole)
            .collect(),
        params: p,
        groups: n,
        groups_3d: None,
    })
}

/// The weighted sum of the experts' outputs, with the residual add after it where there is one
/// ([`MoeWeightedSum`]), as one dispatch, an invocation an output (OP 5): all f32. Bindings:
/// the result, the experts' outputs, the weights, the residual. `None` where it does not take
/// the group.
pub(crate) fn weighted_sum_plan(graph: &Graph, s: &MoeWeightedSum) -> Option<PlanOut> {
    let (td, tw, to) = (graph.get(s.down), graph.get(s.weights), graph.get(s.out));
    let res = s.residual.map(|(_, r)| r);
    let f32s = [td, tw, to].iter().all(|t| t.dtype == DType::F32);
    let res_fits = res.is_none_or(|r| {
        let tr = graph.get(r);
        tr.dtype == DType::F32 && tr.ne == to.ne
    });
    if !f32s || !res_fits || to.ne != [td.ne[0], td.ne[2], 1, 1] {
        return None;
    }
    let mut p = Params::default();
    p.desc[0] = desc(to);
    p.desc[1] = desc(td);
    p.desc[2] = desc(tw);
    p.desc[3] = desc(graph.get(res.unwrap_or(s.out)));
    p.u[1] = u32::from(res.is_some());
    let mut out = ew(
        key(MoeKind::WeightedSum),
        vec![s.out, s.down, s.weights, res.unwrap_or(s.out)],
        p,
        to.nelements(),
    );
    out.pop()
}

/// Every moe key the plans can ask for, and the mul_mat_id mat-vecs (with subgroups on or off).
#[cfg(test)]
pub(super) fn variants(subgroups: bool) -> Vec<Key> {
    let mut v = Vec::new();
    for &a in FLOATS
        .iter()
        .chain(&DType::QUANTIZED)
        .chain(&super::READ_ONLY_QUANTS)
    {
        for b in [DType::F32, DType::F16] {
            for aligned in [false, true] {
                if aligned && a.is_quantized() && !a.type_size().is_multiple_of(4) {
                    continue;
                }
                for y4 in [false, true] {
                    if y4 && b != DType::F32 {
                        continue;
                    }
                    for glu in [None, Some(GluOp::Swiglu), Some(GluOp::Geglu)] {
                        v.push(Key::MatVec(MatVecKey {
                            a,
                            b,
                            subgroups,
                            aligned,
                            y4,
                            id: true,
                            glu,
                        }));
                    }
                }
            }
        }
    }
    v.push(key(MoeKind::AddId));
    v.push(key(MoeKind::Sort));
    v.push(key(MoeKind::Bucket));
    v.push(key(MoeKind::Router));
    v.push(key(MoeKind::WeightedSum));
    v
}
