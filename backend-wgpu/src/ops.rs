//! From graph nodes to shader launches: which ops and types the backend runs
//! ([`supported`]), and for each node the pipeline variant, the tensors to bind, the
//! parameters and the workgroup counts ([`launches`]).
//!
//! [`supported`] and [`launches`] share one decision per op ([`plan`]), so that
//! `Device::supports_op` says true exactly when a launch can be built. The variants [`plan`]
//! can ask for are listed family by family by `variants` (test builds), which the naga test
//! validates.

use bytemuck::{Pod, Zeroable};
use tessera_core::{
    BinaryOp, DType, Error, GluOp, Graph, Op, Result, RopeMode, Tensor, TensorId, UnaryOp,
};

use crate::buffer::WgpuBuffer;
use crate::context::Gpu;
use crate::shader::{Family, Variant};

/// One op's parameter block, laid out as `Params` in `shaders/common.wgsl`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
pub(crate) struct Params {
    /// ne then nb of dst, src0, src1, src2, src3.
    pub desc: [[u32; 8]; 5],
    /// Byte offsets of dst, src0, src1, src2 (filled when the bindings are resolved).
    pub off: [u32; 4],
    /// src3's byte offset, then op integers (or, for a sixth binding, its byte offset).
    pub off4: [u32; 4],
    /// Op floats.
    pub f: [f32; 4],
    /// More op floats.
    pub g: [f32; 4],
    /// Op integers.
    pub u: [u32; 4],
    /// More op integers (to 256 bytes).
    pub h: [u32; 4],
}

impl Params {
    /// Sets the byte offset of storage binding `k` (0 = dst; 4 to 7 in off4; 8 and 9, which
    /// only the mat-vec with the fused rope has, in h.x and h.y).
    pub fn set_offset(&mut self, k: usize, off: u32) {
        if k < 4 {
            self.off[k] = off;
        } else if k < 8 {
            self.off4[k - 4] = off;
        } else {
            self.h[k - 8] = off;
        }
    }
}

/// One storage binding of a launch: a tensor, or a part of it, or the device's scratch buffer.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Bind {
    /// The tensor (for the scratch: the node whose launches use it).
    pub id: TensorId,
    /// Bytes from the tensor's first byte to the part bound.
    pub skip: usize,
    /// Bytes of the part (`None`: to the tensor's end).
    pub span: Option<usize>,
    /// Whether this binds the device's scratch buffer ([`crate::context::Gpu::scratch`], at
    /// least `span` bytes from its start) instead of the tensor: where one launch of a node
    /// leaves partial results for a later launch of the same node to read (the split
    /// flash-attention decode). Nothing else uses the scratch between those launches, since a
    /// graph's dispatches run in order.
    pub scratch: bool,
}

impl Bind {
    /// The whole of tensor `id`.
    pub fn whole(id: TensorId) -> Bind {
        Bind {
            id,
            skip: 0,
            span: None,
            scratch: false,
        }
    }

    /// `bytes` of the device's scratch buffer, for node `id`.
    pub fn scratch(id: TensorId, bytes: usize) -> Bind {
        Bind {
            id,
            skip: 0,
            span: Some(bytes),
            scratch: true,
        }
    }
}

/// One dispatch.
pub(crate) struct Launch {
    /// The pipeline.
    pub variant: Variant,
    /// Tensors bound in order: dst, then the sources (unused slots repeat dst).
    pub bind: Vec<Bind>,
    /// Parameters (offsets filled later).
    pub params: Params,
    /// Workgroup counts.
    pub groups: [u32; 3],
}

/// Invocations per workgroup of the element-wise families.
const EW_WG: u32 = 256;
/// Invocations per workgroup of the row families (one workgroup per row): a 4,096-value row
/// takes 16 loads an invocation (with 64, the 8B decode's rms_norm took 35 µs a row on the
/// H200, with 256 14 µs).
const ROW_WG: u32 = 256;
/// Float types the element-wise shaders read and write.
const FLOATS: [DType; 3] = [DType::F32, DType::F16, DType::BF16];
/// Head sizes flash attention is built for (the next one at or above D and DV is used).
const FA_DMAX: [u32; 4] = [64, 128, 192, 256];
/// Invocations (keys per step) of flash attention: the larger from this many keys on.
const FA_WG: [u32; 2] = [64, 256];
/// Query rows up to which flash attention runs its `decode` entry point (where k and v allow:
/// see [`fa_decode_layout`]): 32 groups of 8 invocations per row and head, each group taking
/// its own share of the keys, rather than one key per invocation.
const FA_DECODE_MAX_Q: usize = 8;
/// Query rows per workgroup of the cooperative-matrix prompt attention (`prefill`, FQ in the
/// shader), and the largest head size it takes (its staged q, k and v tiles are DMAX wide).
const FA_PREFILL_Q: usize = 64;
const FA_PREFILL_DMAX: u32 = 128;
/// Invocations per workgroup of the flash attention `decode` entry point.
const FA_DECODE_WG: u32 = 256;
/// Invocations per key in flash attention's `decode` (G in `shaders/flash_attn.wgsl`): its
/// subgroup operations need subgroups of at least this many.
const FA_DECODE_G: u32 = 8;
/// Workgroups the split flash attention decode aims for (about two per core of a large GPU):
/// fewer query rows and heads than this cut their keys into splits ([`fa_splits`]). (H200: the
/// 8B's 32 heads of one token over 256 keys took ~24 us as 32 workgroups.)
const FA_SPLIT_GROUPS: usize = 256;
/// Fewest keys per split of the split flash attention decode. (H200, 2026-11-30, 8B decode:
/// over 256 keys one pass 245.6 / 241.5 t/s, 2 splits 241.3 / 236.5, 4 splits 242.4 / 238.1, 8
/// splits 233.2 / 235.9; 1,024 tokens from an empty cache, 8 splits 234.6 against 227.9 for one
/// pass: splits pay where they hold a few hundred keys each.)
const FA_SPLIT_MIN_KEYS: usize = 256;
/// Invocations per workgroup of the flash attention `decode_combine` entry point.
const FA_COMBINE_WG: u32 = 64;
/// Tiles of the tiled mat-mat (BM x BN of dst per workgroup): see [`mat_mat_tile`].
const MM_TILES: [(u32, u32); 3] = [(64, 64), (128, 64), (128, 128)];
/// Depths of the tiled mat-mat's steps (BM x BK of src0 and BN x BK of src1 in workgroup
/// memory): the deeper one where the adapter's workgroup memory holds it.
const MM_BK: [u32; 2] = [16, 32];
/// Workgroup memory of the cooperative-matrix mat-mat's result blocks (tc in mul_mat.wgsl: 8
/// subgroups x 16 x 16 f32).
const MM_COOP_TC: u32 = 8 * 256 * 4;
/// The cooperative-matrix mat-mat's tiles (BM, BN): 8 subgroups of 32 x 32, or of 64 x 32 (the
/// larger one where dst has at least 128 columns: [`coop_big`]).
const MM_COOP_TILES: [(u32, u32); 2] = [(128, 64), (128, 128)];
/// Padding (f16 values) of each row of the cooperative-matrix mat-mat's tiles (SA in
/// mul_mat.wgsl), which keeps two tiles of each (double buffered).
const MM_COOP_PAD: u32 = 8;
/// The cooperative-matrix mat-mat's k-step (BK): each invocation loads one 8-value chunk of
/// each of two src0 rows and one 4-value quad of each of BN / 32 src1 columns a step.
const MM_COOP_BK: u32 = 32;
/// Depths of the f16 mat-mat's steps (H16: tiles of f16, half the workgroup memory).
const MM_BK_H16: [u32; 3] = [16, 32, 64];
/// k-steps the f16 mat-mat accumulates in f16 before adding into its f32 accumulators.
const MM_HK: u32 = 16;
/// Workgroups from which quantized weights take the largest mat-mat tile (below, the half-size
/// one gives twice as many workgroups to spread over the GPU's cores).
const MM_BIG_GROUPS: usize = 512;
/// Rows of src0 per mat-vec workgroup (they share each load of src1), and invocations per
/// mat-vec workgroup.
const MV_ROWS: u32 = 4;
const MV_WG: u32 = 256;
/// Columns of src1 up to which mul_mat uses mat-vec.
const MAT_VEC_MAX_N: usize = 4;
/// Weight types the integer-dot mat-vec (`mat_vec_q` in `shaders/mul_mat.wgsl`) reads.
const MVQ_TYPES: [DType; 5] = [
    DType::Q4_0,
    DType::Q4_1,
    DType::Q8_0,
    DType::Q4_K,
    DType::Q6_K,
];
/// Rows per integer-dot mat-vec workgroup: the most of these that still gives MVQ_GROUPS
/// workgroups (more rows share each quantized column; fewer give more workgroups). (H200,
/// 2026-11-30: 32 rows for tall weights such as the 8B's gate and up, 14,336 x 4,096, whose
/// 16-row workgroups spent a fifth of their time quantizing the column: 8B decode 235 -> 242
/// t/s.)
const MVQ_ROWS: [u32; 5] = [32, 16, 8, 4, 2];
/// Workgroups per column the integer-dot mat-vec aims for (about two per core of a large GPU).
const MVQ_GROUPS: usize = 256;
/// Parts of a row each invocation of the integer-dot mat-vec aims to take (TPR, the
/// invocations per row, is the parts of a row over this, rounded up to a power of two); see
/// [`mvq_parts_each`].
const MVQ_PARTS: usize = 4;
/// Invocations per integer-dot mat-vec workgroup (ROWS x TPR) at most: TPR is cut to fit
/// (and raised to make at least 32, which quantize the column).
const MVQ_WG: u32 = 512;
/// Rows at least this long (k) take [`MVQ_LONG_GROUPS`] workgroups of up to [`MVQ_LONG_WG`]
/// invocations instead: every workgroup quantizes the whole column, and for long rows half as
/// many workgroups, twice as large, spend less on that than a second workgroup per core gains.
/// (H200, 2026-12-01, `bench_model_sizes`, 8 weights rotated, m=4096 k=14336: Q4_0 18.27 ->
/// 17.70 µs, Q8_0 26.50 -> 25.89, Q4_K 20.42 -> 18.57; at k=4096 the smaller workgroups stay
/// ahead: m=4096 8.78 against 9.33 µs.)
const MVQ_LONG_K: usize = 8192;
/// Workgroups per column the integer-dot mat-vec aims for with long rows (about one per core).
const MVQ_LONG_GROUPS: usize = 128;
/// Invocations per integer-dot mat-vec workgroup at most with long rows.
const MVQ_LONG_WG: u32 = 1024;
/// Values of the column quantized into workgroup memory per step: the larger where the
/// adapter's workgroup memory holds it.
const MVQ_KC: [u32; 2] = [4096, 16384];

