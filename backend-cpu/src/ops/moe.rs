//! The mixture-of-experts ops: mul_mat_id (each row of the activations multiplied by the
//! matrix of the expert its id names) and add_id (a bias row per expert).
//!
//! mul_mat_id groups the (slot, token) pairs by expert first, so that each expert's matrix is
//! read once per step whatever the number of tokens routed to it, and then works as mul_mat
//! does: the activation rows are converted once, up front, to the weights' dot-product type
//! (quantized weights, as ggml does) or to f32 (float weights, or precise mode), and each work
//! item is a tile of one expert's rows against every pair routed to that expert.

use tessera_core::quant::vec_dot_type;
use tessera_core::{Error, Result};

use super::dot::dot_tile;
use super::Ctx;
use crate::parallel::{for_ranges, for_rows_mut};
use crate::quant::{quantize_row, vec_dot_tile};
use crate::view::TView;

/// Weight rows per work item.
const TILE_ROWS: usize = 16;

/// Which of the `n_expert` experts `a` holds (ids `first..`) element (e, t) of `ids` names, if
/// any.
fn expert(ids: &TView, e: usize, t: usize, first: usize, n_expert: usize) -> Option<usize> {
    let v = ids.get_int([e, t, 0, 0]);
    usize::try_from(v)
        .ok()
        .and_then(|v| v.checked_sub(first))
        .filter(|&x| x < n_expert)
}

