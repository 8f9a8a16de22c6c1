//! mul_mat: the float mat-vec (`mat_vec.wgsl`), the integer-dot mat-vec of the common
//! quantized types (`mat_vec_q.wgsl`), and the tiled mat-mat (`mat_mat.wgsl`, in f16 where the
//! adapter has SHADER_F16; `mat_mat_coop.wgsl` on cooperative matrices where it has them).

use tessera_core::{DType, Graph, TensorId};

#[cfg(test)]
use super::READ_ONLY_QUANTS;
use super::{aligned, desc, readable_quant, Bind, Node, Params, PlanOut, FLOATS};
use crate::context::Gpu;
use crate::keys::{
    mvq_parts, Key, MatMatKey, MatVecKey, MatVecQKey, QuantColsKey, MV_ROWS, QUANT_COLS_WG,
};
use crate::shader::Variant;

/// Tiles of the tiled mat-mat (BM x BN of dst per workgroup).
const MM_TILES: [(u32, u32); 3] = [(64, 64), (128, 64), (128, 128)];
/// Depths of the tiled mat-mat's steps (BM x BK of src0 and BN x BK of src1 in workgroup
/// memory): the deeper one where the adapter's workgroup memory holds it.
const MM_BK: [u32; 2] = [16, 32];
/// Workgroup memory of the cooperative-matrix mat-mat's result blocks (tc in mat_mat_coop.wgsl: 8
/// subgroups x 16 x 16 f32).
const MM_COOP_TC: u32 = 8 * 256 * 4;
/// The cooperative-matrix mat-mat's tiles (BM, BN): 8 subgroups of 32 x 32, or of 64 x 32 (the
/// larger one where dst has at least 128 columns: [`coop_big`]).
const MM_COOP_TILES: [(u32, u32); 2] = [(128, 64), (128, 128)];
/// Padding (f16 values) of each row of the cooperative-matrix mat-mat's tiles (SA in
/// mat_mat_coop.wgsl), which keeps two tiles of each (double buffered).
const MM_COOP_PAD: u32 = 8;
/// The cooperative-matrix mat-mat's k-step (BK): each invocation loads one 8-value chunk of
/// each of two src0 rows and one 4-value quad of each of BN / 32 src1 columns a step.
const MM_COOP_BK: u32 = 32;
/// Depths of the f16 mat-mat's steps (H16: tiles of f16, half the workgroup memory).
const MM_BK_H16: [u32; 3] = [16, 32, 64];
/// Workgroups from which quantized weights take the largest mat-mat tile (below, the half-size
/// one gives twice as many workgroups to spread over the GPU's cores).
const MM_BIG_GROUPS: usize = 512;
/// Columns of src1 up to which mul_mat uses the float mat-vec (`mat_vec.wgsl`, one column per
/// workgroup) for weights the integer-dot mat-vec does not take; past it, the tiled mat-mat.
/// Weights it takes run as the integer-dot mat-vec up to [`WgpuOptions::mat_vec_n`] columns
/// instead (several columns per workgroup: [`mvq_cols`]).
///
/// [`WgpuOptions::mat_vec_n`]: crate::WgpuOptions::mat_vec_n
const MAT_VEC_MAX_N: usize = 16;
/// Weight types the integer-dot mat-vec (`shaders/mat_vec_q.wgsl`) reads.
const MVQ_TYPES: [DType; 5] = [
    DType::Q4_0,
    DType::Q4_1,
    DType::Q8_0,
    DType::Q4_K,
    DType::Q6_K,
];
/// Rows per integer-dot mat-vec workgroup: the most of these that still gives MVQ_GROUPS
/// workgroups (more rows share each quantized column; fewer give more workgroups). Tall
/// weights take 32 rows: with 16, their workgroups spend a fifth of their time quantizing the
/// column.
const MVQ_ROWS: [u32; 5] = [32, 16, 8, 4, 2];
/// Workgroups per column the integer-dot mat-vec aims for (about two per core of a large GPU).
const MVQ_GROUPS: usize = 256;
/// Parts of a row each invocation of the integer-dot mat-vec aims to take (TPR, the
/// invocations per row, is the parts of a row over this, rounded up to a power of two); see
/// [`mvq_parts_each`].
const MVQ_PARTS: usize = 4;
/// How many times [`MVQ_PARTS`] an invocation of the integer-dot mat-vec of several columns per
/// workgroup (MC) aims to take: each part it loads is multiplied with every column, so that
/// fewer invocations per row have work enough.
const MVQ_PARTS_MC: usize = 4;
/// Invocations per row (TPR) of the integer-dot mat-vec of several columns per workgroup at
/// most (where the workgroup has 32 or more without them): the 32 invocations of a subgroup
/// then span 4 rows or more, whose loads of a column's part from workgroup memory are the same
/// TPR 16-byte words (one 128-byte transaction), not 32 different ones (four): those loads,
/// NC per weight part, would otherwise take more of workgroup memory's bandwidth than the
/// products take of the arithmetic.
const MVQ_TPR_MC: u32 = 8;
/// Columns per workgroup (NC) the integer-dot mat-vec may take, largest first: each part of
/// the weights a workgroup reads is unpacked once for all its columns.
const MVQ_NC: [u32; 3] = [8, 4, 2];
/// The cost of reading and unpacking one part of the weights, in products of a part with one
/// column (the cost model of [`mvq_cols`]).
const MVQ_READ_COST: usize = 4;
/// Columns from which the integer-dot mat-vec computes several per workgroup: below, one
/// column a workgroup keeps more workgroups in flight, which is faster for a few columns
/// (4 columns in groups of 4 decoded ~10% slower on an H100, 16 in groups of 8 ~14% faster).
const MVQ_MC_MIN: usize = 8;
/// Invocations per integer-dot mat-vec workgroup (ROWS x TPR) at most: TPR is cut to fit
/// (and raised to make at least 32, which quantize the column).
const MVQ_WG: u32 = 512;
/// Rows at least this long (k) take [`MVQ_LONG_GROUPS`] workgroups of up to [`MVQ_LONG_WG`]
/// invocations instead: every workgroup quantizes the whole column, and for long rows half as
/// many workgroups, twice as large, spend less on that than a second workgroup per core gains
/// (at k = 4096 the smaller workgroups stay ahead).
const MVQ_LONG_K: usize = 8192;
/// Workgroups per column the integer-dot mat-vec aims for with long rows (about one per core).
const MVQ_LONG_GROUPS: usize = 128;
/// Invocations per integer-dot mat-vec workgroup at most with long rows.
const MVQ_LONG_WG: u32 = 1024;
/// Values of each column quantized into workgroup memory per step: the deepest the adapter's
/// workgroup memory holds (with several columns per workgroup, the shallower ones).
const MVQ_KC: [u32; 4] = [1024, 2048, 4096, 16384];
/// Columns per workgroup of the integer-dot mat-vec that reads its columns pre-quantized (PQ)
/// at most: each part of the weights it reads is unpacked once for all of them, and 16 columns
/// (a batch of 16 sequences) read each weight once.
const MVQ_PQ_NC: usize = 16;
/// Workgroups the integer-dot mat-vec of columns read pre-quantized aims for, whatever the row
/// length (about four per core of a large GPU): with no column to quantize, a workgroup's
/// rows share nothing but the cache, so that smaller workgroups cost nothing and balance the
/// cores better.
const MVQ_PQ_GROUPS: usize = 512;
/// The nominal KC of the integer-dot mat-vec that reads its columns pre-quantized (it keeps
/// none in workgroup memory; the arrays its shader declares for the other variants stay this
/// small).
const MVQ_PQ_KC: u32 = 256;
/// The binding of the norm weights w of an integer-dot mat-vec that computes `rms_norm(x) * w`
/// of its column (NORM in `mat_vec_q`).
pub(crate) const NORM_W_BINDING: usize = 5;

