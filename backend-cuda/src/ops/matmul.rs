//! mul_mat: `dst[m, n] = sum_k src0[k, m] src1[k, n]`, batched over dims 2-3 with src0
//! broadcast (kernels/matmul.cu, mmvq.cu).
//!
//! - F32, F16 and BF16 weights (src1 F32, F16 or BF16) go to cuBLAS (src1 converted to the weight type where it differs
//!   or is not column-contiguous); batches are one strided-batched GEMM, or a GEMM over pointer
//!   arrays when src0 is broadcast.
//! - Quantized weights with [`MMT_MIN`] to [`MMT_MAX`] columns (2-D, on sm_80 and later, of
//!   the types [`has_mmt`] lists, where [`crate::CudaOptions::few_columns`] picks one of the
//!   direct kernels rather than the default [`crate::FewColumns::Staged`]) use the direct
//!   tensor-core kernel of mmvq.cu (`mmt_*`), whose warps copy their rows' stages straight to
//!   their own shared memory and read each weight byte once for all the columns.
//! - Other quantized weights with [`MMQ_MIN`] to [`MMQ_MAX`] columns (2-D, on sm_80 and later,
//!   of the types [`has_mmq`] lists) use the int8 tensor-core mat-mat of mmvq.cu (`mmq_*`), which
//!   reads each weight byte once per tile of up to 32 columns.
//! - Quantized weights with 1 column, or 2 to 8 columns neither mat-mat takes, use the mat-vec
//!   kernels of mmvq.cu, which read each weight byte once (src1, F32 or F16, quantized to 8-bit
//!   blocks first); 9 to 16 columns without a mat-mat run as mat-vec launches of up to 8
//!   columns each.
//! - Quantized weights with more columns are dequantized to F16 (in slices of rows, so the
//!   scratch memory stays bounded) and multiplied by cuBLAS.

use tessera_core::dtype::DType;
use tessera_core::{Result, Tensor, TensorId};

use super::copy::{quant_readable, quant_supported, to_contiguous};
use super::{params, Encoder};
use crate::cmd::{Cmd, GemmCmd, GemmType, KParams, TArg};
use crate::FewColumns;

/// Most bytes of dequantized weights held at once.
const DEQUANT_SLICE: usize = 64 << 20;

/// Types with a mat-vec kernel: every quantized type the GPU writes but Q2_K and Q3_K, and of
/// the types it only reads IQ4_NL, IQ4_XS, MXFP4, IQ2_XS and IQ3_S; the others go through
/// dequantization and the GEMM.
pub(super) fn has_mmvq(d: DType) -> bool {
    (quant_supported(d) && !matches!(d, DType::Q2_K | DType::Q3_K))
        || matches!(
            d,
            DType::IQ4_NL | DType::IQ4_XS | DType::MXFP4 | DType::IQ2_XS | DType::IQ3_S
        )
}

/// Whether mul_mat of these operands is implemented.
pub(super) fn supported(a: &Tensor, b: &Tensor) -> bool {
    let plain = a.dtype.is_float();
    (plain || quant_readable(a.dtype))
        && a.rows_contiguous()
        && a.nb[1] >= a.row_bytes()
        && (matches!(b.dtype, DType::F32 | DType::F16) || (plain && b.dtype == DType::BF16))
        && a.ne[0] <= i32::MAX as usize
}

fn gemm_type(d: DType) -> GemmType {
    match d {
        DType::F16 => GemmType::F16,
        DType::BF16 => GemmType::BF16,
        _ => GemmType::F32,
    }
}

/// The alignment (bytes) the mat-vec kernel of a type needs for its rows: Q4_K and Q5_K read
/// their blocks (multiples of 16 bytes) with 16-byte loads; other rows go to the dequantizing
/// path.
fn mmvq_align(d: DType) -> u64 {
    match d {
        DType::Q4_K | DType::Q5_K => 16,
        DType::Q4_1 | DType::Q5_1 => 4,
        // 17-byte blocks: the kernel reads them at any byte.
        DType::MXFP4 => 1,
        _ => 2,
    }
}