/// Why a node cannot run here.
fn unsupported(gpu: &Gpu, graph: &Graph, id: TensorId, why: impl std::fmt::Display) -> Error {
    let t = graph.get(id);
    Error::Unsupported {
        backend: gpu.name.clone(),
        what: format!("{} of '{}' ({})", t.op.name(), graph.label(id), why),
    }
}

/// The shape and strides of a tensor as the shaders see them.
pub(crate) fn desc(t: &Tensor) -> [u32; 8] {
    let mut d = [0u32; 8];
    for i in 0..4 {
        d[i] = t.ne[i] as u32;
        d[4 + i] = t.nb[i] as u32;
    }
    d
}

/// Whether every count and byte offset of a tensor fits the shaders' u32 arithmetic.
fn fits_u32(t: &Tensor) -> bool {
    t.nbytes() < u32::MAX as usize / 2
        && t.nelements() < u32::MAX as usize / 2
        && t.nb.iter().all(|&b| b < u32::MAX as usize / 2)
}

/// Whether tensor `id`, bound from `skip` bytes on, starts at an `n`-byte aligned offset in its
/// binding and has `n`-byte aligned row, plane and batch strides, so that a shader may read its
/// rows with `n`-byte loads (false when it has no memory yet).
pub(crate) fn aligned(gpu: &Gpu, graph: &Graph, id: TensorId, skip: usize, n: usize) -> bool {
    (gpu.limits.min_storage_buffer_offset_alignment as usize).is_multiple_of(n)
        && graph
            .data(id)
            .is_some_and(|d| (d.offset + skip).is_multiple_of(n))
        && graph.get(id).nb[1..].iter().all(|&b| b.is_multiple_of(n))
}