/// Which wide loads a mul_mat launch over weight rows from `r0` may use: (the weights as
/// 16-byte loads (float types, `k` a multiple of `float_k`) or as whole aligned words
/// (quantized types whose blocks are whole words) — the A4 and AL defines; the f32 activations
/// as 16-byte loads — Y4).
pub(super) fn wide_loads(
    gpu: &Gpu,
    graph: &Graph,
    t: &tessera_core::Tensor,
    r0: usize,
    float_k: usize,
) -> (bool, bool) {
    let (a, b) = (graph.get(t.src[0]), graph.get(t.src[1]));
    let k = a.ne[0];
    let a4 = !a.dtype.is_quantized()
        && a.nb[0] == a.dtype.type_size()
        && k.is_multiple_of(float_k)
        && aligned(gpu, graph, t.src[0], r0 * a.nb[1], 16);
    let al = a.dtype.is_quantized()
        && a.dtype.type_size().is_multiple_of(4)
        && aligned(gpu, graph, t.src[0], r0 * a.nb[1], 4);
    let y4 = b.dtype == DType::F32
        && b.nb[0] == 4
        && k.is_multiple_of(4)
        && aligned(gpu, graph, t.src[1], 0, 16);
    (a4 || al, y4)
}

/// mul_mat: dst = src0^T src1, as mat-vecs for a few columns and as the tiled mat-mat
/// otherwise; weights larger than one storage binding run as several launches over row
/// ranges.
pub(super) fn mul_mat(n: &Node, mut p: Params) -> Result<Vec<PlanOut>, String> {
    let (gpu, graph, id, t) = (n.gpu, n.graph, n.id, n.t);
    let (a, b) = (n.srcs[0], n.srcs[1]);
    let float_b = matches!(b.dtype, DType::F32 | DType::F16)
        || (b.dtype == DType::BF16 && FLOATS.contains(&a.dtype));
    if !(FLOATS.contains(&a.dtype) || readable_quant(a.dtype)) || !float_b {
        return Err(format!("types {} x {}", a.dtype, b.dtype));
    }
    p.u[1] = (b.ne[2] / a.ne[2]) as u32;
    p.u[2] = (b.ne[3] / a.ne[3]) as u32;
    let chunk = if a.nbytes() <= n.usable {
        a.ne[1]
    } else if a.ne[2] * a.ne[3] == 1 && a.nb[1] <= n.usable {
        n.usable / a.nb[1]
    } else {
        return Err(format!(
            "src0 of {} bytes exceeds a storage binding and is not a 2-D matrix",
            a.nbytes()
        ));
    };
    let h16 = mat_mat_h16(gpu.mat_mat_f16, a.dtype);
    // The cooperative-matrix mat-mat reads f16 weights as 16-byte chunks of 8 values.
    let chunks =
        a.dtype.is_quantized() || (a.ne[0].is_multiple_of(8) && wide_loads(gpu, graph, t, 0, 8).0);
    let coop_fits = tile_fits(
        gpu.limits.max_compute_workgroup_storage_size,
        MM_COOP_TILES[1],
        MM_COOP_BK,
        true,
        true,
    );
    let coop = h16 && chunks && coop_fits && gpu.coop && coop_wanted(t.ne);
    let tile = mat_mat_tile(gpu, t.ne, h16, a.dtype.is_quantized(), coop);
    let (bm, bn, _) = tile;
    let mut out = Vec::new();
    for r0 in (0..a.ne[1]).step_by(chunk.max(1)) {
        let rc = chunk.min(a.ne[1] - r0);
        let mut p = p;
        p.desc[0][0] = rc as u32;
        p.desc[1][1] = rc as u32;
        let bind = vec![
            Bind {
                id,
                skip: r0 * t.nb[0],
                span: None,
                scratch: false,
            },
            Bind {
                id: t.src[0],
                skip: r0 * a.nb[1],
                span: Some(rc * a.nb[1]),
                scratch: false,
            },
            Bind::whole(t.src[1]),
        ];
        let pq = gpu.options.mat_vec_quantize_once && t.ne[1] >= 2;
        let cols = if pq {
            mvq_cols_pq(t.ne[1])
        } else {
            mvq_cols(t.ne[1], gpu.options.mat_vec_cols)
        };
        let mvq = (t.ne[1] <= gpu.options.mat_vec_n)
            .then(|| mat_vec_q_shape(gpu, graph, t, r0, rc, cols, pq))
            .flatten();
        let (key, groups, groups_3d) = if let Some((rows, wg, kc, a4)) = mvq {
            let col_groups = t.ne[1].div_ceil(cols as usize);
            let groups = rc.div_ceil(rows as usize) * col_groups * t.ne[2] * t.ne[3];
            let (_, y4) = wide_loads(gpu, graph, t, r0, 8);
            // PQ reads the scratch's 16-byte aligned quads.
            let mut key = mat_vec_q_key(a.dtype, b.dtype, gpu.subgroups, a4, y4 || pq);
            key.cols = cols;
            key.pq = pq;
            size_mat_vec_q(
                &mut key,
                (rows, wg, kc),
                a.ne[0],
                gpu.subgroups.then_some(gpu.subgroup_min),
            );
            if t.ne[1] * t.ne[2] * t.ne[3] == 1 {
                key.one_column = Some((rc as u32, a.nb[1] as u32));
            }
            (Key::MatVecQ(key), groups, None)
        } else if t.ne[1] <= MAT_VEC_MAX_N {
            let groups = rc.div_ceil(MV_ROWS as usize) * t.ne[1] * t.ne[2] * t.ne[3];
            let (aligned, y4) = wide_loads(gpu, graph, t, r0, 8);
            let key = MatVecKey {
                a: a.dtype,
                b: b.dtype,
                subgroups: gpu.subgroups,
                aligned,
                y4,
                id: false,
                glu: None,
            };
            (Key::MatVec(key), groups, None)
        } else {
            let z = t.ne[2] * t.ne[3];
            let gx = rc.div_ceil(bm as usize);
            let gy = t.ne[1].div_ceil(bn as usize);
            if z > 65535 || gx > 65535 || gy > 65535 {
                return Err(format!("{:?} needs too many workgroups", t.ne));
            }
            let (aligned, y4) = wide_loads(gpu, graph, t, r0, 4);
            let key = MatMatKey {
                a: a.dtype,
                b: b.dtype,
                tile,
                aligned,
                y4,
                h16,
                coop,
                pair: false,
                id: false,
            };
            (Key::MatMat(key), 0, Some([gx as u32, gy as u32, z as u32]))
        };
        if groups_3d.is_none() {
            p.u[0] = groups as u32;
        }
        out.push(PlanOut {
            variant: Variant::new(key),
            bind,
            params: p,
            groups,
            groups_3d,
        });
    }
    Ok(out)
}