/// Whether the weights' rows are aligned as the mat-vec kernel of their type needs.
pub(super) fn mmvq_aligned(d: DType, a: &TArg) -> bool {
    let al = mmvq_align(d);
    a.ptr.is_multiple_of(al) && a.nb[1..].iter().all(|&s| (s as u64).is_multiple_of(al))
}

/// Encodes a mul_mat node.
pub(super) fn mul_mat(enc: &mut Encoder, id: TensorId) -> Result<()> {
    let t = enc.graph.get(id);
    let (a, b) = (t.src[0], t.src[1]);
    let (ta, tb) = (enc.graph.get(a), enc.graph.get(b));
    let (aa, ba, da) = (enc.arg(a)?, enc.arg(b)?, enc.arg(id)?);
    if ta.dtype.is_quantized() {
        if let Some(geom) = mmt_fits(enc, ta, tb, &aa) {
            return mmt(enc, a, b, ba, tb.dtype, da, None, geom);
        }
        if mmq_fits(enc, ta, tb, &aa) {
            return mmq(enc, a, b, ba, tb.dtype, da);
        }
        if mmvq_fits(enc, ta, tb, &aa) {
            let q8 = quantize_q8(enc, b, ba, tb.dtype)?;
            // The all-reduce node right after this one sums the one-column result
            // (Encoder::presend_target): the mat-vec sends it to the other ranks itself.
            let presend = enc
                .presend_next
                .filter(|&(node, _)| node == id)
                .map(|(_, to)| to);
            mmvq(enc, a, da, q8, tb.ne[1], None, presend)?;
            if presend.is_some() {
                enc.present = Some(id);
            }
            return Ok(());
        }
        if mmvq_chunks_fit(ta, tb, &aa) {
            return mmvq_chunks(enc, a, b, ba, tb.dtype, da);
        }
        return dequant_gemm(enc, ta.dtype, aa, ba, tb.dtype, da);
    }
    let ty = ta.dtype;
    let es = ty.type_size() as i64;
    let b_ok = tb.dtype == ty
        && ba.nb[0] == es
        && ba.nb[1] >= ba.ne[0] * es
        && ba.nb[1..].iter().all(|&s| s % es == 0);
    let bm = if b_ok {
        ba
    } else {
        to_contiguous(enc, ba, tb.dtype, ty)?
    };
    gemm(enc, gemm_type(ty), es, aa, bm, da)
}

/// Quantizes the columns of tensor `id` (at `b`, of type `bt`) into 8-bit blocks in scratch;
/// returns (qs, ds) addresses. The blocks the previous mul_mat node made of the same tensor
/// are reused ([`Encoder::q8`]).
pub(super) fn quantize_q8(
    enc: &mut Encoder,
    id: TensorId,
    b: TArg,
    bt: DType,
) -> Result<(u64, u64)> {
    if let Some((src, q8)) = enc.q8 {
        if src == id {
            return Ok(q8);
        }
    }
    let blocks = (b.ne[0] / 32) * b.ne[1] * b.ne[2] * b.ne[3];
    let qs = enc.scratch((blocks * 32) as usize);
    let ds = enc.scratch((blocks * 8) as usize);
    let mut p = params(TArg::default(), &[b]);
    p.aux[..2].copy_from_slice(&[qs, ds]);
    let grid = (blocks as u64).div_ceil(8).min(u32::MAX as u64 / 2) as u32;
    enc.launch(
        "mmvq",
        &format!("quantize_q8_1_{}", bt.name()),
        [grid, 1, 1],
        [256, 1, 1],
        0,
        p,
    )?;
    enc.q8 = Some((id, (qs, ds)));
    Ok((qs, ds))
}