/// Which wide loads a mul_mat launch over weight rows from `r0` may use: (the weights as
/// 16-byte loads (float types, `k` a multiple of `float_k`) or as whole aligned words
/// (quantized types whose blocks are whole words) — the A4 and AL defines; the f32 activations
/// as 16-byte loads — Y4).
fn wide_loads(gpu: &Gpu, graph: &Graph, t: &Tensor, r0: usize, float_k: usize) -> (bool, bool) {
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

/// Workgroup counts for `n` workgroups laid out over x then y.
fn grid(n: usize) -> Option<[u32; 3]> {
    let n = n.max(1);
    let x = n.min(65535);
    let y = n.div_ceil(x);
    (y <= 65535).then_some([x as u32, y as u32, 1])
}

/// The decision for one node: a variant, the tensors to bind, parameters, workgroups.
pub(crate) struct PlanOut {
    /// The pipeline.
    pub variant: Variant,
    /// Tensors bound in order (as [`Launch::bind`]).
    pub bind: Vec<Bind>,
    /// Parameters.
    pub params: Params,
    /// Workgroups, laid out by [`grid`] (unless `groups_3d`).
    pub groups: usize,
    /// Workgroup counts as they are.
    pub groups_3d: Option<[u32; 3]>,
}

/// Decides how node `id` runs (one launch, or several: a mul_mat whose weights are split
/// across bindings, a flash attention decode split over the keys and its merge), or why it
/// cannot.
pub(crate) fn plan(
    gpu: &Gpu,
    graph: &Graph,
    id: TensorId,
) -> std::result::Result<Vec<PlanOut>, String> {
    let t = graph.get(id);
    let srcs: Vec<&Tensor> = t.src.iter().map(|&s| graph.get(s)).collect();
    // A mul_mat's weights may be larger: they are bound in row ranges (below).
    let whole = srcs
        .iter()
        .enumerate()
        .filter(|&(k, _)| !(k == 0 && t.op == Op::MulMat))
        .map(|(_, s)| *s);
    if srcs
        .first()
        .is_some_and(|a| a.nb.iter().any(|&b| b >= u32::MAX as usize / 2))
    {
        return Err("strides too large for 32-bit indexing".into());
    }
    let usable = (gpu.max_binding() as usize)
        .saturating_sub(gpu.limits.min_storage_buffer_offset_alignment as usize + 16);
    for x in std::iter::once(t).chain(whole) {
        if !fits_u32(x) {
            return Err(format!(
                "a tensor of {:?} is too large for 32-bit indexing",
                x.ne
            ));
        }
        if x.nbytes() > usable {
            return Err(format!(
                "a tensor of {} bytes exceeds the largest storage binding ({usable} bytes)",
                x.nbytes()
            ));
        }
    }
    let mut p = Params::default();
    p.desc[0] = desc(t);
    for (k, s) in srcs.iter().enumerate().take(4) {
        p.desc[k + 1] = desc(s);
    }
    let n = t.nelements();
    let ew = |variant: Variant, bind: Vec<TensorId>, mut p: Params, count: usize| {
        p.u[0] = count as u32;
        let bind = bind.into_iter().map(Bind::whole).collect();
        let wg = ew_wg(&variant);
        vec![PlanOut {
            variant: variant.def("WG", wg),
            bind,
            params: p,
            groups: count.div_ceil(wg as usize),
            groups_3d: None,
        }]
    };
    match &t.op {
        Op::Unary(_) | Op::Scale { .. } | Op::Clamp { .. } => {
            let a = srcs[0].dtype;
            let op = match &t.op {
                Op::Scale { scale, bias } => {
                    p.f[0] = *scale;
                    p.f[1] = *bias;
                    1
                }
                Op::Clamp { min, max } => {
                    p.f[0] = *min;
                    p.f[1] = *max;
                    2
                }
                _ => {
                    10 + UnaryOp::ALL
                        .iter()
                        .position(|x| Op::Unary(*x) == t.op)
                        .unwrap_or(0) as u32
                }
            };
            if !FLOATS.contains(&a) {
                return Err(format!("type {a}"));
            }
            Ok(ew(unary_variant(op, a, t.dtype), vec![id, t.src[0]], p, n))
        }
        Op::Cpy | Op::Cont | Op::Dup => {
            let a = srcs[0];
            let (from, to) = (a.dtype, t.dtype);
            let op = if FLOATS.contains(&from) && FLOATS.contains(&to) {
                0
            } else if from == to && from.type_size() == 4 && !from.is_quantized() {
                3
            } else if DType::QUANTIZED.contains(&from) && to == DType::F32 && a.rows_contiguous() {
                4
            } else if from == to && from.is_quantized() && t.is_contiguous() {
                p.u[1] = t.nbytes() as u32;
                p.u[2] = t.row_bytes() as u32;
                return Ok(ew(
                    unary_variant(5, from, to),
                    vec![id, t.src[0]],
                    p,
                    t.nbytes() / 4 + 2,
                ));
            } else if FLOATS.contains(&from) && DType::QUANTIZED.contains(&to) && t.is_contiguous()
            {
                return Ok(ew(
                    unary_variant(6, from, to),
                    vec![id, t.src[0]],
                    p,
                    n / to.block_size(),
                ));
            } else {
                return Err(format!("copy from {from} to {to}"));
            };
            Ok(ew(unary_variant(op, from, to), vec![id, t.src[0]], p, n))
        }
        Op::Binary(b) => {
            let (a, c) = (srcs[0].dtype, srcs[1].dtype);
            if !FLOATS.contains(&a) || !FLOATS.contains(&c) {
                return Err(format!("types {a} and {c}"));
            }
            Ok(ew(
                binary_variant(*b, a, c),
                vec![id, t.src[0], t.src[1]],
                p,
                n,
            ))
        }
        Op::Glu { op, swapped } => {
            let a = srcs[0].dtype;
            if !matches!(a, DType::F32 | DType::F16) {
                return Err(format!("type {a}"));
            }
            p.u[1] = u32::from(srcs.len() == 2);
            p.u[2] = u32::from(*swapped);
            let up = t.src.get(1).copied().unwrap_or(id);
            Ok(ew(glu_variant(*op, a), vec![id, t.src[0], up], p, n))
        }
        Op::RmsNorm { eps } | Op::Norm { eps } => {
            p.f[0] = *eps;
            p.u[0] = t.nrows() as u32;
            let op = u32::from(matches!(t.op, Op::Norm { .. }));
            Ok(rows(
                norm_variant(op, false),
                vec![id, t.src[0]],
                p,
                t.nrows(),
            ))
        }
        Op::SoftMax { scale, max_bias } => {
            let mask = srcs.get(1).map(|m| m.dtype);
            if mask.is_some_and(|m| !matches!(m, DType::F32 | DType::F16)) {
                return Err("mask type".into());
            }
            p.f[0] = *scale;
            alibi(&mut p, *max_bias, t.ne[2]);
            p.u[0] = t.nrows() as u32;
            p.u[1] = u32::from(mask.is_some());
            if mask.is_none() {
                p.desc[2] = [1, 1, 1, 1, 0, 0, 0, 0];
            }
            let bind = vec![id, t.src[0], t.src.get(1).copied().unwrap_or(id)];
            Ok(rows(soft_max_variant(mask), bind, p, t.nrows()))
        }
        Op::Rope(r) => {
            let a = srcs[0].dtype;
            if !matches!(a, DType::F32 | DType::F16) {
                return Err(format!("type {a}"));
            }
            let per_row = r.n_dims / 2 + t.ne[0] - r.n_dims;
            let count = per_row * t.nrows();
            p.f[0] = r.freq_base.log2();
            p.f[1] = r.freq_scale;
            p.u[1] = r.n_dims as u32;
            p.u[2] = if r.mode == RopeMode::Neox { 2 } else { 0 };
            Ok(ew(rope_variant(a), vec![id, t.src[0], t.src[1]], p, count))
        }
        Op::GetRows => {
            let a = srcs[0].dtype;
            let v = if FLOATS.contains(&a) || DType::QUANTIZED.contains(&a) {
                rows_variant(0, a, DType::I32, DType::F32)
            } else if a == DType::I32 {
                rows_variant(1, a, DType::I32, DType::I32)
            } else {
                return Err(format!("type {a}"));
            };
            // idx is [m, d2, d3]: its ne/nb move into slots 0..3 of src1's desc as is.
            Ok(ew(v, vec![id, t.src[0], t.src[1]], p, n))
        }
        Op::SetRows => {
            let (d, idx) = (t.dtype, srcs[2].dtype);
            if !FLOATS.contains(&d) && !DType::QUANTIZED.contains(&d) {
                return Err(format!("destination type {d}"));
            }
            // Slots: dst = a (this node's memory), src0 = the f32 rows, src1 = indices.
            p.desc[1] = desc(srcs[1]);
            p.desc[2] = desc(srcs[2]);
            let (op, count) = if d.is_quantized() {
                (3, srcs[1].nelements() / d.block_size())
            } else {
                (2, srcs[1].nelements())
            };
            Ok(ew(
                rows_variant(op, DType::F32, idx, d),
                vec![id, t.src[1], t.src[2]],
                p,
                count,
            ))
        }
        Op::MulMat => {
            let (a, b) = (srcs[0], srcs[1]);
            let float_b = matches!(b.dtype, DType::F32 | DType::F16)
                || (b.dtype == DType::BF16 && FLOATS.contains(&a.dtype));
            if !(FLOATS.contains(&a.dtype) || DType::QUANTIZED.contains(&a.dtype)) || !float_b {
                return Err(format!("types {} x {}", a.dtype, b.dtype));
            }
            p.u[1] = (b.ne[2] / a.ne[2]) as u32;
            p.u[2] = (b.ne[3] / a.ne[3]) as u32;
            // Weights larger than one storage binding run as several launches over row ranges.
            let chunk = if a.nbytes() <= usable {
                a.ne[1]
            } else if a.ne[2] * a.ne[3] == 1 && a.nb[1] <= usable {
                usable / a.nb[1]
            } else {
                return Err(format!(
                    "src0 of {} bytes exceeds a storage binding and is not a 2-D matrix",
                    a.nbytes()
                ));
            };
            let h16 = mat_mat_h16(gpu.mat_mat_f16, a.dtype);
            // The cooperative-matrix mat-mat reads f16 weights as 16-byte chunks of 8 values.
            let chunks = a.dtype.is_quantized()
                || (a.ne[0].is_multiple_of(8) && wide_loads(gpu, graph, t, 0, 8).0);
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
                let mvq = (t.ne[1] <= MAT_VEC_MAX_N)
                    .then(|| mat_vec_q_shape(gpu, graph, t, r0, rc))
                    .flatten();
                if let Some((rows, wg, kc, a4)) = mvq {
                    let groups = rc.div_ceil(rows as usize) * t.ne[1] * t.ne[2] * t.ne[3];
                    p.u[0] = groups as u32;
                    let (_, y4) = wide_loads(gpu, graph, t, r0, 8);
                    let v = mat_vec_q_specialized(
                        mat_vec_q_sized(
                            mat_vec_q_variant(a.dtype, b.dtype, gpu.subgroups, a4, y4),
                            (rows, wg, kc),
                            a.ne[0],
                            gpu.subgroups.then_some(gpu.subgroup_min),
                        ),
                        (t.ne[1] * t.ne[2] * t.ne[3] == 1).then_some((rc, a.nb[1])),
                    );
                    out.push(PlanOut {
                        variant: v,
                        bind,
                        params: p,
                        groups,
                        groups_3d: None,
                    });
                } else if t.ne[1] <= MAT_VEC_MAX_N {
                    let groups = rc.div_ceil(MV_ROWS as usize) * t.ne[1] * t.ne[2] * t.ne[3];
                    p.u[0] = groups as u32;
                    let (wide_a, y4) = wide_loads(gpu, graph, t, r0, 8);
                    let v = mat_vec_variant(a.dtype, b.dtype, gpu.subgroups, wide_a, y4);
                    out.push(PlanOut {
                        variant: v,
                        bind,
                        params: p,
                        groups,
                        groups_3d: None,
                    });
                } else {
                    let z = t.ne[2] * t.ne[3];
                    let gx = rc.div_ceil(bm as usize);
                    let gy = t.ne[1].div_ceil(bn as usize);
                    if z > 65535 || gx > 65535 || gy > 65535 {
                        return Err(format!("{:?} needs too many workgroups", t.ne));
                    }
                    let (wide_a, y4) = wide_loads(gpu, graph, t, r0, 4);
                    let v = mat_mat_variant(a.dtype, b.dtype, tile, wide_a, y4, (h16, coop));
                    out.push(PlanOut {
                        variant: v,
                        bind,
                        params: p,
                        groups: 0,
                        groups_3d: Some([gx as u32, gy as u32, z as u32]),
                    });
                }
            }
            Ok(out)
        }
        Op::FlashAttnExt {
            scale,
            max_bias,
            logit_softcap,
        } => {
            let (q, k, v) = (srcs[0], srcs[1], srcs[2]);
            let mask = srcs.get(3).map(|m| m.dtype);
            let need = q.ne[0].max(v.ne[0]) as u32;
            let Some(&dmax) = FA_DMAX.iter().find(|&&d| d >= need) else {
                return Err(format!(
                    "head size {need} (at most {})",
                    FA_DMAX[FA_DMAX.len() - 1]
                ));
            };
            if !matches!(k.dtype, DType::F32 | DType::F16)
                || !matches!(v.dtype, DType::F32 | DType::F16)
            {
                return Err(format!("k and v types {} and {}", k.dtype, v.dtype));
            }
            if mask.is_some_and(|m| !matches!(m, DType::F32 | DType::F16)) {
                return Err("mask type".into());
            }
            let groups = q.ne[1] * q.ne[2] * q.ne[3];
            p.f[0] = *scale;
            alibi(&mut p, *max_bias, q.ne[2]);
            p.g[0] = *logit_softcap;
            p.u[0] = groups as u32;
            p.u[1] = u32::from(mask.is_some());
            p.u[3] = (q.ne[2] / k.ne[2]) as u32;
            p.off4[1] = (q.ne[3] / k.ne[3]) as u32;
            if mask.is_none() {
                p.desc[4] = [1, 1, 1, 1, 0, 0, 0, 0];
            }
            let bind = [
                id,
                t.src[0],
                t.src[1],
                t.src[2],
                t.src.get(3).copied().unwrap_or(id),
            ]
            .map(Bind::whole)
            .to_vec();
            let decode = q.ne[1] <= FA_DECODE_MAX_Q
                && fa_decode_layout(gpu, graph, t.src[1])
                && fa_decode_layout(gpu, graph, t.src[2]);
            let var = if decode {
                let var = flash_attn_decode_variant(
                    k.dtype,
                    v.dtype,
                    mask,
                    dmax,
                    gpu.subgroups && gpu.subgroup_min >= FA_DECODE_G,
                    [t.src[1], t.src[2]].map(|id| fa_decode_wide(gpu, graph, id)),
                );
                let nkv = k.ne[1];
                let mut splits = fa_splits(groups, nkv);
                // Each split's maximum, sum and output (DV f32), in one binding.
                let scratch_bytes = groups * splits * (v.ne[0] + 2) * 4;
                if scratch_bytes > usable {
                    splits = 1;
                }
                let per = nkv.div_ceil(splits).max(1);
                p.h[0] = splits as u32;
                p.h[1] = per as u32;
                if splits > 1 {
                    // The splits' partial results go to the scratch, then one workgroup per
                    // row and head merges them into dst.
                    let scratch = Bind::scratch(id, scratch_bytes);
                    let mut split = p;
                    split.u[0] = (groups * splits) as u32;
                    let mut first = bind;
                    first[0] = scratch;
                    return Ok(vec![
                        PlanOut {
                            variant: var.def("SPLIT", 1),
                            bind: first,
                            params: split,
                            groups: groups * splits,
                            groups_3d: None,
                        },
                        PlanOut {
                            variant: flash_attn_combine_variant(dmax),
                            bind: vec![Bind::whole(id), scratch],
                            params: p,
                            groups,
                            groups_3d: None,
                        },
                    ]);
                }
                var
            } else if gpu.coop
                && dmax <= FA_PREFILL_DMAX
                && fa_prefill_fits(gpu.limits.max_compute_workgroup_storage_size, dmax)
                && q.ne[0].is_multiple_of(16)
                && v.ne[0].is_multiple_of(16)
            {
                // One workgroup per FA_PREFILL_Q query rows of each head.
                let blocks = q.ne[1].div_ceil(FA_PREFILL_Q) * q.ne[2] * q.ne[3];
                p.u[0] = blocks as u32;
                return Ok(vec![PlanOut {
                    variant: flash_attn_prefill_variant(
                        k.dtype,
                        v.dtype,
                        mask,
                        dmax,
                        fa_decode_wide(gpu, graph, t.src[1])
                            && fa_decode_wide(gpu, graph, t.src[2]),
                    ),
                    bind,
                    params: p,
                    groups: blocks,
                    groups_3d: None,
                }]);
            } else {
                let wg = if k.ne[1] >= FA_WG[1] as usize {
                    FA_WG[1]
                } else {
                    FA_WG[0]
                };
                flash_attn_variant("main", k.dtype, v.dtype, mask, dmax).def("WG", wg)
            };
            Ok(vec![PlanOut {
                variant: var,
                bind,
                params: p,
                groups,
                groups_3d: None,
            }])
        }
        Op::SumRows | Op::Mean | Op::Argmax | Op::Sum => {
            let a = srcs[0].dtype;
            if !FLOATS.contains(&a) {
                return Err(format!("type {a}"));
            }
            let op = match t.op {
                Op::SumRows => 0,
                Op::Mean => 1,
                Op::Argmax => 2,
                _ => 3,
            };
            let rows_n = if op == 3 { 1 } else { srcs[0].nrows() };
            p.u[0] = rows_n as u32;
            Ok(rows(
                reduce_variant(op, a, t.dtype),
                vec![id, t.src[0]],
                p,
                rows_n,
            ))
        }
        Op::Concat(axis) => {
            let a = srcs[0].dtype;
            if !FLOATS.contains(&a) && a != DType::I32 {
                return Err(format!("type {a}"));
            }
            p.u[1] = *axis as u32;
            Ok(ew(
                shape_variant(0, a, a),
                vec![id, t.src[0], t.src[1]],
                p,
                n,
            ))
        }
        Op::Repeat | Op::Pad(_) | Op::DiagMaskInf(_) => {
            let a = srcs[0].dtype;
            if !(FLOATS.contains(&a) || (a == DType::I32 && t.op == Op::Repeat)) {
                return Err(format!("type {a}"));
            }
            let op = match t.op {
                Op::Repeat => 1,
                Op::Pad(_) => 2,
                _ => 3,
            };
            if let Op::DiagMaskInf(n_past) = t.op {
                p.u[1] = n_past as u32;
            }
            Ok(ew(
                shape_variant(op, a, t.dtype),
                vec![id, t.src[0], id],
                p,
                n,
            ))
        }
        Op::Arange { start, step, .. } => {
            p.f[0] = *start;
            p.f[1] = *step;
            Ok(ew(
                shape_variant(4, DType::F32, DType::F32),
                vec![id, id, id],
                p,
                n,
            ))
        }
        op => Err(format!("op {}", op.name())),
    }
}