/// The tiled mat-mat key of mul_mat_id `t` over its pairs grouped by expert (ID): f16 tiles
/// where mul_mat's would be, no cooperative matrices, and the narrowest tile (BN pairs of one
/// expert a workgroup: a prompt gives an expert a few dozen).
pub(super) fn mat_mat_id_key(gpu: &Gpu, graph: &Graph, t: &tessera_core::Tensor) -> MatMatKey {
    let (a, b) = (graph.get(t.src[0]), graph.get(t.src[1]));
    let h16 = mat_mat_h16(gpu.mat_mat_f16, a.dtype);
    let ne = [t.ne[0], MM_TILES[0].1 as usize, 1, 1];
    let wg_mem = gpu.limits.max_compute_workgroup_storage_size;
    let (aligned, y4) = wide_loads(gpu, graph, t, 0, 4);
    MatMatKey {
        a: a.dtype,
        b: b.dtype,
        tile: mat_mat_tile_for(wg_mem, ne, h16, a.dtype.is_quantized()),
        aligned,
        y4,
        h16,
        coop: false,
        pair: false,
        id: true,
    }
}

/// Parts of a row each invocation of the integer-dot mat-vec of weights of type `a` aims to
/// take: [`MVQ_PARTS`], and half as many of Q4_K's, whose parts are whole 64-value groups;
/// [`MVQ_PARTS_MC`] times that with several columns per workgroup (`cols` > 1).
fn mvq_parts_each(a: DType, cols: u32) -> usize {
    let each = if a == DType::Q4_K {
        MVQ_PARTS / 2
    } else {
        MVQ_PARTS
    };
    if cols > 1 {
        each * MVQ_PARTS_MC
    } else {
        each
    }
}

/// Columns per workgroup (NC) of the integer-dot mat-vec of `n` (2 or more) columns read
/// pre-quantized (PQ): all of them up to [`MVQ_PQ_NC`], else the fewest groups of at most that
/// many, as even as they go (the last one filled up with copies of the last column).
fn mvq_cols_pq(n: usize) -> u32 {
    n.div_ceil(n.div_ceil(MVQ_PQ_NC)) as u32
}

/// Columns per workgroup (NC) of the integer-dot mat-vec of `n` columns, at most `most`
/// ([`WgpuOptions::mat_vec_cols`]): 1 below [`MVQ_MC_MIN`] columns; else the one of [`MVQ_NC`] that costs
/// least, counting for each group of NC columns (the last one filled up with copies of the
/// last column, computed and not stored) NC products and [`MVQ_READ_COST`] for reading and
/// unpacking the weights; the larger on a tie.
///
/// [`WgpuOptions::mat_vec_cols`]: crate::WgpuOptions::mat_vec_cols
fn mvq_cols(n: usize, most: u32) -> u32 {
    if n < MVQ_MC_MIN {
        return 1;
    }
    MVQ_NC
        .into_iter()
        .filter(|&nc| nc <= most)
        .min_by_key(|&nc| {
            let cost = n.div_ceil(nc as usize) * (nc as usize + MVQ_READ_COST);
            (cost, std::cmp::Reverse(nc))
        })
        .unwrap_or(1)
}