/// Whether a mul_mat of quantized weights `a` (at `aa`) with `b` runs as mat-vec kernels (1 to
/// 8 columns the direct mat-mat does not take).
pub(super) fn mmvq_fits(enc: &Encoder, a: &Tensor, b: &Tensor, aa: &TArg) -> bool {
    (1..=8).contains(&b.ne[1])
        && has_mmvq(a.dtype)
        && mmvq_aligned(a.dtype, aa)
        && b.ne[2] * b.ne[3] <= 65535
        && mmt_fits(enc, a, b, aa).is_none()
}

/// The most columns a mul_mat of quantized weights runs as mat-vec launches of up to 8 columns
/// each (a few sequences decoded together): an 8-column launch costs a bit under half of
/// dequantizing the weights for a GEMM, so two launches still cost less, three do not.
const MMVQ_CHUNKED_MAX: usize = 16;

/// Whether a mul_mat of quantized weights `a` (at `aa`) with `b` runs as mat-vec launches over
/// chunks of `b`'s columns ([`mmvq_chunks`]).
fn mmvq_chunks_fit(a: &Tensor, b: &Tensor, aa: &TArg) -> bool {
    (9..=MMVQ_CHUNKED_MAX).contains(&b.ne[1])
        && b.ne[2] * b.ne[3] == 1
        && has_mmvq(a.dtype)
        && mmvq_aligned(a.dtype, aa)
}

/// `d = a^T b` for 9 to [`MMVQ_CHUNKED_MAX`] columns of tensor `b_id` (at `b`, of type `bt`):
/// the columns quantized once, then one mat-vec launch per chunk of at most 8 columns (chunks
/// of equal size, so that no launch is left with a few columns).
fn mmvq_chunks(
    enc: &mut Encoder,
    a: TensorId,
    b_id: TensorId,
    b: TArg,
    bt: DType,
    d: TArg,
) -> Result<()> {
    let (qs, ds) = quantize_q8(enc, b_id, b, bt)?;
    let n = b.ne[1] as usize;
    let chunks = n.div_ceil(8);
    let blocks_per_col = (b.ne[0] / 32) as u64;
    let mut c0 = 0;
    for i in 0..chunks {
        let nc = (n - c0).div_ceil(chunks - i);
        let mut dc = d;
        dc.ptr += c0 as u64 * d.nb[1] as u64;
        dc.ne[1] = nc as i64;
        let q8 = (
            qs + c0 as u64 * blocks_per_col * 32,
            ds + c0 as u64 * blocks_per_col * 8,
        );
        mmvq(enc, a, dc, q8, nc, None, None)?;
        c0 += nc;
    }
    Ok(())
}

/// The fewest columns the direct tensor-core mat-mat takes (one column stays with the mat-vec,
/// which needs no tensor-core tile of 8 columns).
const MMT_MIN: i64 = 2;

/// The most columns the direct tensor-core mat-mat takes (4 column tiles of 8).
pub(super) const MMT_MAX: i64 = 32;

/// Types with the direct tensor-core mat-mat (`mmt_*` in mmvq.cu, which decodes them as the
/// staged mat-mat's `MmqA` does).
pub(super) fn has_mmt(d: DType) -> bool {
    matches!(
        d,
        DType::Q4_0 | DType::Q8_0 | DType::Q4_K | DType::Q5_K | DType::Q6_K
    )
}

/// The direct mat-mat's geometries (`MmtGeom<V>` in mmvq.cu): 16-row tiles a warp, stage slots
/// a warp.
fn mmt_geom(k: FewColumns) -> Option<(usize, usize, usize)> {
    match k {
        FewColumns::Direct16 => Some((0, 1, 4)),
        FewColumns::Direct32 => Some((1, 2, 3)),
        FewColumns::Staged => None,
    }
}

/// Warps of the direct mat-mat per SM aimed at: with their stages in flight, enough copies to
/// keep the memory busy, and few enough to be resident at once.
const MMT_WARPS_PER_SM: usize = 16;

/// The most warps of a block of the direct mat-mat (its launch bound).
const MMT_WARPS_MAX: usize = 8;

