//! mul_mat: dst[i, j, b2, b3] = sum_k src0[k, i, b2 / r2, b3 / r3] * src1[k, j, b2, b3], where
//! src0 (the weights, any float or quantized type) is broadcast over src1's batch dims 2-3.
//!
//! Two paths:
//! - **Quantized weights** (the default): every src1 column is quantized once, up front, to the
//!   weights' dot-product type (`vec_dot_type`, as ggml does), and the products are computed
//!   straight on the blocks by `vec_dot_tile`: 4 weight rows by 4 columns in one pass (4 rows by
//!   1 column for a lone column, as in decoding), so that each unpacked weight block is used for
//!   4 columns and each activation block for 4 rows while they are in registers.
//! - **Float math** (float weights, or quantized weights in precise mode): src1 columns are
//!   converted to f32 once; weight rows are converted (dequantized) to f32 a tile at a time and
//!   multiplied with f32 dot products, 2 rows by 4 columns per pass (`dot_tile`). Nothing larger
//!   than a tile is ever dequantized.
//!
//! Work is split into tiles of a few weight rows by a few columns: a tile's weight rows stay in
//! the first-level cache while its columns stream past them, and consecutive tiles on one
//! thread share weight rows. The tiles are spread over the thread pool.

use tessera_core::quant::vec_dot_type;
use tessera_core::{Error, Result};

use super::dot::dot_tile;
use super::Ctx;
use crate::parallel::{for_ranges, for_rows_mut};
use crate::quant::{quantize_row, vec_dot_tile};
use crate::view::TView;

/// Bytes of weight rows a tile aims to keep in the first-level cache.
const TILE_WEIGHT_BYTES: usize = 16 * 1024;
/// Most weight rows in a tile.
const MAX_TILE_ROWS: usize = 64;
/// Columns of src1 per tile.
const TILE_COLS: usize = 32;

/// The shape of the product and how the work is cut.
struct Plan {
    /// Inner dimension.
    k: usize,
    /// Rows of src0 (outputs per column).
    m: usize,
    /// Columns of src1 per batch.
    n: usize,
    /// src1's batch dims (e2, e3) and src0's broadcast ratios (r2, r3).
    e2: usize,
    r2: usize,
    r3: usize,
    /// Weight rows and columns per tile, and the tile counts.
    tile_rows: usize,
    row_tiles: usize,
    col_tiles: usize,
}

impl Plan {
    fn new(dst: &TView, a: &TView, b: &TView, row_bytes: usize) -> Result<Plan> {
        let fits = a.ne[0] == b.ne[0]
            && b.ne[2].checked_rem(a.ne[2]) == Some(0)
            && b.ne[3].checked_rem(a.ne[3]) == Some(0)
            && dst.ne == [a.ne[1], b.ne[1], b.ne[2], b.ne[3]];
        if !fits {
            return Err(Error::Invalid(format!(
                "mul_mat: shapes {:?} x {:?} -> {:?} do not fit",
                a.ne, b.ne, dst.ne
            )));
        }
        let (m, n) = (a.ne[1], b.ne[1]);
        // A multiple of 4 rows, so that the kernels' row groups (2 or 4) divide it.
        let tile_rows = (TILE_WEIGHT_BYTES / row_bytes.max(1) / 4 * 4)
            .clamp(4, MAX_TILE_ROWS)
            .min(m.max(1));
        Ok(Plan {
            k: a.ne[0],
            m,
            n,
            e2: b.ne[2],
            r2: b.ne[2] / a.ne[2],
            r3: b.ne[3] / a.ne[3],
            tile_rows,
            row_tiles: m.div_ceil(tile_rows),
            col_tiles: n.div_ceil(TILE_COLS),
        })
    }

    /// Multiply-adds in one tile.
    fn tile_work(&self) -> usize {
        self.tile_rows * self.n.min(TILE_COLS) * self.k
    }