/// Whether mul_mat `t` (mat-vec sized) over weight rows `r0 .. r0 + rows` runs as the
/// integer-dot mat-vec of `cols` columns per workgroup (`pq`: read pre-quantized), and its
/// (ROWS, WG, KC, A4) (TPR = WG / ROWS): a weight type of [`MVQ_TYPES`] whose rows start at
/// 4-byte aligned offsets (A4: Q4_K rows at 16-byte aligned ones, read as 16-byte words), on a
/// device whose limits hold the workgroup. ROWS is the most that still gives the workgroups
/// aimed for, counting (with several columns per workgroup) every group of columns.
fn mat_vec_q_shape(
    gpu: &Gpu,
    graph: &Graph,
    t: &tessera_core::Tensor,
    r0: usize,
    rows: usize,
    cols: u32,
    pq: bool,
) -> Option<(u32, u32, u32, bool)> {
    let a = graph.get(t.src[0]);
    if !MVQ_TYPES.contains(&a.dtype) || !aligned(gpu, graph, t.src[0], r0 * a.nb[1], 4) {
        return None;
    }
    let a4 = a.dtype == DType::Q4_K && aligned(gpu, graph, t.src[0], r0 * a.nb[1], 16);
    let (qb, tpb) = mvq_parts(a.dtype);
    let parts = a.ne[0] / qb as usize * tpb as usize;
    let (groups, most) = if pq {
        (MVQ_PQ_GROUPS, MVQ_WG)
    } else if a.ne[0] >= MVQ_LONG_K {
        (MVQ_LONG_GROUPS, MVQ_LONG_WG)
    } else {
        (MVQ_GROUPS, MVQ_WG)
    };
    let col_groups = if cols > 1 {
        t.ne[1].div_ceil(cols as usize)
    } else {
        1
    };
    let nr = MVQ_ROWS
        .into_iter()
        .find(|&r| rows.div_ceil(r as usize) * col_groups >= groups)
        .unwrap_or(MVQ_ROWS[MVQ_ROWS.len() - 1]);
    let max_wg = most.min(gpu.limits.max_compute_invocations_per_workgroup);
    let mut tpr = parts
        .div_ceil(mvq_parts_each(a.dtype, cols))
        .next_power_of_two() as u32;
    if cols > 1 {
        tpr = tpr.min(MVQ_TPR_MC);
    }
    let tpr = tpr.clamp(32 / nr, max_wg / nr);
    let wg = nr * tpr;
    let l = &gpu.limits;
    if wg > l.max_compute_invocations_per_workgroup || wg > l.max_compute_workgroup_size_x {
        return None;
    }
    let kc = if pq {
        MVQ_PQ_KC
    } else {
        mvq_kc(l.max_compute_workgroup_storage_size, wg, cols)?
    };
    Some((nr, wg, kc, a4))
}

/// The integer-dot mat-vec key of mul_mat_id `t` (ID; with `glu`, of its experts' gate and up
/// with their activation: the up experts, laid out as the gate's, then bound as src2), shaped
/// as one mat-vec over the rows of all its (slot, token) pairs; `None` where its experts do not
/// run as the integer-dot mat-vec.
pub(super) fn mat_vec_q_id(
    gpu: &Gpu,
    graph: &Graph,
    t: &tessera_core::Tensor,
    glu: Option<tessera_core::GluOp>,
) -> Option<MatVecQKey> {
    let (a, b) = (graph.get(t.src[0]), graph.get(t.src[1]));
    let (rows, wg, kc, a4) =
        mat_vec_q_shape(gpu, graph, t, 0, t.ne[0] * t.ne[1] * t.ne[2], 1, false)?;
    let (_, y4) = wide_loads(gpu, graph, t, 0, 8);
    let mut key = mat_vec_q_key(a.dtype, b.dtype, gpu.subgroups, a4, y4);
    size_mat_vec_q(
        &mut key,
        (rows, wg, kc),
        a.ne[0],
        gpu.subgroups.then_some(gpu.subgroup_min),
    );
    key.id = true;
    key.second = glu.map(|op| crate::keys::SecondMatrix { glu: Some(op) });
    Some(key)
}

/// The deepest of [`MVQ_KC`] whose `cols` quantized columns (KC bytes and KC / 8 of scales
/// each, and with several columns KC / 8 of sums) and reduction scratch (WG f32) fit `wg_mem`
/// bytes.
fn mvq_kc(wg_mem: u32, wg: u32, cols: u32) -> Option<u32> {
    let sums = u32::from(cols > 1);
    MVQ_KC
        .into_iter()
        .rev()
        .find(|&kc| cols * (kc + kc / 8 + sums * kc / 8) + 4 * wg <= wg_mem)
}

/// The plan `out` of mul_mat `id` as the integer-dot mat-vec, shaped (ROWS, WG, TPR, KC) for
/// one dispatch over `rows` rows in all (the fused Q, K and V, whose K and V rows count once:
/// a workgroup computes the same rows of both); `None` where that shape does not fit the
/// device or loses A4, or `out` is not an integer-dot mat-vec.
pub(crate) fn mat_vec_q_reshaped(
    gpu: &Gpu,
    graph: &Graph,
    id: TensorId,
    mut out: PlanOut,
    rows: usize,
) -> Option<PlanOut> {
    let t = graph.get(id);
    let Key::MatVecQ(key) = &mut out.variant.key else {
        return None;
    };
    let (nr, wg, kc, a4) = mat_vec_q_shape(gpu, graph, t, 0, rows, key.cols, key.pq)?;
    if key.a4 != a4 {
        return None;
    }
    size_mat_vec_q(
        key,
        (nr, wg, kc),
        graph.get(t.src[0]).ne[0],
        gpu.subgroups.then_some(gpu.subgroup_min),
    );
    Some(out)
}