/// Invocations per workgroup of an element-wise variant: one for quantizing into K types (their
/// scratch is workgroup memory, see `quantize.wgsl`), else [`EW_WG`].
fn ew_wg(v: &Variant) -> u32 {
    let kquant = DType::QUANTIZED
        .iter()
        .any(|&t| t.block_size() == 256 && v.is_type("DT", t));
    if kquant {
        1
    } else {
        EW_WG
    }
}

/// A row family's plan: one workgroup per row.
fn rows(variant: Variant, bind: Vec<TensorId>, params: Params, n_rows: usize) -> Vec<PlanOut> {
    let bind = bind.into_iter().map(Bind::whole).collect();
    vec![PlanOut {
        variant: variant.def("WG", ROW_WG),
        bind,
        params,
        groups: n_rows,
        groups_3d: None,
    }]
}

/// ALiBi parameters (ggml's): m0, m1 and n_head_log2 for `heads` heads.
fn alibi(p: &mut Params, max_bias: f32, heads: usize) {
    p.f[1] = max_bias;
    if max_bias > 0.0 {
        let n_log2 = 1u32 << (heads.max(1) as f32).log2().floor() as u32;
        p.f[2] = 2f32.powf(-max_bias / n_log2 as f32);
        p.f[3] = 2f32.powf(-max_bias / 2.0 / n_log2 as f32);
        p.u[2] = n_log2;
    }
}

/// Checks that node `id` can run on this device.
pub(crate) fn supported(gpu: &Gpu, graph: &Graph, id: TensorId) -> Result<()> {
    let t = graph.get(id);
    if t.op.is_view() || t.op == Op::None {
        return Ok(());
    }
    plan(gpu, graph, id)
        .map(|_| ())
        .map_err(|why| unsupported(gpu, graph, id, why))
}

/// The launches of node `id` (none for views and leaves).
pub(crate) fn launches(gpu: &Gpu, graph: &Graph, id: TensorId) -> Result<Vec<Launch>> {
    let t = graph.get(id);
    if t.op.is_view() || t.op == Op::None || t.nelements() == 0 {
        return Ok(Vec::new());
    }
    let plans = plan(gpu, graph, id).map_err(|why| unsupported(gpu, graph, id, why))?;
    plans
        .into_iter()
        .map(|out| to_launch(gpu, graph, id, out))
        .collect()
}

/// The launch of a plan made for node `id`: its workgroup counts, and its bindings padded to
/// the family's count with the destination.
pub(crate) fn to_launch(gpu: &Gpu, graph: &Graph, id: TensorId, out: PlanOut) -> Result<Launch> {
    let groups = match out.groups_3d {
        Some(g) => g,
        None => {
            grid(out.groups).ok_or_else(|| unsupported(gpu, graph, id, "too many workgroups"))?
        }
    };
    let mut bind = out.bind;
    let n = out.variant.storage_bindings();
    while bind.len() < n {
        bind.push(bind[0]);
    }
    Ok(Launch {
        variant: out.variant,
        bind,
        params: out.params,
        groups,
    })
}

/// Appends to `out` everything about `nodes` that decides their launches: each node's and
/// source's op and op parameters, type, shape, strides and memory (buffer id and offset).
pub(crate) fn fingerprint(graph: &Graph, nodes: &[TensorId], out: &mut Vec<u64>) {
    for &id in nodes {
        let t = graph.get(id);
        out.push(u64::from(id.0));
        op_words(&t.op, out);
        tensor_words(graph, id, out);
        for &s in &t.src {
            tensor_words(graph, s, out);
        }
    }
}