/// The most dynamic shared memory of a block of the direct mat-mat on a GPU of compute
/// capability `cc`: below what a block may have (227 KiB on sm_90 and sm_100, 163 KiB on sm_80
/// and sm_87, 99 KiB on the others from sm_86 on).
fn mmt_smem_max(cc: (i32, i32)) -> usize {
    match cc {
        (9, 0) | (10, 0) => 200 << 10,
        (8, 0) | (8, 7) => 160 << 10,
        _ => 96 << 10,
    }
}

/// Bytes of a row's stage slot in the direct mat-mat's shared memory (`MmtSlot` in mmvq.cu):
/// the 16-byte chunks a stage of 256 values spans from any offset, rounded up to an odd count.
fn mmt_slot(qt: DType) -> usize {
    let sb = qt.type_size() * 256 / qt.block_size();
    (((sb + 30) / 16) | 1) * 16
}

/// Whether a mul_mat of quantized weights `a` (at `aa`) with `b` runs as the direct tensor-core
/// mat-mat, and in which geometry (`MmtGeom` index, 16-row tiles a warp, stage slots a warp):
/// [`MMT_MIN`] to [`MMT_MAX`] columns, 2-D operands, a type [`has_mmt`] lists with rows aligned
/// as the mat-vec needs them, int8 mma.sync (sm_80 and later), and [`Encoder::few_columns`] not
/// [`FewColumns::Staged`].
pub(super) fn mmt_fits(
    enc: &Encoder,
    a: &Tensor,
    b: &Tensor,
    aa: &TArg,
) -> Option<(usize, usize, usize)> {
    let fits = (MMT_MIN..=MMT_MAX).contains(&(b.ne[1] as i64))
        && b.ne[2] * b.ne[3] == 1
        && a.ne[2] * a.ne[3] == 1
        && has_mmt(a.dtype)
        && mmvq_aligned(a.dtype, aa)
        && enc.dev.cc.0 >= 8;
    fits.then(|| mmt_geom(enc.few_columns)).flatten()
}

/// Quantizes the columns of tensor `id` (at `b`, 2-D, of type `bt`) into 8-bit blocks in the
/// direct mat-mat's tiled layout (`quantize_q8_1_tiles` in mmvq.cu) in scratch; returns the
/// (qs, ds) addresses. The blocks the previous mul_mat node made of the same tensor are reused
/// ([`Encoder::q8_tiles`]).
pub(super) fn quantize_q8_tiles(
    enc: &mut Encoder,
    id: TensorId,
    b: TArg,
    bt: DType,
) -> Result<(u64, u64)> {
    if let Some((src, q8)) = enc.q8_tiles {
        if src == id {
            return Ok(q8);
        }
    }
    let blocks = (b.ne[0] / 32) as usize * (b.ne[1] as usize).div_ceil(8) * 8;
    let qs = enc.scratch(blocks * 32);
    let ds = enc.scratch(blocks * 8);
    let mut p = params(TArg::default(), &[b]);
    p.aux[..2].copy_from_slice(&[qs, ds]);
    enc.launch(
        "mmvq",
        &format!("quantize_q8_1_tiles_{}", bt.name()),
        [blocks.div_ceil(8) as u32, 1, 1],
        [256, 1, 1],
        0,
        p,
    )?;
    enc.q8_tiles = Some((id, (qs, ds)));
    Ok((qs, ds))
}