/// Shapes integer-dot mat-vec key `key` (ROWS, WG, KC) = `shape` (TPR = WG / ROWS invocations
/// per row) for rows of `k` values, compiled in as KK, which the column's quantization takes
/// too (YK). `subgroup_min`: the adapter's smallest subgroup size where the variant uses
/// subgroups; where a row's TPR invocations fit in it, the row sums are added by subgroup
/// shuffles (RSUB) instead of a tree through workgroup memory; where it is 8 or more, the
/// column is quantized with coalesced loads, 8 invocations a block (YC), QPS quads an
/// invocation a step (see [`mvq_quads_per_step`]). Where that quantization is one chunk of one
/// step (k at most KC and at most the 4 x QPS x WG values a step loads), QF issues the
/// column's loads before the first weights', for every type but Q4_0 and Q4_1 (for which it
/// loses). Decided here, so that a key shaped again ([`mat_vec_q_reshaped`]) never keeps a QF
/// its new shape does not allow (nor one for several columns per workgroup, whose columns are
/// quantized one after another: `key.cols` is set before).
fn size_mat_vec_q(
    key: &mut MatVecQKey,
    (rows, wg, kc): (u32, u32, u32),
    k: usize,
    subgroup_min: Option<u32>,
) {
    let tpr = wg / rows;
    let qps = mvq_quads_per_step(k, kc, wg);
    let yc = subgroup_min.is_some_and(|s| s >= 8);
    let one_step = yc && k <= kc as usize && k <= (4 * qps * wg) as usize;
    key.rows = rows;
    key.wg = wg;
    key.kc = kc;
    key.kk = k as u32;
    key.qps = qps;
    key.rsub = subgroup_min.is_some_and(|s| tpr <= s);
    key.yc = yc;
    key.qf = one_step && key.cols == 1 && !matches!(key.a, DType::Q4_0 | DType::Q4_1);
}

/// The quads (4 values) of the column each invocation of a `wg`-invocation integer-dot mat-vec
/// loads per step of its quantization (QPS with YC in `mat_vec_q`): the quads of a chunk of up
/// to `kc` of the `k` values over `wg`, rounded up to 1, 2 or 4, so that a step loads few
/// values past the chunk and its loads go out together.
fn mvq_quads_per_step(k: usize, kc: u32, wg: u32) -> u32 {
    let quads = k.min(kc as usize).div_ceil(4);
    (quads.div_ceil(wg as usize).next_power_of_two() as u32).min(4)
}

/// The plan `out` of an integer-dot mat-vec whose src1 is `rms_norm(x) * w` (x f32 of src1's
/// shape, w one f32 row of contiguous values), made to read x and w and compute the norm itself
/// (NORM): x in binding 2 (as 16-byte words where x allows, Y4), w in binding 5 (the bindings
/// before it that the plan does not use repeat dst), eps in f.x.
pub(crate) fn mat_vec_q_norm(
    gpu: &Gpu,
    graph: &Graph,
    mut out: PlanOut,
    x: TensorId,
    w: TensorId,
    eps: f32,
) -> PlanOut {
    let tx = graph.get(x);
    let y4 = tx.nb[0] == 4 && tx.ne[0].is_multiple_of(4) && aligned(gpu, graph, x, 0, 16);
    if let Key::MatVecQ(k) = &mut out.variant.key {
        k.norm = true;
        k.y4 = y4;
    }
    out.bind[2] = Bind::whole(x);
    out.params.desc[2] = desc(tx);
    while out.bind.len() < NORM_W_BINDING {
        out.bind.push(out.bind[0]);
    }
    out.bind.push(Bind::whole(w));
    out.params.f[0] = eps;
    out
}

/// Bytes of `n` columns of `k` values (a multiple of 32) quantized by `quant_cols`: the quads
/// (k bytes a column), then the scales and the sums (k / 32 words each a column), rounded up to
/// 16 bytes; and the word indices of the scales and of the sums (h.x, h.y of both dispatches).
fn quantized_layout(k: usize, n: usize) -> (usize, [u32; 2]) {
    let blocks = n * k / 32;
    let scales = n * k / 4;
    (
        (n * k + 8 * blocks).next_multiple_of(16),
        [scales as u32, (scales + blocks) as u32],
    )
}

/// Whether `out` is an integer-dot mat-vec plan that reads its columns pre-quantized (PQ).
pub(crate) fn reads_quantized(out: &PlanOut) -> bool {
    out.variant.mat_vec_q().is_some_and(|k| k.pq)
}

/// The `quant_cols` plan (for node `id`) that quantizes the columns `col` (a PQ mat-vec's
/// src1) into the scratch, or with `norm` (x, w, eps; x of col's shape) `rms_norm(x) * w`
/// in their stead: what [`read_quantized`] plans read.
pub(crate) fn quant_cols_plan(
    gpu: &Gpu,
    graph: &Graph,
    id: TensorId,
    col: TensorId,
    norm: Option<(TensorId, TensorId, f32)>,
) -> PlanOut {
    let src = norm.map_or(col, |(x, _, _)| x);
    let s = graph.get(src);
    let (k, n) = (s.ne[0], s.ne[1] * s.ne[2] * s.ne[3]);
    let (bytes, words) = quantized_layout(k, n);
    let y4 = s.dtype == DType::F32
        && s.nb[0] == 4
        && k.is_multiple_of(4)
        && aligned(gpu, graph, src, 0, 16);
    let key = QuantColsKey {
        b: s.dtype,
        y4,
        k: k as u32,
        norm: norm.is_some(),
    };
    let scratch = Bind::scratch(id, bytes);
    let mut p = Params::default();
    p.desc[2] = desc(s);
    let chunks = (k / 32).div_ceil(QUANT_COLS_WG as usize);
    p.u[0] = (n * chunks) as u32;
    p.u[1] = chunks as u32;
    p.h[0] = words[0];
    p.h[1] = words[1];
    let w = match norm {
        Some((_, w, eps)) => {
            p.desc[1] = desc(graph.get(w));
            p.f[0] = eps;
            Bind::whole(w)
        }
        None => scratch,
    };
    PlanOut {
        variant: Variant::new(Key::QuantCols(key)),
        bind: vec![scratch, w, Bind::whole(src)],
        params: p,
        groups: n * chunks,
        groups_3d: None,
    }
}