    /// Number of tiles over all batches.
    fn tiles(&self, batches: usize) -> usize {
        batches * self.row_tiles * self.col_tiles
    }

    /// Runs `f(b2, b3, rows, cols)` for each tile in `range` (column tiles innermost, so
    /// neighbouring tiles share weight rows).
    fn for_tiles(
        &self,
        range: std::ops::Range<usize>,
        mut f: impl FnMut(usize, usize, std::ops::Range<usize>, std::ops::Range<usize>) -> Result<()>,
    ) -> Result<()> {
        for t in range {
            let ct = t % self.col_tiles;
            let rt = (t / self.col_tiles) % self.row_tiles;
            let batch = t / (self.col_tiles * self.row_tiles);
            let rows = rt * self.tile_rows..((rt + 1) * self.tile_rows).min(self.m);
            let cols = ct * TILE_COLS..((ct + 1) * TILE_COLS).min(self.n);
            f(batch % self.e2, batch / self.e2, rows, cols)?;
        }
        Ok(())
    }
}

/// Runs mul_mat into `dst` (F32).
pub(crate) fn run(ctx: &Ctx, dst: &TView, a: &TView, b: &TView) -> Result<()> {
    if !a.rows_contiguous() {
        return Err(Error::Invalid(
            "mul_mat: src0 rows must be contiguous".into(),
        ));
    }
    if a.ne[0] == 0 {
        // An empty inner dimension: every sum is 0.
        return super::shape::fill(dst, 0.0);
    }
    if a.dtype.is_quantized() && !ctx.precise {
        quantized(dst, a, b)
    } else {
        float(dst, a, b)
    }
}

/// Quantized weights: columns quantized to the dot type once, then `vec_dot_tile` per group of
/// rows and columns.
fn quantized(dst: &TView, a: &TView, b: &TView) -> Result<()> {
    let p = Plan::new(dst, a, b, a.dtype.row_size(a.ne[0])?)?;
    let vt = vec_dot_type(a.dtype);
    let vrow = vt.row_size(p.k)?;
    let mut cols = vec![0u8; b.nrows() * vrow];
    for_rows_mut(&mut cols, vrow, p.k * 2, |r, out| {
        let mut f = vec![0f32; p.k];
        b.load_row(b.row_index(r), &mut f)?;
        quantize_row(vt, &f, out)
    })?;
    let cols = &cols;
    let batches = b.ne[2] * b.ne[3];
    for_ranges(p.tiles(batches), p.tile_work(), |range| {
        p.for_tiles(range, |b2, b3, rows, js| {
            let mut xs: [&[u8]; MAX_TILE_ROWS] = [&[]; MAX_TILE_ROWS];
            let (a2, a3) = (b2 / p.r2, b3 / p.r3);
            for (x, i) in xs.iter_mut().zip(rows.clone()) {
                *x = a.row([i, a2, a3]);
            }
            let xs = &xs[..rows.len()];
            let col0 = p.n * (b2 + p.e2 * b3);
            let col = |j: usize| &cols[(col0 + j) * vrow..(col0 + j + 1) * vrow];
            let out = |j: usize| Out {
                dst,
                row0: rows.start,
                col0: j,
                b2,
                b3,
            };
            let mut j = js.start;
            while j + 4 <= js.end {
                let ys = [col(j), col(j + 1), col(j + 2), col(j + 3)];
                let (t, k) = (a.dtype, p.k);
                tile_rows::<_, 4, 4>(
                    xs,
                    &ys,
                    |x, y| vec_dot_tile(t, k, x, y),
                    |x, y| vec_dot_tile(t, k, x, y),
                    &out(j),
                );
                j += 4;
            }
            for j in j..js.end {
                let (t, k) = (a.dtype, p.k);
                tile_rows::<_, 4, 1>(
                    xs,
                    &[col(j)],
                    |x, y| vec_dot_tile(t, k, x, y),
                    |x, y| vec_dot_tile(t, k, x, y),
                    &out(j),
                );
            }
            Ok(())
        })
    })
}