/// A tensor's type, shape, strides and memory, as words.
fn tensor_words(graph: &Graph, id: TensorId, out: &mut Vec<u64>) {
    let t = graph.get(id);
    out.push(u64::from(t.dtype.gguf_id()));
    out.extend(t.ne.iter().chain(&t.nb).map(|&x| x as u64));
    match graph.data(id) {
        Some(d) => {
            let buffer = d
                .buffer
                .as_any()
                .downcast_ref::<WgpuBuffer>()
                .map_or(u64::MAX, |b| b.id);
            out.extend([buffer, d.offset as u64]);
        }
        None => out.extend([u64::MAX, u64::MAX]),
    }
}

/// An op and its parameters, as words.
fn op_words(op: &Op, out: &mut Vec<u64>) {
    let f = |x: f32| u64::from(x.to_bits());
    let name = op
        .name()
        .bytes()
        .fold(0u64, |h, b| h.wrapping_mul(31).wrapping_add(u64::from(b)));
    out.push(name);
    match op {
        Op::Permute(a) | Op::Pad(a) => out.extend(a.iter().map(|&x| x as u64)),
        Op::Scale { scale: a, bias: b }
        | Op::Clamp { min: a, max: b }
        | Op::SoftMax {
            scale: a,
            max_bias: b,
        } => out.extend([f(*a), f(*b)]),
        Op::Glu { swapped, .. } => out.push(u64::from(*swapped)),
        Op::RmsNorm { eps } | Op::Norm { eps } => out.push(f(*eps)),
        Op::Rope(p) => out.extend([
            p.n_dims as u64,
            u64::from(p.mode == RopeMode::Neox),
            f(p.freq_base),
            f(p.freq_scale),
        ]),
        Op::FlashAttnExt {
            scale,
            max_bias,
            logit_softcap,
        } => out.extend([f(*scale), f(*max_bias), f(*logit_softcap)]),
        Op::Concat(x) | Op::DiagMaskInf(x) => out.push(*x as u64),
        Op::Arange { start, stop, step } => out.extend([f(*start), f(*stop), f(*step)]),
        _ => {}
    }
}

fn unary_variant(op: u32, from: DType, to: DType) -> Variant {
    Variant::new(Family::Unary, "main")
        .def("OP", op)
        .ty("T0", from)
        .ty("DT", to)
}

fn binary_variant(op: BinaryOp, a: DType, b: DType) -> Variant {
    let code = match op {
        BinaryOp::Add => 0,
        BinaryOp::Sub => 1,
        BinaryOp::Mul => 2,
        BinaryOp::Div => 3,
    };
    Variant::new(Family::Binary, "main")
        .def("OP", code)
        .ty("T0", a)
        .ty("T1", b)
        .ty("DT", a)
}

fn glu_variant(op: GluOp, a: DType) -> Variant {
    let code = u32::from(op == GluOp::Geglu);
    Variant::new(Family::Glu, "main")
        .def("OP", code)
        .ty("T0", a)
        .ty("T1", a)
        .ty("DT", a)
}

/// The norm variant: op 0 rms_norm, 1 norm; `mul`: times a weight row (MUL, fused).
fn norm_variant(op: u32, mul: bool) -> Variant {
    Variant::new(Family::Norm, "main")
        .def("OP", op)
        .def("MUL", u32::from(mul))
}

fn soft_max_variant(mask: Option<DType>) -> Variant {
    Variant::new(Family::SoftMax, "main").ty("T1", mask.unwrap_or(DType::F32))
}

fn rope_variant(a: DType) -> Variant {
    Variant::new(Family::Rope, "main").ty("T0", a).ty("DT", a)
}

/// The fused rope of K (f32) with the stores of K and V into caches of type `cache` (KV).
pub(crate) fn rope_kv_variant(cache: DType) -> Variant {
    let v = rope_variant(DType::F32).def("KV", 1).ty("DT", cache);
    let wg = ew_wg(&v);
    v.def("WG", wg)
}

fn rows_variant(op: u32, src: DType, idx: DType, to: DType) -> Variant {
    Variant::new(Family::Rows, "main")
        .def("OP", op)
        .def("QUANT", u32::from(src.is_quantized()))
        .ty("T0", src)
        .ty("T1", idx)
        .ty("DT", to)
}

/// The mat-vec variant for weights of type `a` and activations of type `b`. `aligned`: the
/// weights may be read with 16-byte loads (a float type: A4) or their blocks start at 4-byte
/// aligned offsets (a quantized type whose blocks are whole words: AL); `y4`: the f32
/// activations may be read with 16-byte loads.
fn mat_vec_variant(a: DType, b: DType, subgroups: bool, aligned: bool, y4: bool) -> Variant {
    // Values per block and invocations per block (each takes 8 values: `shaders/mul_mat.wgsl`).
    let (qb, tpb) = if !a.is_quantized() {
        (8, 1)
    } else if a.block_size() == 256 {
        (256, 32)
    } else {
        (32, 4)
    };
    Variant::new(Family::MulMat, "mat_vec")
        .def("QUANT", u32::from(a.is_quantized()))
        .def("SUBGROUPS", u32::from(subgroups))
        .def("A4", u32::from(aligned && !a.is_quantized()))
        .def("AL", u32::from(aligned && a.is_quantized()))
        .def("Y4", u32::from(y4))
        .def("QB", qb)
        .def("TPB", tpb)
        .def("WG", MV_WG)
        .def("ROWS", MV_ROWS)
        .def("BM", MM_TILES[0].0)
        .def("BN", MM_TILES[0].1)
        .def("BK", MM_BK[0])
        .def("HK", MM_BK[0])
        .ty("T0", a)
        .ty("T1", b)
}

/// Values per block and parts per block of the integer-dot mat-vec for weights of type `a`
/// (see `mat_vec_q` in `shaders/mul_mat.wgsl`). A Q4_K part is a whole 64-value group, whose
/// two sub-blocks share the head's loads and the scales' decode (H200, 2026-12-01,
/// `bench_model_sizes`, 8 weights rotated, against 32-value parts: m=4096 k=14336 17.33 ->
/// 15.82 µs, m=14336 k=4096 20.04 -> 16.72, the 128256-row output head 128.5 -> 100.4).
fn mvq_parts(a: DType) -> (u32, u32) {
    match a {
        DType::Q8_0 => (32, 2),
        DType::Q4_K => (256, 4),
        DType::Q6_K => (256, 4),
        _ => (32, 1),
    }
}

/// Parts of a row each invocation of the integer-dot mat-vec of weights of type `a` aims to
/// take: [`MVQ_PARTS`], and half as many of Q4_K's, which are twice as long as they were when
/// the rule was set (H200, 2026-12-01, `bench_model_sizes`, 8 weights rotated, Q4_K m=4096
/// k=4096: 16 rows x 512 invocations 8.13 µs, the 16 x 256 that four parts give 8.46).
fn mvq_parts_each(a: DType) -> usize {
    if a == DType::Q4_K {
        MVQ_PARTS / 2
    } else {
        MVQ_PARTS
    }
}

/// Whether the integer-dot mat-vec of weights of type `a` keeps two parts per invocation in
/// flight (PF2 in `mat_vec_q`). (H200, 2026-12-01, `bench_model_sizes`, 8 weights rotated,
/// m=4096 k=14336: Q4_0 17.28 -> 16.72 µs, Q4_1 17.24 -> 16.36, Q8_0 25.68 -> 23.64, but Q4_K
/// 18.12 -> 19.05; Q6_K's parts are too large (session 15: it spills); 8B decode on wgpu:0
/// 282.5 -> 291.5 t/s.)
fn mvq_two_in_flight(a: DType) -> bool {
    matches!(a, DType::Q4_0 | DType::Q4_1 | DType::Q8_0)
}

/// Whether mul_mat `t` (mat-vec sized) over weight rows `r0 .. r0 + rows` runs as the
/// integer-dot mat-vec, and its (ROWS, WG, KC, A4) (TPR = WG / ROWS): a weight type of [`MVQ_TYPES`] whose rows
/// start at 4-byte aligned offsets (A4: Q4_K rows at 16-byte aligned ones, read as 16-byte
/// words), on a device whose limits hold the workgroup.
fn mat_vec_q_shape(
    gpu: &Gpu,
    graph: &Graph,
    t: &Tensor,
    r0: usize,
    rows: usize,
) -> Option<(u32, u32, u32, bool)> {
    let a = graph.get(t.src[0]);
    if !MVQ_TYPES.contains(&a.dtype) || !aligned(gpu, graph, t.src[0], r0 * a.nb[1], 4) {
        return None;
    }
    let a4 = a.dtype == DType::Q4_K && aligned(gpu, graph, t.src[0], r0 * a.nb[1], 16);
    let (qb, tpb) = mvq_parts(a.dtype);
    let parts = a.ne[0] / qb as usize * tpb as usize;
    let (groups, most) = if a.ne[0] >= MVQ_LONG_K {
        (MVQ_LONG_GROUPS, MVQ_LONG_WG)
    } else {
        (MVQ_GROUPS, MVQ_WG)
    };
    let nr = MVQ_ROWS
        .into_iter()
        .find(|&r| rows.div_ceil(r as usize) >= groups)
        .unwrap_or(MVQ_ROWS[MVQ_ROWS.len() - 1]);
    let max_wg = most.min(gpu.limits.max_compute_invocations_per_workgroup);
    let tpr = (parts.div_ceil(mvq_parts_each(a.dtype)).next_power_of_two() as u32)
        .clamp(32 / nr, max_wg / nr);
    let wg = nr * tpr;
    let l = &gpu.limits;
    if wg > l.max_compute_invocations_per_workgroup || wg > l.max_compute_workgroup_size_x {
        return None;
    }
    let kc = mvq_kc(l.max_compute_workgroup_storage_size, wg)?;
    Some((nr, wg, kc, a4))
}