/// The PQ mat-vec plan `out` (for node `id`) made to read its columns from the scratch, where
/// [`quant_cols_plan`] put them.
pub(crate) fn read_quantized(graph: &Graph, id: TensorId, mut out: PlanOut) -> PlanOut {
    let s = graph.get(out.bind[2].id);
    let (bytes, words) = quantized_layout(s.ne[0], s.ne[1] * s.ne[2] * s.ne[3]);
    out.bind[2] = Bind::scratch(id, bytes);
    out.params.h[0] = words[0];
    out.params.h[1] = words[1];
    out
}

/// The integer-dot mat-vec key for weights of type `a` (one of [`MVQ_TYPES`]) and activations
/// of type `b`; `a4` and `y4` as in [`mat_vec_q_shape`] and [`MatVecKey`], not yet shaped
/// ([`size_mat_vec_q`]) and with nothing fused.
fn mat_vec_q_key(a: DType, b: DType, subgroups: bool, a4: bool, y4: bool) -> MatVecQKey {
    MatVecQKey {
        a,
        b,
        subgroups,
        a4,
        y4,
        rows: 0,
        wg: 0,
        kc: 0,
        kk: 0,
        qps: 0,
        rsub: false,
        yc: false,
        qf: false,
        one_column: None,
        add: false,
        second: None,
        qkv: false,
        rope: None,
        norm: false,
        id: false,
        cols: 1,
        pq: false,
    }
}

/// Whether the tiled mat-mat computes weights of type `a` in f16 (H16) on a device where it
/// may (`enabled`: `Gpu::mat_mat_f16`, SHADER_F16 and asked for): f16 and quantized weights do
/// (their values are f16 or dequantize from f16 scales), f32 and bf16 weights (whose precision
/// or range f16 lacks) do not.
fn mat_mat_h16(enabled: bool, a: DType) -> bool {
    enabled && (a == DType::F16 || readable_quant(a))
}

/// The tile (BM, BN, BK) of the tiled mat-mat for a dst of shape `ne`: for quantized weights
/// (`quant`) 128 x 128 where dst has at least MM_BIG_GROUPS such tiles; else 128 x 64 where it
/// has 128 rows and 64 columns, else 64 x 64; BK the deepest of MM_BK (MM_BK_H16 for f16 tiles,
/// `h16`) whose tiles fit the adapter's workgroup memory; with `coop` (cooperative matrices)
/// one of [`MM_COOP_TILES`]. Float weights lose with the largest tile (too few workgroups
/// for the GPU's cores); quantized weights, whose tiles cost more to load, gain with it where
/// there are enough of them.
fn mat_mat_tile(gpu: &Gpu, ne: [usize; 4], h16: bool, quant: bool, coop: bool) -> (u32, u32, u32) {
    if coop {
        let (bm, bn) = MM_COOP_TILES[usize::from(coop_big(ne))];
        return (bm, bn, MM_COOP_BK);
    }
    mat_mat_tile_for(
        gpu.limits.max_compute_workgroup_storage_size,
        ne,
        h16,
        quant,
    )
}

/// Whether BM x BK and BN x BK tiles (of f16 with `h16`, else f32) fit `wg_mem` bytes; with
/// `coop` (cooperative matrices) two padded f16 tiles of each (double buffered) and the
/// subgroups' 16 x 16 f32 result blocks.
fn tile_fits(wg_mem: u32, (bm, bn): (u32, u32), bk: u32, h16: bool, coop: bool) -> bool {
    let bytes = if coop {
        2 * (bm + bn) * (bk + MM_COOP_PAD) * 2 + MM_COOP_TC
    } else {
        (bm + bn) * bk * if h16 { 2 } else { 4 }
    };
    bytes <= wg_mem
}

/// Whether dst (shape `ne`) takes the larger cooperative-matrix tile: at least 128 columns
/// (half as many workgroups, each loading its src0 tile once for twice the columns).
fn coop_big(ne: [usize; 4]) -> bool {
    ne[1] >= 128
}

/// Whether an f16 mat-mat of dst shape `ne` runs on cooperative matrices: wherever dst has
/// 128 rows.
fn coop_wanted(ne: [usize; 4]) -> bool {
    ne[0] >= MM_COOP_TILES[0].0 as usize
}

/// [`mat_mat_tile`] for `wg_mem` bytes of workgroup memory.
fn mat_mat_tile_for(wg_mem: u32, ne: [usize; 4], h16: bool, quant: bool) -> (u32, u32, u32) {
    let groups = |bm: usize, bn: usize| ne[0].div_ceil(bm) * ne[1].div_ceil(bn) * ne[2] * ne[3];
    let big = quant && ne[0] >= 128 && ne[1] >= 128 && groups(128, 128) >= MM_BIG_GROUPS;
    let (bm, bn) = if big {
        MM_TILES[2]
    } else if ne[0] >= 128 && ne[1] >= 64 {
        MM_TILES[1]
    } else {
        MM_TILES[0]
    };
    (bm, bn, deepest_fit(wg_mem, (bm, bn), h16))
}