/// Where a group of results goes: rows from `row0` and columns from `col0` of batch (b2, b3).
struct Out<'a> {
    dst: &'a TView,
    row0: usize,
    col0: usize,
    b2: usize,
    b3: usize,
}

impl Out<'_> {
    /// Stores `vals` as rows `row0 + r ..` of column `col0 + c`.
    #[inline]
    fn put<const N: usize>(&self, r: usize, c: usize, vals: &[f32; N]) {
        self.dst
            .set_run([self.row0 + r, self.col0 + c, self.b2, self.b3], vals);
    }
}

/// The dot products of the weight rows `xs` with the `C` columns `ys`, `R` rows at a time with
/// `full` and the rows left over one at a time with `one`, into `out`.
fn tile_rows<T: ?Sized, const R: usize, const C: usize>(
    xs: &[&T],
    ys: &[&T; C],
    full: impl Fn(&[&T; R], &[&T; C]) -> [[f32; C]; R],
    one: impl Fn(&[&T; 1], &[&T; C]) -> [[f32; C]; 1],
    out: &Out,
) {
    let groups = xs.chunks_exact(R);
    let rest = groups.remainder();
    for (g, x) in groups.enumerate() {
        if let Ok(x) = <&[&T; R]>::try_from(x) {
            let tile = full(x, ys);
            for c in 0..C {
                out.put(g * R, c, &tile.map(|o| o[c]));
            }
        }
    }
    let r0 = xs.len() - rest.len();
    for (r, &x) in rest.iter().enumerate() {
        for (c, &v) in one(&[x], ys)[0].iter().enumerate() {
            out.put(r0 + r, c, &[v]);
        }
    }
}

/// Float math: columns and tiles of weight rows converted to f32, then f32 dot-product tiles.
fn float(dst: &TView, a: &TView, b: &TView) -> Result<()> {
    let p = Plan::new(dst, a, b, a.ne[0] * std::mem::size_of::<f32>())?;
    let k = p.k;
    let mut cols = vec![0f32; b.nrows() * k];
    for_rows_mut(&mut cols, k, k, |r, out| b.load_row(b.row_index(r), out))?;
    let cols = &cols;
    let batches = b.ne[2] * b.ne[3];
    for_ranges(p.tiles(batches), p.tile_work(), |range| {
        let mut tile = vec![0f32; p.tile_rows * k];
        // The tile currently converted: (b2 / r2, b3 / r3, first row).
        let mut loaded = None;
        p.for_tiles(range, |b2, b3, rows, js| {
            let key = (b2 / p.r2, b3 / p.r3, rows.start);
            if loaded != Some(key) {
                for (t, i) in tile.chunks_exact_mut(k).zip(rows.clone()) {
                    a.load_row([i, key.0, key.1], t)?;
                }
                loaded = Some(key);
            }
            let col0 = p.n * (b2 + p.e2 * b3);
            let col = |j: usize| &cols[(col0 + j) * k..(col0 + j + 1) * k];
            let mut xs: [&[f32]; MAX_TILE_ROWS] = [&[]; MAX_TILE_ROWS];
            for (x, t) in xs.iter_mut().zip(tile.chunks_exact(k)) {
                *x = t;
            }
            let xs = &xs[..rows.len()];
            let out = |j: usize| Out {
                dst,
                row0: rows.start,
                col0: j,
                b2,
                b3,
            };
            let mut j = js.start;
            while j + 4 <= js.end {
                let ys = [col(j), col(j + 1), col(j + 2), col(j + 3)];
                tile_rows::<_, 2, 4>(xs, &ys, dot_tile, dot_tile, &out(j));
                j += 4;
            }
            for j in j..js.end {
                let ys = [col(j)];
                tile_rows::<_, 4, 1>(xs, &ys, dot_tile, dot_tile, &out(j));
            }
            Ok(())
        })?;
        Ok(())
    })
}