/// dst[:, e, t] = a[:, :, ids[e, t] - first] times b[:, e % n_b, t] (F32 result), 0 where `a`
/// does not hold the expert (a part of a meta device holding a slice of the experts).
pub(crate) fn mul_mat_id(
    ctx: &Ctx,
    dst: &TView,
    a: &TView,
    b: &TView,
    ids: &TView,
    first: usize,
) -> Result<()> {
    let (k, m, n_expert) = (a.ne[0], a.ne[1], a.ne[2]);
    let (n_used, n_tok, n_b) = (ids.ne[0], ids.ne[1], b.ne[1]);
    let fits = b.ne[0] == k
        && b.ne[2] == n_tok
        && n_b > 0
        && n_used.is_multiple_of(n_b)
        && dst.ne == [m, n_used, n_tok, 1];
    if !fits || !a.rows_contiguous() {
        return Err(Error::Invalid(format!(
            "mul_mat_id: experts {:?}, rows {:?} and ids {:?} -> {:?} do not fit",
            a.ne, b.ne, ids.ne, dst.ne
        )));
    }
    // The (slot, token) pairs of each expert held; the others' results are 0.
    let mut routed: Vec<Vec<(usize, usize)>> = vec![Vec::new(); n_expert];
    let zeros = vec![0f32; m];
    for t in 0..n_tok {
        for e in 0..n_used {
            match expert(ids, e, t, first, n_expert) {
                Some(x) => routed[x].push((e, t)),
                None => dst.store_row([e, t, 0], &zeros)?,
            }
        }
    }
    if k == 0 {
        return super::shape::fill(dst, 0.0);
    }
    let items: Vec<(usize, usize)> = routed
        .iter()
        .enumerate()
        .filter(|(_, p)| !p.is_empty())
        .flat_map(|(x, _)| (0..m.div_ceil(TILE_ROWS)).map(move |rt| (x, rt)))
        .collect();
    let pairs_per_item =
        (n_used * n_tok).div_ceil(routed.iter().filter(|p| !p.is_empty()).count().max(1));
    let cost = TILE_ROWS * k * pairs_per_item;
    // Activation row (j, t) is row j + n_b * t of the converted copy.
    let row_of = |e: usize, t: usize| e % n_b + n_b * t;
    let rows = |rt: usize| rt * TILE_ROWS..((rt + 1) * TILE_ROWS).min(m);
    if a.dtype.is_quantized() && !ctx.precise {
        let vt = vec_dot_type(a.dtype);
        let vrow = vt.row_size(k)?;
        let mut cols = vec![0u8; n_b * n_tok * vrow];
        for_rows_mut(&mut cols, vrow, k * 2, |r, out| {
            let mut f = vec![0f32; k];
            b.load_row([r % n_b, r / n_b, 0], &mut f)?;
            quantize_row(vt, &f, out)
        })?;
        let col = |r: usize| &cols[r * vrow..(r + 1) * vrow];
        let t = a.dtype;
        for_ranges(items.len(), cost, |range| {
            for &(x, rt) in &items[range] {
                let rows = rows(rt);
                let xs4 = |i: usize| {
                    [
                        a.row([i, x, 0]),
                        a.row([i + 1, x, 0]),
                        a.row([i + 2, x, 0]),
                        a.row([i + 3, x, 0]),
                    ]
                };
                // Four routed rows at a time share each unpacked weight block (a prompt), then
                // the rest one by one.
                let groups = routed[x].chunks_exact(4);
                let rest = groups.remainder();
                for g in groups {
                    let ys = [0, 1, 2, 3].map(|c| col(row_of(g[c].0, g[c].1)));
                    let mut i = rows.start;
                    while i + 4 <= rows.end {
                        let o = vec_dot_tile::<4, 4>(t, k, &xs4(i), &ys);
                        for (c, &(e, tok)) in g.iter().enumerate() {
                            dst.set_run([i, e, tok, 0], &o.map(|r| r[c]));
                        }
                        i += 4;
                    }
                    for i in i..rows.end {
                        let o = vec_dot_tile::<1, 4>(t, k, &[a.row([i, x, 0])], &ys);
                        for (c, &(e, tok)) in g.iter().enumerate() {
                            dst.set_run([i, e, tok, 0], &[o[0][c]]);
                        }
                    }
                }
                for &(e, tok) in rest {
                    let y = [col(row_of(e, tok))];
                    let mut i = rows.start;
                    while i + 4 <= rows.end {
                        let o = vec_dot_tile::<4, 1>(t, k, &xs4(i), &y);
                        dst.set_run([i, e, tok, 0], &o.map(|r| r[0]));
                        i += 4;
                    }
                    for i in i..rows.end {
                        let o = vec_dot_tile::<1, 1>(t, k, &[a.row([i, x, 0])], &y);
                        dst.set_run([i, e, tok, 0], &[o[0][0]]);
                    }
                }
            }
            Ok(())
        })
    } else {
        let mut cols = vec![0f32; n_b * n_tok * k];
        for_rows_mut(&mut cols, k, k, |r, out| {
            b.load_row([r % n_b, r / n_b, 0], out)
        })?;
        let col = |r: usize| &cols[r * k..(r + 1) * k];
        for_ranges(items.len(), cost, |range| {
            let mut tile = vec![0f32; TILE_ROWS * k];
            for &(x, rt) in &items[range] {
                let rows = rows(rt);
                for (w, i) in tile.chunks_exact_mut(k).zip(rows.clone()) {
                    a.load_row([i, x, 0], w)?;
                }
                let w = |i: usize| &tile[(i - rows.start) * k..(i - rows.start + 1) * k];
                let groups = routed[x].chunks_exact(4);
                let rest = groups.remainder();
                for g in groups {
                    let ys = [0, 1, 2, 3].map(|c| col(row_of(g[c].0, g[c].1)));
                    let mut i = rows.start;
                    while i + 2 <= rows.end {
                        let o = dot_tile::<2, 4>(&[w(i), w(i + 1)], &ys);
                        for (c, &(e, tok)) in g.iter().enumerate() {
                            dst.set_run([i, e, tok, 0], &o.map(|r| r[c]));
                        }
                        i += 2;
                    }
                    for i in i..rows.end {
                        let o = dot_tile::<1, 4>(&[w(i)], &ys);
                        for (c, &(e, tok)) in g.iter().enumerate() {
                            dst.set_run([i, e, tok, 0], &[o[0][c]]);
                        }
                    }
                }
                for &(e, tok) in rest {
                    let y = [col(row_of(e, tok))];
                    let mut i = rows.start;
                    while i + 4 <= rows.end {
                        let o = dot_tile::<4, 1>(&[w(i), w(i + 1), w(i + 2), w(i + 3)], &y);
                        dst.set_run([i, e, tok, 0], &o.map(|r| r[0]));
                        i += 4;
                    }
                    for i in i..rows.end {
                        let o = dot_tile::<1, 1>(&[w(i)], &y);
                        dst.set_run([i, e, tok, 0], &[o[0][0]]);
                    }
                }
            }
            Ok(())
        })
    }
}

/// dst[:, e, t] = a[:, e, t] + b[:, ids[e, t]].
pub(crate) fn add_id(dst: &TView, a: &TView, b: &TView, ids: &TView) -> Result<()> {
    let n = a.ne[0];
    let n_rows = b.ne[1];
    for_ranges(dst.nrows(), n, |rows| {
        let (mut x, mut y) = (vec![0f32; n], vec![0f32; n]);
        for r in rows {
            let [e, t, _] = dst.row_index(r);
            let v = ids.get_int([e, t, 0, 0]);
            let row = usize::try_from(v)
                .ok()
                .filter(|&i| i < n_rows)
                .ok_or_else(|| {
                    Error::Invalid(format!(
                        "add_id: id {v} (slot {e}, token {t}) is outside 0..{n_rows}"
                    ))
                })?;
            a.load_row([e, t, 0], &mut x)?;
            b.load_row([row, 0, 0], &mut y)?;
            for (p, q) in x.iter_mut().zip(&y) {
                *p += q;
            }
            dst.store_row([e, t, 0], &x)?;
        }
        Ok(())
    })
}