/// `d = a^T b (+ residual)` for 2 to [`MMT_MAX`] columns of tensor `b_id` (at `b`, of type `bt`)
/// by the direct tensor-core mat-mat in geometry `(v, mt, nbuf)` ([`mmt_fits`]): the columns
/// quantized once in the tiled layout, blocks of 16 `mt` rows, each of `w` warps that split k's
/// stages: as many as give the GPU [`MMT_WARPS_PER_SM`] warps an SM in all, so that the blocks
/// run as one wave where the rows allow (a second wave, partly filled, would leave SMs idle at
/// the end), at least one, at most [`MMT_WARPS_MAX`], the stages, and what [`mmt_smem_max`]
/// holds. Weights no node of the graph writes
/// are read early ([`Encoder::is_read_only_leaf`]).
#[allow(clippy::too_many_arguments)]
pub(super) fn mmt(
    enc: &mut Encoder,
    a_id: TensorId,
    b_id: TensorId,
    b: TArg,
    bt: DType,
    d: TArg,
    residual: Option<TArg>,
    (v, mt, nbuf): (usize, usize, usize),
) -> Result<()> {
    let (qs, ds) = quantize_q8_tiles(enc, b_id, b, bt)?;
    let a = enc.arg(a_id)?;
    let qt = enc.graph.get(a_id).dtype;
    let (m, n, nblk) = (a.ne[1] as usize, b.ne[1] as usize, a.ne[0] as usize / 32);
    let rows = 16 * mt;
    let tiles = m.div_ceil(rows);
    let stages = nblk.div_ceil(8);
    let per_warp = nbuf * rows * mmt_slot(qt);
    let w = (MMT_WARPS_PER_SM * enc.dev.sm_count as usize / tiles)
        .min(stages)
        .min(MMT_WARPS_MAX)
        .min(mmt_smem_max(enc.dev.cc) / per_warp)
        .max(1);
    let nt = n.div_ceil(8);
    let mut p = params(d, &[a]);
    p.i[0] = n as i32;
    p.i[3] = if enc.is_read_only_leaf(a_id) { 4 } else { 0 };
    p.aux[..2].copy_from_slice(&[qs, ds]);
    if let Some(r) = residual {
        p.t[2] = r;
        p.i[2] = 1;
    }
    enc.launch(
        "mmvq",
        &format!("mmt_{}_{nt}_{v}", qt.name()),
        [tiles as u32, 1, 1],
        [32 * w as u32, 1, 1],
        (w * per_warp) as u32,
        p,
    )
}

/// The fewest columns the tensor-core mat-mat takes: up to 8 columns the mat-vec kernels,
/// which read the weights once for all of them without the mat-mat's tile setup, are faster.
const MMQ_MIN: i64 = 9;

/// The most columns the tensor-core mat-mat takes (a batch of decoded sequences); wider
/// products, and Q6_K already from 40 columns, run faster dequantized into cuBLAS.
const MMQ_MAX: i64 = 32;

/// The most columns of one column tile of the mat-mat (its widest kernel, 4 tiles of 8).
const MMQ_TILE: usize = 32;

/// Blocks of the mat-mat an SM is given at least, where k is long enough to split: each
/// keeps the next stage of its 128 rows in flight while it computes the current one, and
/// several of them hide each other's tile setup and final sums.
const MMQ_BLOCKS_PER_SM: usize = 3;

/// The most blocks a k split of the mat-mat runs as, where they form one thread-block cluster
/// that adds up its sums itself (the portable cluster size).
const MMQ_CLUSTER_MAX: usize = 8;

/// Stages of k each block of the mat-mat holds at once (`MMQ_NBUF` in mmvq.cu).
const MMQ_NBUF: usize = 2;

/// Types with a tensor-core mat-mat kernel (`MmqA` in mmvq.cu): those whose values decode to
/// int8 under one scale (and offset) per 32 values, or one scale per 16 (Q6_K).
pub(super) fn has_mmq(d: DType) -> bool {
    matches!(
        d,
        DType::Q4_0
            | DType::Q4_1
            | DType::Q5_0
            | DType::Q5_1
            | DType::Q8_0
            | DType::Q4_K
            | DType::Q5_K
            | DType::Q6_K
            | DType::IQ4_NL
            | DType::IQ4_XS
            | DType::MXFP4
    )
}