/// The deepest of [`MVQ_KC`] whose quantized column (KC bytes and KC / 8 of scales) and
/// reduction scratch (WG f32) fit `wg_mem` bytes.
fn mvq_kc(wg_mem: u32, wg: u32) -> Option<u32> {
    MVQ_KC
        .into_iter()
        .rev()
        .find(|&kc| kc + kc / 8 + 4 * wg <= wg_mem)
}

/// The plan `out` of mul_mat `id` as the integer-dot mat-vec, shaped (ROWS, WG, TPR, KC) for
/// one dispatch over `rows` rows in all (the fused Q, K and V, whose K and V rows count once:
/// a workgroup computes the same rows of both); `None` where that shape does not fit the
/// device or loses A4.
pub(crate) fn mat_vec_q_reshaped(
    gpu: &Gpu,
    graph: &Graph,
    id: TensorId,
    mut out: PlanOut,
    rows: usize,
) -> Option<PlanOut> {
    let t = graph.get(id);
    let (nr, wg, kc, a4) = mat_vec_q_shape(gpu, graph, t, 0, rows)?;
    if out.variant.get("A4") != Some(u32::from(a4)) {
        return None;
    }
    out.variant = mat_vec_q_sized(
        out.variant,
        (nr, wg, kc),
        graph.get(t.src[0]).ne[0],
        gpu.subgroups.then_some(gpu.subgroup_min),
    );
    Some(out)
}

/// Integer-dot mat-vec variant `v` shaped (ROWS, WG, KC) = `shape` (TPR = WG / ROWS invocations
/// per row) for rows of `k` values, compiled in as KK (H200, 2026-12-01, `bench_model_sizes`, 8
/// weights rotated, m=4096 k=14336: Q4_0 15.32 -> 15.22 µs, Q4_K 15.26 -> 15.18, Q6_K 26.53 ->
/// 26.18; 8B decode within noise, 332.1 -> 333.8 t/s), and YK, the column's quantization taking
/// it too (Q4_0 14.87 -> 14.68, Q4_K 14.49 -> 14.42, Q8_0 23.42 -> 23.18, 8B decode 345.8 ->
/// 357.1; Q6_K lost then, 25.11 -> 26.07, and gained once the quantization rounded by an add,
/// 25.14 -> 24.75). `subgroup_min`: the adapter's smallest subgroup size where the variant uses
/// subgroups; where a row's TPR invocations fit in it, the row sums are added by subgroup
/// shuffles (RSUB) instead of a tree through workgroup memory (H200, 2026-12-01,
/// `bench_model_sizes`, 8 weights rotated, m=4096 k=14336, TPR 32: Q4_0 17.73 -> 17.29 µs, Q4_K
/// 18.64 -> 18.18, Q8_0 25.96 -> 25.52); where it is 8 or more, the column is quantized with
/// coalesced loads, 8 invocations a block (YC), QPS quads an invocation a step (see
/// [`mvq_quads_per_step`]). Where that quantization is one chunk of one step (k at most KC and
/// at most the 4 x QPS x WG values a step loads), QF issues the column's loads before the first
/// weights', for every type but Q4_0 and Q4_1 (H200, 2026-12-01, same bench: Q8_0 22.47 ->
/// 21.37, Q6_K 26.07 -> 25.37, and, once the quantization rounded by an add (`q8x4`), Q4_K 13.65
/// -> 13.09, but Q4_0 13.57 -> 13.87; BENCHMARKS.md, session 22). Decided here, so that a
/// variant shaped again ([`mat_vec_q_reshaped`]) never keeps a QF its new shape does not allow.
fn mat_vec_q_sized(
    v: Variant,
    (rows, wg, kc): (u32, u32, u32),
    k: usize,
    subgroup_min: Option<u32>,
) -> Variant {
    let tpr = wg / rows;
    let qps = mvq_quads_per_step(k, kc, wg);
    let yc = subgroup_min.is_some_and(|s| s >= 8);
    let one_step = yc && k <= kc as usize && k <= (4 * qps * wg) as usize;
    let qf = one_step && !v.is_type("T0", DType::Q4_0) && !v.is_type("T0", DType::Q4_1);
    v.def("ROWS", rows)
        .def("KK", k as u32)
        .def("YK", 1)
        .def("WG", wg)
        .def("TPR", tpr)
        .def("KC", kc)
        .def("QPS", qps)
        .def("RSUB", u32::from(subgroup_min.is_some_and(|s| tpr <= s)))
        .def("YC", u32::from(yc))
        .def("QF", u32::from(qf))
}

/// The quads (4 values) of the column each invocation of a `wg`-invocation integer-dot mat-vec
/// loads per step of its quantization (QPS with YC in `mat_vec_q`): the quads of a chunk of up
/// to `kc` of the `k` values over `wg`, rounded up to 1, 2 or 4, so that a step loads few
/// values past the chunk and its loads go out together. (H200, 2026-12-01, `bench_model_sizes`,
/// 8 weights rotated, against the earlier quantization (two invocations a block, four
/// neighbouring quads each): m=4096 k=14336 (QPS 4) Q4_0 16.90 -> 16.52 µs, Q6_K 29.79 ->
/// 28.61; m=14336 k=4096 (QPS 2) Q4_0 20.55 -> 20.05; 8B decode 288.9 -> 306.3 t/s, with the
/// step's quads fixed at 4: 299.5.)
fn mvq_quads_per_step(k: usize, kc: u32, wg: u32) -> u32 {
    let quads = k.min(kc as usize).div_ceil(4);
    (quads.div_ceil(wg as usize).next_power_of_two() as u32).min(4)
}

/// Integer-dot mat-vec variant `v` with what the plan knows compiled in where dst is one column
/// of `rows` rows (no batch dimensions) with weight rows `stride` bytes apart (`one_column`:
/// `Some((rows, stride))`): ONECOL (no coordinates to divide out), MM (the row count, and with
/// it the workgroup count) and RS (the row stride). H200, 2026-12-01, `bench_model_sizes`, 8
/// weights rotated, m=4096 k=14336: ONECOL Q4_0 15.21 -> 14.88 µs, Q4_K 15.15 -> 14.48, Q6_K
/// 26.22 -> 25.17, Q8_0 23.26 -> 23.42, 8B decode 329.2 -> 332.6 t/s; MM on top Q4_0 14.62 ->
/// 14.48, Q4_K 14.35 -> 14.17, Q8_0 22.94 -> 22.69, Q6_K 25.11 -> 24.88, 8B decode 353.5 ->
/// 356.9; RS on top Q4_0 14.49 -> 14.30, Q4_K 14.18 -> 14.01, 8B decode 347.8 / 357.2 -> 351.4 /
/// 365.0 (BENCHMARKS.md, sessions 21-22).
fn mat_vec_q_specialized(v: Variant, one_column: Option<(usize, usize)>) -> Variant {
    match one_column {
        Some((rows, stride)) => v
            .def("ONECOL", 1)
            .def("MM", rows as u32)
            .def("RS", stride as u32),
        None => v,
    }
}

/// The binding of the norm weights w of an integer-dot mat-vec that computes `rms_norm(x) * w`
/// of its column (NORM in `mat_vec_q`).
pub(crate) const NORM_W_BINDING: usize = 5;

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
    out.variant = out.variant.def("NORM", 1).def("Y4", u32::from(y4));
    out.bind[2] = Bind::whole(x);
    out.params.desc[2] = desc(tx);
    while out.bind.len() < NORM_W_BINDING {
        out.bind.push(out.bind[0]);
    }
    out.bind.push(Bind::whole(w));
    out.params.f[0] = eps;
    out
}