/// The deepest BK of [`MM_BK`] (of [`MM_BK_H16`] for f16 tiles, `h16`) whose BM x BN tiles fit
/// `wg_mem` bytes ([`tile_fits`]; the shallowest where none does).
fn deepest_fit(wg_mem: u32, tile: (u32, u32), h16: bool) -> u32 {
    let depths: &[u32] = if h16 { &MM_BK_H16 } else { &MM_BK };
    depths
        .iter()
        .rev()
        .copied()
        .find(|&bk| tile_fits(wg_mem, tile, bk, h16, false))
        .unwrap_or(depths[0])
}

/// Every mul_mat key the plans (and the fused dispatches) can ask for, with subgroups on or
/// off.
#[cfg(test)]
pub(super) fn variants(subgroups: bool) -> Vec<Key> {
    use crate::keys::SecondMatrix;
    use tessera_core::GluOp;
    let mut v = Vec::new();
    for &a in FLOATS
        .iter()
        .chain(&DType::QUANTIZED)
        .chain(&READ_ONLY_QUANTS)
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
                    v.push(Key::MatVec(MatVecKey {
                        a,
                        b,
                        subgroups,
                        aligned,
                        y4,
                        id: false,
                        glu: None,
                    }));
                }
            }
        }
        if MVQ_TYPES.contains(&a) {
            for b in [DType::F32, DType::F16] {
                for (a4, y4) in [(false, false), (false, true), (true, true)] {
                    if (a4 && a != DType::Q4_K) || (y4 && b != DType::F32) {
                        continue;
                    }
                    // Row lengths that give QPS 4, 2 and 1.
                    for (rows, wg, k) in [(32, 1024, 14336), (16, 512, 4096), (2, 64, 256)] {
                        for (kc, one_column) in [
                            (MVQ_KC[2], None),
                            (MVQ_KC[3], None),
                            (
                                MVQ_KC[3],
                                Some((4096, (k / a.block_size() * a.type_size()) as u32)),
                            ),
                        ] {
                            let mut x = mat_vec_q_key(a, b, subgroups, a4, y4);
                            size_mat_vec_q(&mut x, (rows, wg, kc), k, subgroups.then_some(32));
                            x.one_column = one_column;
                            let pair = MatVecQKey {
                                second: Some(SecondMatrix { glu: None }),
                                ..x
                            };
                            let qkv = MatVecQKey { qkv: true, ..pair };
                            let fused = [
                                x,
                                MatVecQKey { add: true, ..x },
                                pair,
                                qkv,
                                MatVecQKey {
                                    rope: Some(DType::F16),
                                    ..qkv
                                },
                                MatVecQKey {
                                    rope: Some(DType::F32),
                                    ..qkv
                                },
                                MatVecQKey {
                                    second: Some(SecondMatrix {
                                        glu: Some(GluOp::Swiglu),
                                    }),
                                    ..x
                                },
                                MatVecQKey {
                                    second: Some(SecondMatrix {
                                        glu: Some(GluOp::Geglu),
                                    }),
                                    ..x
                                },
                            ];
                            // mul_mat_id's, plain and with the experts' gate and up.
                            for second in [
                                None,
                                Some(SecondMatrix {
                                    glu: Some(GluOp::Swiglu),
                                }),
                                Some(SecondMatrix {
                                    glu: Some(GluOp::Geglu),
                                }),
                            ] {
                                if one_column.is_none() {
                                    v.push(Key::MatVecQ(MatVecQKey {
                                        id: true,
                                        second,
                                        ..x
                                    }));
                                }
                            }
                            // Several columns per workgroup, plain, with a residual, with a
                            // norm: at the shallower chunks they take.
                            let mut mc = Vec::new();
                            if one_column.is_none() {
                                for cols in MVQ_NC {
                                    let mut m = mat_vec_q_key(a, b, subgroups, a4, y4);
                                    m.cols = cols;
                                    let depth = MVQ_KC[usize::from(kc == MVQ_KC[3])];
                                    size_mat_vec_q(
                                        &mut m,
                                        (rows, wg, depth),
                                        k,
                                        subgroups.then_some(32),
                                    );
                                    mc.extend([m, MatVecQKey { add: true, ..m }]);
                                }
                                // Read pre-quantized, at column counts that end each vec4 of
                                // sums part-way and full.
                                if y4 && kc == MVQ_KC[2] {
                                    for cols in [2, 3, 5, 8, 9, 15, 16] {
                                        let mut m = mat_vec_q_key(a, b, subgroups, a4, true);
                                        m.cols = cols;
                                        m.pq = true;
                                        size_mat_vec_q(
                                            &mut m,
                                            (rows, wg, MVQ_PQ_KC),
                                            k,
                                            subgroups.then_some(32),
                                        );
                                        v.push(Key::MatVecQ(m));
                                        v.push(Key::MatVecQ(MatVecQKey { add: true, ..m }));
                                    }
                                }
                            }
                            for f in fused.into_iter().chain(mc) {
                                // NORM: the column is an f32 x to normalize.
                                if b == DType::F32 {
                                    v.push(Key::MatVecQ(MatVecQKey { norm: true, ..f }));
                                }
                                v.push(Key::MatVecQ(f));
                            }
                        }
                    }
                }
            }
        }
        // quant_cols' keys (of no weight type): listed once.
        if a == DType::Q4_0 {
            for b in [DType::F32, DType::F16] {
                for (y4, norm) in [(false, false), (true, false), (false, true), (true, true)] {
                    if (y4 || norm) && b != DType::F32 {
                        continue;
                    }
                    for k in [256, 4096, 14336] {
                        v.push(Key::QuantCols(QuantColsKey { b, y4, k, norm }));
                    }
                }
            }
        }
        for b in [DType::F32, DType::F16] {
            for (h16, coop) in [(false, false), (true, false), (true, true)] {
                if h16 && !mat_mat_h16(true, a) {
                    continue;
                }
                let depths: &[u32] = if h16 { &MM_BK_H16 } else { &MM_BK };
                for (bm, bn) in MM_TILES {
                    if coop && !MM_COOP_TILES.contains(&(bm, bn)) {
                        continue;
                    }
                    for &bk in depths {
                        if coop && bk != MM_COOP_BK {
                            continue;
                        }
                        for aligned in [false, true] {
                            if aligned && a.is_quantized() && !a.type_size().is_multiple_of(4) {
                                continue;
                            }
                            // Float weights take cooperative matrices only aligned.
                            if coop && !aligned && !a.is_quantized() {
                                continue;
                            }
                            for y4 in [false, true] {
                                if y4 && b != DType::F32 {
                                    continue;
                                }
                                let x = MatMatKey {
                                    a,
                                    b,
                                    tile: (bm, bn, bk),
                                    aligned,
                                    y4,
                                    h16,
                                    coop,
                                    pair: false,
                                    id: false,
                                };
                                if coop {
                                    v.push(Key::MatMat(MatMatKey { pair: true, ..x }));
                                } else if bn == MM_TILES[0].1 {
                                    // mul_mat_id's grouped mat-mat (mat_mat_id_key).
                                    v.push(Key::MatMat(MatMatKey { id: true, ..x }));
                                }
                                v.push(Key::MatMat(x));
                            }
                        }
                    }
                }
            }
        }
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The columns per workgroup of the integer-dot mat-vec: one for a few columns; the fewest
    /// groups of columns for what they cost (groups of 8 where 8 divide the columns), never
    /// more than the option allows; and the chunk depth that fits the workgroup memory.
    #[test]
    fn mat_vec_q_columns_and_depth() {
        let picks: Vec<u32> = [1, 2, 3, 4, 5, 8, 12, 16, 32, 64]
            .into_iter()
            .map(|n| mvq_cols(n, 8))
            .collect();
        assert_eq!(picks, [1, 1, 1, 1, 1, 8, 8, 8, 8, 8]);
        assert_eq!(mvq_cols(16, 1), 1);
        assert_eq!(mvq_cols(16, 0), 1);
        assert_eq!(mvq_cols(16, 4), 4);
        assert_eq!(mvq_cols(9, 2), 2);
        assert_eq!(mvq_cols(12, 8), 8);
        // Read pre-quantized: every column in one workgroup up to 16, then even groups.
        let picks: Vec<u32> = [2, 3, 7, 16, 17, 32, 33, 64]
            .into_iter()
            .map(mvq_cols_pq)
            .collect();
        assert_eq!(picks, [2, 3, 7, 16, 9, 16, 11, 16]);
        // 3 columns of 4096: 12288 bytes of quads, then 384 scale words and 384 sum words.
        assert_eq!(quantized_layout(4096, 3), (15360, [3072, 3456]));
        assert_eq!(quantized_layout(32, 1), (48, [8, 9]));
        // One column: 16384 values where they fit beside a 512-invocation workgroup's scratch.
        assert_eq!(mvq_kc(49152, 512, 1), Some(16384));
        assert_eq!(mvq_kc(16384, 512, 1), Some(4096));
        // Eight columns with their sums: 4096 in 48 KiB, 1024 in 16 KiB.
        assert_eq!(mvq_kc(49152, 256, 8), Some(4096));
        assert_eq!(mvq_kc(16384, 256, 8), Some(1024));
        assert_eq!(mvq_kc(8192, 256, 8), None);
    }

    /// The f16 mat-mat is chosen for f16 and quantized weights on devices with SHADER_F16
    /// only, and its half-size tiles get the deeper steps.
    #[test]
    fn mat_mat_f16_selection() {
        assert!(mat_mat_h16(true, DType::F16));
        assert!(mat_mat_h16(true, DType::Q4_0));
        assert!(mat_mat_h16(true, DType::Q6_K));
        assert!(!mat_mat_h16(true, DType::F32));
        assert!(!mat_mat_h16(true, DType::BF16));
        assert!(!mat_mat_h16(false, DType::F16));
        assert!(!mat_mat_h16(false, DType::Q4_0));
        let big = [8192, 1024, 1, 1];
        // Quantized weights take 128 x 128 tiles at this size, float weights 128 x 64.
        assert_eq!(mat_mat_tile_for(32768, big, false, true), (128, 128, 32));
        assert_eq!(mat_mat_tile_for(32768, big, true, true), (128, 128, 64));
        assert_eq!(mat_mat_tile_for(16384, big, false, true), (128, 128, 16));
        assert_eq!(mat_mat_tile_for(16384, big, true, true), (128, 128, 32));
        assert_eq!(mat_mat_tile_for(32768, big, false, false), (128, 64, 32));
        assert_eq!(mat_mat_tile_for(32768, big, true, false), (128, 64, 64));
        assert_eq!(mat_mat_tile_for(16384, big, false, false), (128, 64, 16));
        assert_eq!(mat_mat_tile_for(16384, big, true, false), (128, 64, 32));
        // The source of the f16-weights 128 x 128 mat-mat of depth bk with (h16, coop).
        let source = |bk, (h16, coop)| {
            let key = Key::MatMat(MatMatKey {
                a: DType::F16,
                b: DType::F32,
                tile: (128, 128, bk),
                aligned: true,
                y4: true,
                h16,
                coop,
                pair: false,
                id: false,
            });
            Variant::new(key).source().unwrap()
        };
        let src = source(64, (true, false));
        assert!(src.starts_with("enable f16;"), "{}", &src[..40]);
        assert!(!src.starts_with("enable f16;\nenable wgpu_cooperative_matrix;"));
        let src = source(32, (true, true));
        assert!(src.starts_with("enable f16;\nenable wgpu_cooperative_matrix;"));
        assert!(!source(32, (false, false)).starts_with("enable f16;"));
    }
}