/// Whether a mul_mat of quantized weights `a` (at `aa`) with `b` runs as the tensor-core
/// mat-mat: 2-D operands, [`MMQ_MIN`] to [`MMQ_MAX`] columns, a GPU with int8 mma.sync
/// (sm_80 and later), rows aligned as the mat-vec needs them (the mat-mat reads the same words).
fn mmq_fits(enc: &Encoder, a: &Tensor, b: &Tensor, aa: &TArg) -> bool {
    (MMQ_MIN..=MMQ_MAX).contains(&(b.ne[1] as i64))
        && b.ne[2] * b.ne[3] == 1
        && a.ne[2] * a.ne[3] == 1
        && has_mmq(a.dtype)
        && mmvq_aligned(a.dtype, aa)
        && enc.dev.cc.0 >= 8
}

/// `d = a^T b` for [`MMQ_MIN`] to [`MMQ_MAX`] columns of tensor `b_id` (at `b`, of type `bt`)
/// on the tensor cores: the columns quantized once ([`quantize_q8`]), cut into equal column
/// tiles of at most [`MMQ_TILE`] (so that no tile is left with a few columns), each tile 8 `nt`
/// wide; the rows in tiles of 128; and k's stages of 256 values split into `splits` runs when
/// the tiles alone would leave the GPU's SMs short of blocks (aiming at [`MMQ_BLOCKS_PER_SM`]
/// an SM, each run at least 2 stages), their partial sums added in a thread-block cluster of
/// the splits where the device launches clusters (then at most [`MMQ_CLUSTER_MAX`] splits),
/// else by `mmq_sum`.
fn mmq(
    enc: &mut Encoder,
    a_id: TensorId,
    b_id: TensorId,
    b: TArg,
    bt: DType,
    d: TArg,
) -> Result<()> {
    let (qs, ds) = quantize_q8(enc, b_id, b, bt)?;
    let a = enc.arg(a_id)?;
    let qt = enc.graph.get(a_id).dtype;
    let (m, n, nblk) = (a.ne[1] as usize, b.ne[1] as usize, a.ne[0] as usize / 32);
    let col_tiles = n.div_ceil(MMQ_TILE);
    let nt = n.div_ceil(col_tiles).div_ceil(8);
    let row_tiles = m.div_ceil(128);
    let cluster = enc.clusters();
    let splits = (MMQ_BLOCKS_PER_SM * enc.dev.sm_count as usize)
        .div_ceil(row_tiles * col_tiles)
        .min(nblk.div_ceil(8) / 2)
        .clamp(1, if cluster { MMQ_CLUSTER_MAX } else { 65535 });
    let mut p = params(d, &[a]);
    p.i[0] = n as i32;
    p.aux[..2].copy_from_slice(&[qs, ds]);
    let cluster = cluster && splits > 1;
    if cluster {
        p.i[1] = 1;
    } else if splits > 1 {
        // The partials go above the quantized columns, which stay valid for the next node.
        let end = (ds - enc.scratch_base) as usize + nblk * n * 8;
        enc.node_scratch = enc.node_scratch.max(end);
        p.aux[2] = enc.scratch(splits * m * n * 4);
        enc.q8 = Some((b_id, (qs, ds)));
    }
    enc.launch_clusters(
        "mmvq",
        &format!("mmq_{}_{nt}", qt.name()),
        [
            [row_tiles as u32, col_tiles as u32, splits as u32],
            [128, 1, 1],
        ],
        mmq_smem(qt, nt),
        if cluster { splits as u32 } else { 0 },
        p,
    )?;
    if splits > 1 && !cluster {
        p.i[1] = splits as i32;
        enc.launch_flat("mmvq", "mmq_sum", (m * n) as i64, p)?;
    }
    Ok(())
}