/// The integer-dot mat-vec variant for weights of type `a` (one of [`MVQ_TYPES`]) and
/// activations of type `b`; `a4` and `y4` as in [`mat_vec_q_shape`] and [`mat_vec_variant`].
/// ROWS, WG and KC are set by the caller.
fn mat_vec_q_variant(a: DType, b: DType, subgroups: bool, a4: bool, y4: bool) -> Variant {
    let (qb, tpb) = mvq_parts(a);
    Variant::new(Family::MulMat, "mat_vec_q")
        .def("MVQ", 1)
        .def("PF2", u32::from(mvq_two_in_flight(a)))
        .def("QUANT", 1)
        .def("SUBGROUPS", u32::from(subgroups))
        .def("A4", u32::from(a4))
        .def("Y4", u32::from(y4))
        .def("QB", qb)
        .def("TPB", tpb)
        .def("BM", MM_TILES[0].0)
        .def("BN", MM_TILES[0].1)
        .def("BK", MM_BK[0])
        .def("HK", MM_BK[0])
        .ty("T0", a)
        .ty("T1", b)
}

/// Whether the tiled mat-mat computes weights of type `a` in f16 (H16) on a device where it
/// may (`enabled`: `Gpu::mat_mat_f16`, SHADER_F16 and asked for): f16 and quantized weights do
/// (their values are f16 or dequantize from f16 scales), f32 and bf16 weights (whose precision
/// or range f16 lacks) do not.
fn mat_mat_h16(enabled: bool, a: DType) -> bool {
    enabled && (a == DType::F16 || DType::QUANTIZED.contains(&a))
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
    mat_mat_tile_for(gpu.limits.max_compute_workgroup_storage_size, ne, h16, quant)
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

/// Whether dst (shape `ne`) takes the larger cooperative-matrix tile: at least 128 columns.
/// (H200, 2026-12-01, m=4096 n=512 k=14336, 128 WGs of 128 x 128 against 256 of 128 x 64: q4_0
/// 54.8 -> 93.0 TFLOP/s, q8_0 60.7 -> 100.2, f16 71.1 -> 112.9; 8B pp512 1,861 -> 2,183 t/s.)
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

/// The tiled mat-mat variant for weights of type `a` and activations of type `b`; `aligned`
/// and `y4` as for [`mat_vec_variant`] (float weights need k a multiple of 4 only); `h16`:
/// f16 tiles and products ([`mat_mat_h16`]), `coop` (with `h16`) the products on cooperative
/// matrices (`Gpu::coop`).
fn mat_mat_variant(
    a: DType,
    b: DType,
    (bm, bn, bk): (u32, u32, u32),
    aligned: bool,
    y4: bool,
    (h16, coop): (bool, bool),
) -> Variant {
    let v = if h16 {
        Variant::new(Family::MulMat, "mat_mat")
            .def("H16", 1)
            .def("COOP", u32::from(coop))
            .def("FM4", u32::from(coop && bn == 128))
            .def("HK", MM_HK.min(bk))
    } else {
        Variant::new(Family::MulMat, "mat_mat").def("HK", bk)
    };
    v.def("ROWS", MV_ROWS)
        .def("QB", 8)
        .def("TPB", 1)
        .def("QUANT", u32::from(a.is_quantized()))
        .def("A4", u32::from(aligned && !a.is_quantized()))
        .def("AL", u32::from(aligned && a.is_quantized()))
        .def("Y4", u32::from(y4))
        .def("BM", bm)
        .def("BN", bn)
        .def("BK", bk)
        .ty("T0", a)
        .ty("T1", b)
}

/// The flash attention variant of entry point `entry` (`main` or `decode`).
fn flash_attn_variant(
    entry: &'static str,
    k: DType,
    v: DType,
    mask: Option<DType>,
    dmax: u32,
) -> Variant {
    Variant::new(Family::FlashAttn, entry)
        .def("DMAX", dmax)
        .ty("T1", k)
        .ty("T2", v)
        .ty("T3", mask.unwrap_or(DType::F32))
}

/// Whether the `prefill` attention's workgroup memory at head size `dmax` fits `wg_mem` bytes:
/// f16 tiles of FA_PREFILL_Q q rows and 32 k/v rows of dmax + 8 values, the f32 scores and f16
/// probabilities of a step (rows of 32 and 40 values), and two f32 per invocation.
fn fa_prefill_fits(wg_mem: u32, dmax: u32) -> bool {
    let q = FA_PREFILL_Q as u32;
    let bytes = (q + 32) * (dmax + 8) * 2 + q * 32 * 4 + q * 40 * 2 + 2 * 256 * 4;
    bytes <= wg_mem
}

/// The flash attention `prefill` variant (cooperative matrices, see `shaders/flash_attn.wgsl`):
/// 256 invocations, f16 tiles, DMAX 64 or 128 (OT4: four output blocks a subgroup at 128);
/// f16 k and v whose rows are 16-byte aligned whole chunks (`wide`: [`fa_decode_wide`] of
/// both) are staged 8 values a load (PKV16, binding them as 16-byte words: Y4, B4; H200,
/// causal 512 x 512, 32 heads of 128: 297 -> 207 µs, 8B pp512 5,941 -> 6,181 t/s).
fn flash_attn_prefill_variant(
    k: DType,
    v: DType,
    mask: Option<DType>,
    dmax: u32,
    wide: bool,
) -> Variant {
    let kv16 = wide && k == DType::F16 && v == DType::F16;
    flash_attn_variant("prefill", k, v, mask, dmax)
        .def("PKV16", u32::from(kv16))
        .def("Y4", u32::from(kv16))
        .def("B4", u32::from(kv16))
        .def("WG", 256)
        .def("PREFILL", 1)
        .def("H16", 1)
        .def("COOP", 1)
        .def("OT4", u32::from(dmax == 128))
}

/// The flash attention `decode` variant (see `shaders/flash_attn.wgsl`): 256 invocations, keys
/// per group and step (KU) so that each step holds about as many loads in flight at any head
/// size, subgroup operations where `subgroups` (the adapter's subgroups hold at least
/// [`FA_DECODE_G`] invocations), and k, resp. v, rows read as 16-byte chunks where `wide`
/// says so ([`fa_decode_wide`]: Y4, B4).
fn flash_attn_decode_variant(
    k: DType,
    v: DType,
    mask: Option<DType>,
    dmax: u32,
    subgroups: bool,
    wide: [bool; 2],
) -> Variant {
    flash_attn_variant("decode", k, v, mask, dmax)
        .def("DECODE", 1)
        .def("KU", (512 / dmax).max(1))
        .def("WG", FA_DECODE_WG)
        .def("SUBGROUPS", u32::from(subgroups))
        .def("Y4", u32::from(wide[0]))
        .def("B4", u32::from(wide[1]))
}

/// The flash attention `decode_combine` variant: merges the splits of the SPLIT `decode`.
fn flash_attn_combine_variant(dmax: u32) -> Variant {
    Variant::new(Family::FlashAttn, "decode_combine")
        .def("DMAX", dmax)
        .def("COMBINE", 1)
        .def("WG", FA_COMBINE_WG)
}

/// Splits of the keys of each of `groups` query rows and heads of flash attention's decode over
/// `nkv` keys: enough to make [`FA_SPLIT_GROUPS`] workgroups, with at least
/// [`FA_SPLIT_MIN_KEYS`] keys each (1: the single pass); then cut to the splits that splits
/// of that many keys (rounded up) make, so that none is empty.
fn fa_splits(groups: usize, nkv: usize) -> usize {
    let nkv = nkv.max(1);
    let want = FA_SPLIT_GROUPS
        .div_ceil(groups.max(1))
        .min(nkv / FA_SPLIT_MIN_KEYS)
        .clamp(1, nkv);
    nkv.div_ceil(nkv.div_ceil(want))
}

/// Whether flash attention's `decode` entry point can read tensor `id` (k or v) as it does:
/// rows of contiguous values, an even count of them, starting at 4-byte aligned offsets (a
/// pair of f16 per word).
fn fa_decode_layout(gpu: &Gpu, graph: &Graph, id: TensorId) -> bool {
    let t = graph.get(id);
    t.nb[0] == t.dtype.type_size()
        && t.ne[0] >= 2
        && t.ne[0].is_multiple_of(2)
        && aligned(gpu, graph, id, 0, 4)
}

/// Whether flash attention's `decode` can read the rows of tensor `id` (k or v, in its decode
/// layout) as whole 16-byte chunks: rows of a multiple of 16 bytes at 16-byte aligned offsets.
fn fa_decode_wide(gpu: &Gpu, graph: &Graph, id: TensorId) -> bool {
    let t = graph.get(id);
    (t.ne[0] * t.nb[0]).is_multiple_of(16) && aligned(gpu, graph, id, 0, 16)
}

fn reduce_variant(op: u32, a: DType, to: DType) -> Variant {
    Variant::new(Family::Reduce, "main")
        .def("OP", op)
        .ty("T0", a)
        .ty("DT", to)
}

fn shape_variant(op: u32, a: DType, to: DType) -> Variant {
    let raw = u32::from(a == DType::I32);
    Variant::new(Family::Shape, "main")
        .def("OP", op)
        .def("RAW", raw)
        .ty("T0", a)
        .ty("T1", a)
        .ty("DT", to)
}

/// Every variant [`plan`] can ask for in `family` (with subgroups on or off), for the naga test.
#[cfg(test)]
pub(crate) fn variants(family: Family, subgroups: bool) -> Vec<Variant> {
    let mut v = Vec::new();
    let ew = |x: Variant| {
        let wg = ew_wg(&x);
        x.def("WG", wg)
    };
    let row = |x: Variant| x.def("WG", ROW_WG);
    match family {
        Family::Unary => {
            for &a in &FLOATS {
                for op in [1, 2].into_iter().chain(10..10 + UnaryOp::ALL.len() as u32) {
                    v.push(ew(unary_variant(op, a, a)));
                }
                for &b in &FLOATS {
                    v.push(ew(unary_variant(0, a, b)));
                }
            }
            v.push(ew(unary_variant(3, DType::F32, DType::F32)));
            v.push(ew(unary_variant(3, DType::I32, DType::I32)));
            for &q in &DType::QUANTIZED {
                v.push(ew(unary_variant(4, q, DType::F32)));
                v.push(ew(unary_variant(5, q, q)));
            }
            for &a in &FLOATS {
                for &q in &DType::QUANTIZED {
                    v.push(ew(unary_variant(6, a, q)));
                }
            }
        }
        Family::Binary => {
            for op in [BinaryOp::Add, BinaryOp::Sub, BinaryOp::Mul, BinaryOp::Div] {
                for &a in &FLOATS {
                    for &b in &FLOATS {
                        v.push(ew(binary_variant(op, a, b)));
                    }
                }
            }
        }
        Family::Glu => {
            for op in [GluOp::Swiglu, GluOp::Geglu] {
                for a in [DType::F32, DType::F16] {
                    v.push(ew(glu_variant(op, a)));
                }
            }
        }
        Family::Norm => {
            v.extend([0, 1].map(|op| row(norm_variant(op, false))));
            v.push(row(norm_variant(0, true)));
        }
        Family::SoftMax => v.extend([None, Some(DType::F16)].map(|m| row(soft_max_variant(m)))),
        Family::Rope => {
            v.extend([DType::F32, DType::F16].map(|a| ew(rope_variant(a))));
            v.extend([DType::F32, DType::F16].map(rope_kv_variant));
        }
        Family::Rows => {
            for &a in FLOATS.iter().chain(&DType::QUANTIZED) {
                v.push(ew(rows_variant(0, a, DType::I32, DType::F32)));
            }
            v.push(ew(rows_variant(1, DType::I32, DType::I32, DType::I32)));
            for idx in [DType::I32, DType::I64] {
                for &d in &FLOATS {
                    v.push(ew(rows_variant(2, DType::F32, idx, d)));
                }
                for &d in &DType::QUANTIZED {
                    v.push(ew(rows_variant(3, DType::F32, idx, d)));
                }
            }
        }
        Family::MulMat => {
            for &a in FLOATS.iter().chain(&DType::QUANTIZED) {
                for b in [DType::F32, DType::F16] {
                    for aligned in [false, true] {
                        if aligned && a.is_quantized() && !a.type_size().is_multiple_of(4) {
                            continue;
                        }
                        v.push(mat_vec_variant(a, b, subgroups, aligned, false));
                        if b == DType::F32 {
                            v.push(mat_vec_variant(a, b, subgroups, aligned, true));
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
                            for (rows, wg, k) in [(32, 1024, 14336), (16, 512, 4096), (2, 64, 256)]
                            {
                                for (kc, one_column) in [
                                    (MVQ_KC[0], None),
                                    (MVQ_KC[1], None),
                                    (MVQ_KC[1], Some((4096, k / a.block_size() * a.type_size()))),
                                ] {
                                    let x = mat_vec_q_specialized(
                                        mat_vec_q_sized(
                                            mat_vec_q_variant(a, b, subgroups, a4, y4),
                                            (rows, wg, kc),
                                            k,
                                            subgroups.then_some(32),
                                        ),
                                        one_column,
                                    );
                                    let w2 = crate::fused::second_matrix_variant;
                                    let fused = [
                                        x.clone(),
                                        x.clone().def("ADD", 1),
                                        w2(x.clone(), false),
                                        w2(x.clone(), false).def("QKV", 1),
                                        crate::fused::qkv_rope_variant(
                                            w2(x.clone(), false).def("QKV", 1),
                                            DType::F16,
                                        ),
                                        crate::fused::qkv_rope_variant(
                                            w2(x.clone(), false).def("QKV", 1),
                                            DType::F32,
                                        ),
                                        w2(x, true),
                                    ];
                                    for f in fused {
                                        // NORM: the column is an f32 x to normalize.
                                        if b == DType::F32 {
                                            v.push(f.clone().def("NORM", 1));
                                        }
                                        v.push(f);
                                    }
                                }
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
                                    if aligned
                                        && a.is_quantized()
                                        && !a.type_size().is_multiple_of(4)
                                    {
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
                                        let x = mat_mat_variant(
                                            a,
                                            b,
                                            (bm, bn, bk),
                                            aligned,
                                            y4,
                                            (h16, coop),
                                        );
                                        if coop {
                                            v.push(crate::fused::mat_mat_pair_variant(x.clone()));
                                        }
                                        v.push(x);
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
        Family::FlashAttn => {
            v.extend(FA_DMAX.map(flash_attn_combine_variant));
            for k in [DType::F32, DType::F16] {
                for val in [DType::F32, DType::F16] {
                    for m in [None, Some(DType::F16)] {
                        for d in FA_DMAX {
                            for wg in FA_WG {
                                v.push(flash_attn_variant("main", k, val, m, d).def("WG", wg));
                            }
                            if d <= FA_PREFILL_DMAX {
                                v.push(flash_attn_prefill_variant(k, val, m, d, false));
                                v.push(flash_attn_prefill_variant(k, val, m, d, true));
                            }
                            for wide in [[false, false], [true, true], [true, false]] {
                                let dec = flash_attn_decode_variant(k, val, m, d, subgroups, wide);
                                v.push(dec.clone().def("SPLIT", 1));
                                v.push(dec);
                            }
                        }
                    }
                }
            }
        }
        Family::Reduce => {
            for &a in &FLOATS {
                v.push(row(reduce_variant(0, a, DType::F32)));
                v.push(row(reduce_variant(1, a, DType::F32)));
                v.push(row(reduce_variant(3, a, DType::F32)));
            }
            v.push(row(reduce_variant(2, DType::F32, DType::I32)));
        }
        Family::Shape => {
            for &a in &FLOATS {
                for op in 0..4 {
                    v.push(ew(shape_variant(op, a, a)));
                }
            }
            v.push(ew(shape_variant(0, DType::I32, DType::I32)));
            v.push(ew(shape_variant(1, DType::I32, DType::I32)));
            v.push(ew(shape_variant(4, DType::F32, DType::F32)));
        }
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Flash attention's decode splits: enough for FA_SPLIT_GROUPS workgroups with at least
    /// FA_SPLIT_MIN_KEYS keys each, never an empty split.
    #[test]
    fn fa_split_counts() {
        // The 8B's 32 heads of one token: one pass over 256 keys, 2 splits over 512, 4 over
        // 1,024, 8 of 512 keys over 4,096.
        assert_eq!(fa_splits(32, 256), 1);
        assert_eq!(fa_splits(32, 512), 2);
        assert_eq!(fa_splits(32, 1024), 4);
        assert_eq!(fa_splits(32, 4096), 8);
        // Short caches and many rows and heads keep the single pass.
        assert_eq!(fa_splits(32, 40), 1);
        assert_eq!(fa_splits(256, 4096), 1);
        assert_eq!(fa_splits(8, 1000), 3);
        for nkv in 1..3000 {
            for groups in [1, 3, 8, 32] {
                let s = fa_splits(groups, nkv);
                let per = nkv.div_ceil(s);
                assert!(
                    s >= 1 && (s - 1) * per < nkv && s * per >= nkv,
                    "{nkv} {groups}"
                );
            }
        }
    }

    /// The prefill attention fits the 48 KiB of NVIDIA's Vulkan driver at head size 128, and
    /// only head size 64 fits 32 KiB.
    #[test]
    fn fa_prefill_memory() {
        assert!(fa_prefill_fits(49152, 128));
        assert!(!fa_prefill_fits(32768, 128));
        assert!(fa_prefill_fits(32768, 64));
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
        let source = |bk, h16_coop| {
            let v = mat_mat_variant(DType::F16, DType::F32, (128, 128, bk), true, true, h16_coop);
            v.source().unwrap()
        };
        let src = source(64, (true, false));
        assert!(src.starts_with("enable f16;"), "{}", &src[..40]);
        assert!(!src.starts_with("enable f16;\nenable wgpu_cooperative_matrix;"));
        let src = source(32, (true, true));
        assert!(src.starts_with("enable f16;\nenable wgpu_cooperative_matrix;"));
        assert!(!source(32, (false, false)).starts_with("enable f16;"));
    }
}