/// Bytes of dynamic shared memory of the mat-mat kernel for weights of type `qt` and column
/// tiles of `nt` times 8 (`MmqSmem` in mmvq.cu, which this mirrors): [`MMQ_NBUF`] stages of 128
/// rows of 256 values (plus a word each for an unaligned start), the tile's int8 columns (68
/// words each) and their scale pairs.
pub(super) fn mmq_smem(qt: DType, nt: usize) -> u32 {
    let sb = qt.type_size() * 256 / qt.block_size();
    let sw = sb.div_ceil(4) + 1;
    let stage = 4 * 32 * sw + 8 * nt * 68 + 8 * 8 * nt * 2;
    (MMQ_NBUF * stage * 4) as u32
}

/// Blocks and threads per block of a mat-vec kernel (plain, glu or multi) over `rows` rows of
/// type `qt`, with 4 set in `p.i[3]` when the weights are `read_only`
/// ([`Encoder::is_read_only_leaf`]) and may be read before the kernel ahead has finished (see
/// mmvq.cu, "Early weights"): 128 threads (4 warps) per block of 4 rows, as mmvq.cu's `Geom`
/// decides for each type's geometry.
pub(super) fn mmvq_launch(p: &mut KParams, rows: u64, read_only: bool) -> (u32, u32) {
    p.i[3] = if read_only { 4 } else { 0 };
    (rows.div_ceil(4) as u32, 128)
}

/// Where a mat-vec sends its results ahead of the all-reduce that sums them (see `store_row`
/// in kernels/mmvq.cu): this rank's signal block, the small area's region bytes, the rank and
/// the group's ranks.
#[derive(Clone, Copy)]
pub(super) struct Presend {
    pub signal: u64,
    pub region: u64,
    pub rank: usize,
    pub ranks: usize,
}

/// Queues the mat-vec kernel: `d = a^T x` for the `n` quantized columns at `q8`, plus
/// `residual` (F32, d's shape) when given; `a` is the weights' tensor (read early where it is
/// a read-only leaf, [`Encoder::is_read_only_leaf`]); with `presend`, each result also goes to
/// the all-reduce group's other ranks.
pub(super) fn mmvq(
    enc: &mut Encoder,
    a_id: TensorId,
    d: TArg,
    q8: (u64, u64),
    n: usize,
    residual: Option<TArg>,
    presend: Option<Presend>,
) -> Result<()> {
    let (a, qt, read_only) = (
        enc.arg(a_id)?,
        enc.graph.get(a_id).dtype,
        enc.is_read_only_leaf(a_id),
    );
    let mut p = params(d, &[a]);
    if let Some(r) = residual {
        p.t[2] = r;
        p.i[2] = 1;
    }
    p.aux[..2].copy_from_slice(&[q8.0, q8.1]);
    if let Some(s) = presend {
        p.aux[2] = s.signal;
        p.aux[3] = s.region;
        p.i[4] = s.rank as i32 + 1;
        p.i[5] = s.ranks as i32;
    }
    p.i[0] = (d.ne[2] / a.ne[2]) as i32;
    p.i[1] = (d.ne[3] / a.ne[3]) as i32;
    let (blocks, threads) = mmvq_launch(&mut p, a.ne[1] as u64, read_only);
    enc.launch(
        "mmvq",
        &format!("mmvq_{}_{n}", qt.name()),
        [blocks, (d.ne[2] * d.ne[3]) as u32, 1],
        [threads, 1, 1],
        0,
        p,
    )
}

/// One or more cuBLAS GEMMs computing `d = a^T b` for all batches (a and b of one element
/// type of `es` bytes, columns contiguous; d contiguous f32).
fn gemm(enc: &mut Encoder, ty: GemmType, es: i64, a: TArg, b: TArg, d: TArg) -> Result<()> {
    let (m, n, k) = (a.ne[1], b.ne[1], a.ne[0]);
    let (r2, r3) = (d.ne[2] / a.ne[2], d.ne[3] / a.ne[3]);
    let base = GemmCmd {
        m: m as i32,
        n: n as i32,
        k: k as i32,
        ab_type: ty,
        a: a.ptr,
        lda: (a.nb[1] / es) as i32,
        stride_a: a.nb[2] / es,
        b: b.ptr,
        ldb: (b.nb[1] / es) as i32,
        stride_b: b.nb[2] / es,
        c: d.ptr,
        ldc: m as i32,
        stride_c: d.nb[2] / 4,
        batch: d.ne[2] as i32,
        ptrs: None,
        tf32: enc.tf32,
    };
    if r2 == 1 && r3 == 1 {
        // Strided over dim 2, one call per index of dim 3.
        for i3 in 0..d.ne[3] {
            let mut g = base;
            g.a += (i3 * a.nb[3]) as u64;
            g.b += (i3 * b.nb[3]) as u64;
            g.c += (i3 * d.nb[3]) as u64;
            enc.cmds.push(Cmd::Gemm(g));
        }
        return Ok(());
    }
    // src0 broadcast: pointer arrays built on the device.
    let batches = d.ne[2] * d.ne[3];
    let arrays = enc.scratch((3 * batches * 8) as usize);
    let mut p = params(d, &[a, b]);
    p.i[0] = r2 as i32;
    p.i[1] = r3 as i32;
    p.aux[0] = arrays;
    enc.launch_flat("matmul", "batch_ptrs", batches, p)?;
    let mut g = base;
    g.batch = batches as i32;
    g.ptrs = Some(arrays);
    enc.cmds.push(Cmd::Gemm(g));
    Ok(())
}

/// A quantized mul_mat through F16: each weight matrix is dequantized a slice of rows at a
/// time and multiplied with src1 converted to contiguous F16.
fn dequant_gemm(enc: &mut Encoder, qt: DType, a: TArg, b: TArg, bt: DType, d: TArg) -> Result<()> {
    let bh = to_contiguous(enc, b, bt, DType::F16)?;
    let (k, m) = (a.ne[0], a.ne[1]);
    let (r2, r3) = (d.ne[2] / a.ne[2], d.ne[3] / a.ne[3]);
    let slice = ((DEQUANT_SLICE as i64 / (2 * k)).max(256) / 256 * 256)
        .min(m)
        .max(1);
    let wbuf = enc.scratch((slice * k * 2) as usize);
    let name = format!("dequant_f16_{}", qt.name());
    for i03 in 0..a.ne[3] {
        for i02 in 0..a.ne[2] {
            let mut m0 = 0;
            while m0 < m {
                let rows = slice.min(m - m0);
                let mut src = a;
                src.ptr += (i02 * a.nb[2] + i03 * a.nb[3] + m0 * a.nb[1]) as u64;
                src.ne = [k, rows, 1, 1];
                let w = TArg {
                    ptr: wbuf,
                    ne: [k, rows, 1, 1],
                    nb: [2, 2 * k, 2 * k * rows, 2 * k * rows],
                };
                enc.launch_flat("matmul", &name, (k / 32) * rows, params(w, &[src]))?;
                // Every src1 batch that uses this weight matrix: i2 in [i02 r2, (i02+1) r2),
                // i3 in [i03 r3, (i03+1) r3); strided over i2 with the weights shared.
                for i3 in i03 * r3..(i03 + 1) * r3 {
                    let i2 = i02 * r2;
                    let g = GemmCmd {
                        m: rows as i32,
                        n: b.ne[1] as i32,
                        k: k as i32,
                        ab_type: GemmType::F16,
                        a: wbuf,
                        lda: k as i32,
                        stride_a: 0,
                        b: bh.ptr + (i2 * bh.nb[2] + i3 * bh.nb[3]) as u64,
                        ldb: (bh.nb[1] / 2) as i32,
                        stride_b: bh.nb[2] / 2,
                        c: d.ptr + (i2 * d.nb[2] + i3 * d.nb[3] + m0 * 4) as u64,
                        ldc: m as i32,
                        stride_c: d.nb[2] / 4,
                        batch: r2 as i32,
                        ptrs: None,
                        tf32: false,
                    };
                    enc.cmds.push(Cmd::Gemm(g));
                }
                m0 += rows;
            }
        }
    }
    Ok(())
}
