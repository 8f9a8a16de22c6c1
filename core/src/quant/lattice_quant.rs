//! Quantization to the lattice i-quants IQ1_M, IQ2_S, IQ3_XXS and IQ3_S, as ggml's
//! `quantize_row_iq1_m_impl`, `quantize_row_iq2_s_impl`, `quantize_row_iq3_xxs_impl` and
//! `quantize_row_iq3_s_impl` do it without an importance matrix (bit for bit: checked against
//! ggml's bytes in core/tests/quant_reference.rs).
//!
//! IQ1_M (below, `quantize_iq1_m`) has three levels per value: for each 16-value sub-block every
//! split of its sorted values into the three levels and every pair of delta signs (one per
//! 8 values) is scored exactly, the best split snapped to the grid, and the block scale fitted
//! to the 3-bit sub-block scales at the end. For the other types:
//!
//! A group of `N` values (8 for IQ2_S, 4 for the IQ3 types) is a point of the type's grid,
//! whose coordinates are odd numbers `2l + 1` (`l` the rank of the grid's byte value, in
//! increasing order). For each sub-block (16 values for IQ2_S, 32 for the IQ3 types) the signs
//! are taken off (IQ3_XXS keeps seven per 8 values: an odd count of minus signs flips the value
//! of least weight), and a range of trial scales each round every group to the nearest lattice
//! point; a point off the grid is replaced by its best grid neighbour (of the few nearest
//! distances) under the square roots of the weights (`x^2`, plus a quarter of the block's mean
//! square for IQ2_S). The trial with the best weighted fit sets the sub-block's points and
//! scale, which are then refined once more from that scale; the block's scale is the largest
//! sub-block scale over 31 times a small fudge factor, and each sub-block scale a 4-bit odd
//! multiple of it.

use std::sync::OnceLock;

use super::iq_grids::{IQ1S_GRID, IQ2S_GRID, IQ2XS_GRID, IQ2XXS_GRID, IQ3S_GRID, IQ3XXS_GRID};
use super::k_search::nearest_int;
use super::put_f16;

/// A lattice grid of `N`-value points with its lookup from every code (the `l` of coordinate i
/// at bits `bits * i`) and the neighbour lists of the codes off the grid.
struct Grid<const N: usize> {
    /// Bits per coordinate in a code.
    bits: usize,
    /// Each point's coordinates `2l + 1`.
    points: Vec<[i8; N]>,
    /// For each code: its point, or the range of its neighbours in `neighbours` (empty for
    /// codes no rounding reaches).
    map: Vec<Result<u16, (u32, u32)>>,
    /// The neighbour lists: the points of the `nwant` smallest squared distances from the
    /// code, nearest first, ties by index.
    neighbours: Vec<u16>,
}

impl<const N: usize> Grid<N> {
    /// The grid of `table` (each point's `N` bytes), whose codes have `bits` per coordinate,
    /// with neighbour lists of `nwant` distances for every code whose levels are at most
    /// `lmax` (the ones the quantizer's rounding gives).
    fn new(table: &[[u8; N]], bits: usize, lmax: usize, nwant: usize) -> Grid<N> {
        let mut values: Vec<u8> = table.iter().flatten().copied().collect();
        values.sort_unstable();
        values.dedup();
        let level = |b: u8| values.iter().position(|&v| v == b).unwrap_or(0) as i8;
        let points: Vec<[i8; N]> = table.iter().map(|p| p.map(|b| 2 * level(b) + 1)).collect();
        let mut map: Vec<Result<u16, (u32, u32)>> = vec![Err((0, 0)); 1 << (bits * N)];
        for (k, p) in points.iter().enumerate() {
            let l = p.map(|c| (c - 1) / 2);
            map[code(&l, bits)] = Ok(k as u16);
        }
        let mask = (1 << bits) - 1;
        let mut neighbours = Vec::new();
        let mut dist: Vec<(i32, u16)> = Vec::with_capacity(points.len());
        for (u, slot) in map.iter_mut().enumerate() {
            let pos: [i32; N] = std::array::from_fn(|i| 2 * ((u >> (bits * i)) & mask) as i32 + 1);
            if slot.is_ok() || pos.iter().any(|&p| p > 2 * lmax as i32 + 1) {
                continue;
            }
            dist.clear();
            dist.extend(points.iter().enumerate().map(|(j, p)| {
                let d2 = (0..N).map(|i| (i32::from(p[i]) - pos[i]).pow(2)).sum();
                (d2, j as u16)
            }));
            // The `nwant` smallest distances, then every point within them in (distance,
            // index) order.
            let mut near: Vec<i32> = Vec::with_capacity(nwant + 1);
            for &(d, _) in &dist {
                if !near.contains(&d) {
                    let at = near.partition_point(|&x| x < d);
                    near.insert(at, d);
                    near.truncate(nwant);
                }
            }
            let limit = near[near.len() - 1];
            let start = neighbours.len();
            let mut within: Vec<(i32, u16)> =
                dist.iter().copied().filter(|&(d, _)| d <= limit).collect();
            within.sort_unstable();
            neighbours.extend(within.iter().map(|&(_, j)| j));
            *slot = Err((start as u32, (neighbours.len() - start) as u32));
        }
        Grid {
            bits,
            points,
            map,
            neighbours,
        }
    }

    /// The point for the levels `l` of a group: its own where it is on the grid, else the
    /// neighbour nearest to `x` at `scale` under weights `w` (and `l` is set to it). Returns
    /// whether `l` was on the grid.
    fn snap(&self, l: &mut [i8], x: &[f32], w: &[f32], scale: f32) -> bool {
        let (start, n) = match self.map[code(l, self.bits)] {
            Ok(_) => return true,
            Err(range) => range,
        };
        let mut best = f32::MAX;
        let mut index = 0u16;
        for &j in &self.neighbours[start as usize..(start + n) as usize] {
            let p = &self.points[j as usize];
            let mut d2 = 0f32;
            for i in 0..N {
                let diff = scale * f32::from(p[i]) - x[i];
                d2 += w[i] * diff * diff;
            }
            if d2 < best {
                best = d2;
                index = j;
            }
        }
        for (l, &c) in l.iter_mut().zip(&self.points[index as usize]) {
            *l = (c - 1) / 2;
        }
        false
    }

    /// The grid index of levels `l` (on the grid).
    fn index(&self, l: &[i8]) -> u16 {
        self.map[code(l, self.bits)].unwrap_or(0)
    }
}

/// The code of levels `l`, `bits` per coordinate.
fn code(l: &[i8], bits: usize) -> usize {
    l.iter()
        .enumerate()
        .map(|(i, &v)| (v as usize) << (bits * i))
        .sum()
}

/// The IQ2_S grid (1024 points of 8, neighbours of one distance).
fn grid_iq2_s() -> &'static Grid<8> {
    static G: OnceLock<Grid<8>> = OnceLock::new();
    G.get_or_init(|| {
        let t: Vec<[u8; 8]> = IQ2S_GRID.iter().map(|g| g.to_le_bytes()).collect();
        Grid::new(&t, 2, 2, 1)
    })
}

/// The IQ3_XXS grid (256 points of 4, neighbours of two distances).
fn grid_iq3_xxs() -> &'static Grid<4> {
    static G: OnceLock<Grid<4>> = OnceLock::new();
    G.get_or_init(|| {
        let t: Vec<[u8; 4]> = IQ3XXS_GRID.iter().map(|g| g.to_le_bytes()).collect();
        Grid::new(&t, 3, 7, 2)
    })
}

/// The IQ3_S grid (512 points of 4, neighbours of three distances).
fn grid_iq3_s() -> &'static Grid<4> {
    static G: OnceLock<Grid<4>> = OnceLock::new();
    G.get_or_init(|| {
        let t: Vec<[u8; 4]> = IQ3S_GRID.iter().map(|g| g.to_le_bytes()).collect();
        Grid::new(&t, 3, 7, 3)
    })
}

/// What differs between the types' sub-block searches.
struct Rules {
    /// Largest level.
    lmax: i32,
    /// Trial scales `(2 lmax + 1 + is * step) / max` for `is` in `-steps..=steps`.
    steps: i32,
    step: f32,
    /// A sub-block whose largest magnitude is below this (or zero, where `None`) is zeros.
    eps: Option<f32>,
    /// Seven sign bits per 8 values (IQ3_XXS): the eighth is their parity.
    parity: bool,
    /// The refinement redoes only the groups that were off the grid (else all of them).
    refine_off_grid: bool,
}

/// One sub-block's result: its scale, the grid index of each group, its sign bytes.
struct Sub {
    scale: f32,
    index: [u16; 8],
    signs: [u8; 4],
}

/// The weighted sums `sum w x q` and `sum w q^2` of levels `l` (q = 2l + 1).
fn fit(w: &[f32], x: &[f32], l: &[i8]) -> (f32, f32) {
    let (mut qx, mut q2) = (0f32, 0f32);
    for i in 0..l.len() {
        let q = f32::from(2 * l[i] + 1);
        qx += w[i] * x[i] * q;
        q2 += w[i] * q * q;
    }
    (qx, q2)
}

/// Quantizes one sub-block `xb` (16 or 32 values) with `weight` on grid `g`; `None` for a
/// sub-block that quantizes to zeros.
fn sub_block<const N: usize>(g: &Grid<N>, r: &Rules, xb: &[f32], weight: &[f32]) -> Option<Sub> {
    let n = xb.len();
    let groups = n / N;
    let mut waux = [0f32; 32];
    for (a, &w) in waux.iter_mut().zip(weight) {
        *a = w.sqrt();
    }
    let mut xval = [0f32; 32];
    let mut signs = [0u8; 4];
    for k in 0..n / 8 {
        let (mut s, mut flips) = (0u8, 0);
        for i in 0..8 {
            let v = xb[8 * k + i];
            if v >= 0.0 {
                xval[8 * k + i] = v;
            } else {
                xval[8 * k + i] = -v;
                s |= 1 << i;
                flips += 1;
            }
        }
        if r.parity && flips % 2 == 1 {
            // An odd count of minus signs: the value of least weight takes the other sign.
            let mut imin = 0;
            let mut min = weight[8 * k] * xb[8 * k] * xb[8 * k];
            for i in 1..8 {
                let a = weight[8 * k + i] * xb[8 * k + i] * xb[8 * k + i];
                if a < min {
                    min = a;
                    imin = i;
                }
            }
            xval[8 * k + imin] = -xval[8 * k + imin];
            s ^= 1 << imin;
        }
        signs[k] = if r.parity { s & 127 } else { s };
    }
    let xval = &xval[..n];
    let waux = &waux[..n];
    let max = xval[1..]
        .iter()
        .fold(xval[0], |m, &v| if m > v { m } else { v });
    let zero = match r.eps {
        Some(eps) => max < eps,
        None => max == 0.0,
    };
    if zero {
        return None;
    }
    let top = (2 * r.lmax + 1) as f32;
    let mut best = 0f32;
    let mut scale = max / top;
    let mut l = [0i8; 32];
    let mut on_grid = [r.refine_off_grid; 8];
    let mut laux = [0i8; 32];
    let mut on_aux = [true; 8];
    let round = |x: &[f32], id: f32, l: &mut [i8]| {
        for (l, &x) in l.iter_mut().zip(x) {
            *l = nearest_int(0.5 * (id * x - 1.0)).clamp(0, r.lmax) as i8;
        }
    };
    for is in -r.steps..=r.steps {
        let id = (top + is as f32 * r.step) / max;
        let this_scale = 1.0 / id;
        for (k, on) in on_aux.iter_mut().enumerate().take(groups) {
            let at = N * k..N * k + N;
            round(&xval[at.clone()], id, &mut laux[at.clone()]);
            *on = g.snap(
                &mut laux[at.clone()],
                &xval[at.clone()],
                &waux[at],
                this_scale,
            );
        }
        let (qx, q2) = fit(weight, xval, &laux[..n]);
        if q2 > 0.0 && qx * qx > best * q2 {
            scale = qx / q2;
            best = scale * qx;
            l = laux;
            on_grid = on_aux;
        }
    }
    if on_grid[..groups].iter().any(|&o| !o) && scale > 0.0 {
        let id = 1.0 / scale;
        for (k, &on) in on_grid.iter().enumerate().take(groups) {
            if r.refine_off_grid && on {
                continue;
            }
            let at = N * k..N * k + N;
            round(&xval[at.clone()], id, &mut l[at.clone()]);
            g.snap(&mut l[at.clone()], &xval[at.clone()], &waux[at], scale);
        }
        let (qx, q2) = fit(weight, xval, &l[..n]);
        if q2 > 0.0 {
            scale = qx / q2;
        }
    }
    if scale < 0.0 {
        scale = -scale;
        for s in &mut signs {
            *s = if r.parity { !*s & 127 } else { !*s };
        }
    }
    let mut index = [0u16; 8];
    for (k, ix) in index.iter_mut().enumerate().take(groups) {
        // Every group is on the grid by now.
        *ix = g.index(&l[N * k..N * k + N]);
    }
    Some(Sub {
        scale,
        index,
        signs,
    })
}

/// The 4-bit code of a sub-block scale at the block's inverse scale `id` (scale = d (2c + 1)).
fn scale_code(id: f32, scale: f32) -> u8 {
    nearest_int(0.5 * (id * scale - 1.0)).clamp(0, 15) as u8
}

/// The weights `x^2` of the values of a sub-block.
fn squares<const M: usize>(xb: &[f32]) -> [f32; M] {
    std::array::from_fn(|i| xb[i] * xb[i])
}

/// Quantizes one IQ2_S block (layout: `iq2`).
pub(super) fn quantize_iq2_s(x: &[f32], b: &mut [u8]) {
    const RULES: Rules = Rules {
        lmax: 2,
        steps: 9,
        step: 0.1,
        eps: Some(1e-8),
        parity: false,
        refine_off_grid: true,
    };
    b.fill(0);
    let g = grid_iq2_s();
    let mut sumx2 = 0f32;
    for &v in x {
        sumx2 += v * v;
    }
    let sigma2 = 2.0 * sumx2 / 256.0;
    let mut scales = [0f32; 16];
    let mut max_scale = 0f32;
    for ib in 0..16 {
        let xb = &x[16 * ib..16 * ib + 16];
        let weight: [f32; 16] = std::array::from_fn(|i| 0.25 * sigma2 + xb[i] * xb[i]);
        let Some(s) = sub_block(g, &RULES, xb, &weight) else {
            continue;
        };
        for k in 0..2 {
            let i8 = 2 * ib + k;
            let ix = s.index[k];
            b[2 + i8] = ix as u8;
            b[66 + i8 / 4] |= ((ix >> 8) as u8) << (2 * (i8 % 4));
            b[34 + i8] = s.signs[k];
        }
        scales[ib] = s.scale;
        max_scale = max_scale.max(s.scale);
    }
    if max_scale == 0.0 {
        return;
    }
    let d = max_scale / 31.0;
    put_f16(b, 0, d * 0.9875);
    let id = 1.0 / d;
    for ib in 0..16 {
        b[74 + ib / 2] |= scale_code(id, scales[ib]) << (4 * (ib % 2));
    }
}

/// Quantizes one IQ3_XXS block (layout: `iq3`).
pub(super) fn quantize_iq3_xxs(x: &[f32], b: &mut [u8]) {
    const RULES: Rules = Rules {
        lmax: 7,
        steps: 15,
        step: 0.2,
        eps: Some(1e-8),
        parity: true,
        refine_off_grid: true,
    };
    b.fill(0);
    let g = grid_iq3_xxs();
    let mut scales = [0f32; 8];
    let mut max_scale = 0f32;
    for ib in 0..8 {
        let xb = &x[32 * ib..32 * ib + 32];
        let Some(s) = sub_block(g, &RULES, xb, &squares::<32>(xb)) else {
            continue;
        };
        for (k, &ix) in s.index.iter().enumerate() {
            b[2 + 8 * ib + k] = ix as u8;
        }
        let aux = s
            .signs
            .iter()
            .enumerate()
            .fold(0u32, |a, (k, &v)| a | (u32::from(v) << (7 * k)));
        b[66 + 4 * ib..70 + 4 * ib].copy_from_slice(&aux.to_le_bytes());
        scales[ib] = s.scale;
        max_scale = max_scale.max(s.scale);
    }
    if max_scale == 0.0 {
        b.fill(0);
        return;
    }
    let d = max_scale / 31.0;
    put_f16(b, 0, d * 1.0125);
    let id = 1.0 / d;
    for (ib, &s) in scales.iter().enumerate() {
        b[69 + 4 * ib] |= scale_code(id, s) << 4;
    }
}

/// Quantizes one IQ3_S block (layout: `iq3`). As in ggml, a sub-block that is all zeros
/// leaves its 8 index bytes and 4 sign bytes unwritten and the next sub-block's are written in
/// their place (the high index bits and the scales keep their positions).
pub(super) fn quantize_iq3_s(x: &[f32], b: &mut [u8]) {
    const RULES: Rules = Rules {
        lmax: 7,
        steps: 9,
        step: 0.2,
        eps: None,
        parity: false,
        refine_off_grid: false,
    };
    b.fill(0);
    let g = grid_iq3_s();
    let mut scales = [0f32; 8];
    let mut max_scale = 0f32;
    let (mut qs, mut sg) = (2, 74);
    for ib in 0..8 {
        let xb = &x[32 * ib..32 * ib + 32];
        let Some(s) = sub_block(g, &RULES, xb, &squares::<32>(xb)) else {
            continue;
        };
        for (k, &ix) in s.index.iter().enumerate() {
            b[qs + k] = ix as u8;
            b[66 + ib] |= ((ix >> 8) as u8) << k;
        }
        b[sg..sg + 4].copy_from_slice(&s.signs);
        qs += 8;
        sg += 4;
        scales[ib] = s.scale;
        max_scale = max_scale.max(s.scale);
    }
    if max_scale == 0.0 {
        return;
    }
    let d = max_scale / 31.0;
    put_f16(b, 0, d * 1.033);
    let id = 1.0 / d;
    for ib in (0..8).step_by(2) {
        b[106 + ib / 2] = scale_code(id, scales[ib]) | (scale_code(id, scales[ib + 1]) << 4);
    }
}

/// The IQ1_S / IQ1_M grid (2048 points of 8 values in {-1, 0, 1}, neighbours of three
/// distances); its bytes are taken as signed values.
fn grid_iq1() -> &'static Grid<8> {
    static G: OnceLock<Grid<8>> = OnceLock::new();
    G.get_or_init(|| {
        let t: Vec<[u8; 8]> = IQ1S_GRID
            .iter()
            .map(|g| g.to_le_bytes().map(|b| (b as i8 + 1) as u8))
            .collect();
        Grid::new(&t, 2, 2, 3)
    })
}

/// IQ1_M's values of the levels 0, 1, 2 with the delta added (`X_P`) or taken off (`X_M`).
const X_P: [f32; 3] = [-1.0 + 0.125, 0.125, 1.0 + 0.125];
const X_M: [f32; 3] = [-1.0 - 0.125, -0.125, 1.0 - 0.125];

/// The values of group `k` (0 or 1) of an IQ1_M sub-block with sign pattern `shift` (0: both
/// groups' deltas added, 1: the second's taken off, 2: the first's, 3: both).
fn iq1m_values(shift: usize, k: usize) -> &'static [f32; 3] {
    let plus = if k == 0 {
        shift < 2
    } else {
        shift.is_multiple_of(2)
    };
    if plus {
        &X_P
    } else {
        &X_M
    }
}

/// The neighbour (from `range` of the grid's lists) whose values `xx` of its levels, at
/// `scale`, are nearest to the 8 signed values `xb` under weights `w`.
fn iq1_nearest(
    g: &Grid<8>,
    range: (u32, u32),
    xb: &[f32],
    w: &[f32],
    scale: f32,
    xx: &[f32; 3],
) -> u16 {
    let (start, n) = range;
    let mut best = f32::MAX;
    let mut index = 0u16;
    for &j in &g.neighbours[start as usize..(start + n) as usize] {
        let p = &g.points[j as usize];
        let mut d2 = 0f32;
        for i in 0..8 {
            let q = xx[((p[i] - 1) / 2) as usize];
            let diff = scale * q - xb[i];
            d2 += w[i] * diff * diff;
        }
        if d2 < best {
            best = d2;
            index = j;
        }
    }
    index
}

/// The positions of `xb`'s values in increasing order (equal values keep their order).
fn ascending(xb: &[f32]) -> Vec<usize> {
    let mut order: Vec<usize> = (0..xb.len()).collect();
    order.sort_by(|&a, &b| {
        xb[a]
            .partial_cmp(&xb[b])
            .unwrap_or(std::cmp::Ordering::Equal)
    });
    order
}

/// The IQ1 levels of values split at `i1` and `i2` of their increasing `order` (level 0 below
/// `i1`, 1 below `i2`, else 2), mirrored (2 - level) when the best `scale` came out negative,
/// which it then makes positive; returns whether it mirrored.
fn iq1_levels<const N: usize>(
    order: &[usize],
    i1: usize,
    i2: usize,
    scale: &mut f32,
) -> ([i8; N], bool) {
    let mut l = [0i8; N];
    for (j, &i) in order.iter().enumerate() {
        l[i] = if j < i1 {
            0
        } else if j < i2 {
            1
        } else {
            2
        };
    }
    let mirror = *scale < 0.0;
    if mirror {
        for v in &mut l {
            *v = 2 - *v;
        }
        *scale = -*scale;
    }
    (l, mirror)
}

/// The IQ1 grid points of the groups of 8 levels `l` (values `xb`, weights `w`): a group on the
/// grid takes its point, one off it the neighbour nearest at `scale` with the values
/// `values(k)` of group k's levels; if any was off, `scale` is refitted to the points chosen.
fn iq1_snap<const G: usize>(
    g: &Grid<8>,
    l: &[i8],
    xb: &[f32],
    w: &[f32],
    scale: &mut f32,
    values: impl Fn(usize) -> &'static [f32; 3],
) -> [u16; G] {
    let mut index = [0u16; G];
    let mut all_on_grid = true;
    for (k, ix) in index.iter_mut().enumerate() {
        *ix = match g.map[code(&l[8 * k..8 * k + 8], 2)] {
            Ok(i) => i,
            Err(range) => {
                all_on_grid = false;
                let r = 8 * k..8 * k + 8;
                iq1_nearest(g, range, &xb[r.clone()], &w[r], *scale, values(k))
            }
        };
    }
    if !all_on_grid {
        let (mut qx, mut q2) = (0f32, 0f32);
        for (k, &ix) in index.iter().enumerate() {
            let xx = values(k);
            let p = &g.points[ix as usize];
            for j in 0..8 {
                let (wj, q) = (w[8 * k + j], xx[((p[j] - 1) / 2) as usize]);
                qx += wj * q * xb[8 * k + j];
                q2 += wj * q * q;
            }
        }
        if qx > 0.0 && q2 > 0.0 {
            *scale = qx / q2;
        }
    }
    index
}

/// One IQ1_M sub-block of 16 values `xb` with weights `w`: its scale, sign pattern and the
/// grid indices of its two groups; `None` for one that quantizes to zeros.
fn iq1m_sub_block(g: &Grid<8>, xb: &[f32], w: &[f32; 16]) -> Option<(f32, usize, [u16; 2])> {
    let max = xb[1..]
        .iter()
        .fold(xb[0].abs(), |m, &v| if m > v.abs() { m } else { v.abs() });
    if max < 1e-7 {
        return None;
    }
    // The three levels split the values sorted in increasing order at two boundaries: every
    // split and sign pattern is tried, with prefix sums per half of the sub-block (each half
    // has its own delta sign).
    let order = ascending(xb);
    let mut px = [[0f32; 17]; 2];
    let mut pw = [[0f32; 17]; 2];
    for (j, &i) in order.iter().enumerate() {
        let h = usize::from(i >= 8);
        px[h][j + 1] = px[h][j] + w[i] * xb[i];
        px[1 - h][j + 1] = px[1 - h][j];
        pw[h][j + 1] = pw[h][j] + w[i];
        pw[1 - h][j + 1] = pw[1 - h][j];
    }
    let txs = [px[0][16], px[1][16]];
    let tws = [pw[0][16], pw[1][16]];
    let (p2, m2) = (X_P[2], X_M[2]);
    let cp1 = X_P[0] * X_P[0] - X_P[1] * X_P[1];
    let cp2 = X_P[1] * X_P[1] - X_P[2] * X_P[2];
    let cm1 = X_M[0] * X_M[0] - X_M[1] * X_M[1];
    let cm2 = X_M[1] * X_M[1] - X_M[2] * X_M[2];
    let mut best_score = -f32::MAX;
    let mut scale = max;
    let mut best: Option<(usize, usize, usize)> = None;
    for i1 in 0..=16 {
        for i2 in i1..=16 {
            let (mut qx_p, mut qx_m, mut q2_p, mut q2_m) =
                ([0f32; 2], [0f32; 2], [0f32; 2], [0f32; 2]);
            for h in 0..2 {
                let sx = px[h][i1] + px[h][i2];
                qx_p[h] = txs[h] * p2 - sx;
                qx_m[h] = txs[h] * m2 - sx;
                q2_p[h] = tws[h] * p2 * p2 + pw[h][i1] * cp1 + pw[h][i2] * cp2;
                q2_m[h] = tws[h] * m2 * m2 + pw[h][i1] * cm1 + pw[h][i2] * cm2;
            }
            let sumqx = [
                qx_p[0] + qx_p[1],
                qx_p[0] + qx_m[1],
                qx_m[0] + qx_p[1],
                qx_m[0] + qx_m[1],
            ];
            let sumq2 = [
                q2_p[0] + q2_p[1],
                q2_p[0] + q2_m[1],
                q2_m[0] + q2_p[1],
                q2_m[0] + q2_m[1],
            ];
            for k in 0..4 {
                if sumq2[k] > 0.0 && sumqx[k] * sumqx[k] > best_score * sumq2[k] {
                    scale = sumqx[k] / sumq2[k];
                    best_score = scale * sumqx[k];
                    best = Some((i1, i2, k));
                }
            }
        }
    }
    let (i1, i2, mut shift) = best?;
    let (l, mirror) = iq1_levels::<16>(&order, i1, i2, &mut scale);
    if mirror {
        shift = 3 - shift;
    }
    let index = iq1_snap::<2>(g, &l, xb, w, &mut scale, |k| iq1m_values(shift, k));
    Some((scale, shift, index))
}

/// Quantizes one IQ1_M block (layout: `iq1`).
pub(super) fn quantize_iq1_m(x: &[f32], b: &mut [u8]) {
    b.fill(0);
    let g = grid_iq1();
    let mut scales = [0f32; 16];
    let mut shifts = [0usize; 16];
    let mut max_scale = 0f32;
    for ib in 0..16 {
        let xb = &x[16 * ib..16 * ib + 16];
        let Some((scale, shift, index)) = iq1m_sub_block(g, xb, &squares::<16>(xb)) else {
            continue;
        };
        b[2 * ib] = index[0] as u8;
        b[2 * ib + 1] = index[1] as u8;
        b[32 + ib] = ((index[0] >> 8) | ((index[1] >> 8) << 4)) as u8;
        scales[ib] = scale;
        shifts[ib] = shift;
        max_scale = max_scale.max(scale);
    }
    if max_scale == 0.0 {
        return;
    }
    // The 3-bit sub-block scales, then the block scale that fits the values best with them.
    const MASKS: [u8; 4] = [0x00, 0x80, 0x08, 0x88];
    let mut sc = [0u16; 4];
    let d = max_scale / 15.0;
    let id = 1.0 / d;
    let (mut qx, mut q2) = (0f32, 0f32);
    for ib in 0..16 {
        let l = nearest_int(0.5 * (id * scales[ib] - 1.0)).clamp(0, 7);
        sc[ib / 4] |= (l as u16) << (3 * (ib % 4));
        b[32 + ib] |= MASKS[shifts[ib]];
        let xb = &x[16 * ib..16 * ib + 16];
        let w = squares::<16>(xb);
        for k in 0..2 {
            let xx = iq1m_values(shifts[ib], k);
            let ix =
                usize::from(b[2 * ib + k]) | ((usize::from(b[32 + ib]) << (8 - 4 * k)) & 0x700);
            let p = &g.points[ix];
            for j in 0..8 {
                let q = xx[((p[j] - 1) / 2) as usize] * (2 * l + 1) as f32;
                qx += w[8 * k + j] * q * xb[8 * k + j];
                q2 += w[8 * k + j] * q * q;
            }
        }
    }
    let d = if q2 > 0.0 { qx / q2 } else { d };
    let bits = half::f16::from_f32(d * 1.1125).to_bits();
    sc[0] |= (bits & 0x000f) << 12;
    sc[1] |= (bits & 0x00f0) << 8;
    sc[2] |= (bits & 0x0f00) << 4;
    sc[3] |= bits & 0xf000;
    for (k, s) in sc.iter().enumerate() {
        b[48 + 2 * k..50 + 2 * k].copy_from_slice(&s.to_le_bytes());
    }
}

/// The IQ2_XS grid (512 points of 8, neighbours of two distances).
fn grid_iq2_xs() -> &'static Grid<8> {
    static G: OnceLock<Grid<8>> = OnceLock::new();
    G.get_or_init(|| {
        let t: Vec<[u8; 8]> = IQ2XS_GRID.iter().map(|g| g.to_le_bytes()).collect();
        Grid::new(&t, 2, 2, 2)
    })
}

/// Quantizes one IQ2_XS block (layout: `iq2`) with importance weights `qw` (one per value, as
/// ggml's imatrix): each value's weight is `qw sqrt(mean(x^2) + x^2)`.
pub(super) fn quantize_iq2_xs(x: &[f32], qw: &[f32], b: &mut [u8]) {
    const RULES: Rules = Rules {
        lmax: 2,
        steps: 9,
        step: 0.1,
        eps: Some(1e-15),
        parity: true,
        refine_off_grid: true,
    };
    b.fill(0);
    let g = grid_iq2_xs();
    let mut sumx2 = 0f32;
    for &v in x {
        sumx2 += v * v;
    }
    let sigma2 = sumx2 / 256.0;
    let mut scales = [0f32; 16];
    let mut max_scale = 0f32;
    for ib in 0..16 {
        let xb = &x[16 * ib..16 * ib + 16];
        let q = &qw[16 * ib..16 * ib + 16];
        let weight: [f32; 16] = std::array::from_fn(|i| q[i] * (sigma2 + xb[i] * xb[i]).sqrt());
        let Some(s) = sub_block(g, &RULES, xb, &weight) else {
            continue;
        };
        for k in 0..2 {
            let v = s.index[k] | (u16::from(s.signs[k]) << 9);
            let at = 2 + 2 * (2 * ib + k);
            b[at..at + 2].copy_from_slice(&v.to_le_bytes());
        }
        scales[ib] = s.scale;
        max_scale = max_scale.max(s.scale);
    }
    if max_scale == 0.0 {
        b.fill(0);
        return;
    }
    let d = max_scale / 31.0;
    put_f16(b, 0, d);
    let id = 1.0 / d;
    for ib in 0..16 {
        b[66 + ib / 2] |= scale_code(id, scales[ib]) << (4 * (ib % 2));
    }
}

/// ggml's `make_qp_quants` for 32 values and levels `0..=nmax`: the scale of the best fit of
/// `x` by `scale l` under weights `w` (a scale search, then up to five rounds of moving single
/// levels). As in ggml, the levels are kept as bytes, so a negative value's level wraps (to
/// 255 for -1) where it is stored and read back.
fn make_qp_quants(nmax: i32, x: &[f32; 32], w: &[f32; 32]) -> f32 {
    let max = x.iter().fold(0f32, |m, &v| if m > v { m } else { v });
    if max < 1e-15 {
        return 0.0;
    }
    let nm = nmax as f32;
    let mut iscale = nm / max;
    let mut l = [0u8; 32];
    for i in 0..32 {
        l[i] = nearest_int(iscale * x[i]) as u8;
    }
    let scale = 1.0 / iscale;
    let mut best_mse = 0f32;
    for i in 0..32 {
        let diff = x[i] - scale * f32::from(l[i]);
        best_mse += w[i] * diff * diff;
    }
    for is in -4..=4 {
        if is == 0 {
            continue;
        }
        let iscale_is = (0.1 * is as f32 + nm) / max;
        let scale_is = 1.0 / iscale_is;
        let mut mse = 0f32;
        for i in 0..32 {
            let li = nearest_int(iscale_is * x[i]).min(nmax);
            let diff = x[i] - scale_is * li as f32;
            mse += w[i] * diff * diff;
        }
        if mse < best_mse {
            best_mse = mse;
            iscale = iscale_is;
        }
    }
    let (mut sumlx, mut suml2) = (0f32, 0f32);
    for i in 0..32 {
        let li = nearest_int(iscale * x[i]).min(nmax);
        l[i] = li as u8;
        sumlx += w[i] * x[i] * li as f32;
        suml2 += w[i] * li as f32 * li as f32;
    }
    for _ in 0..5 {
        let mut changed = false;
        for i in 0..32 {
            let li = f32::from(l[i]);
            let mut slx = sumlx - w[i] * x[i] * li;
            let mut sl2 = suml2 - w[i] * li * li;
            if slx > 0.0 && sl2 > 0.0 {
                let new_l = nearest_int(x[i] * sl2 / slx).min(nmax);
                if new_l != i32::from(l[i]) {
                    slx += w[i] * x[i] * new_l as f32;
                    sl2 += w[i] * new_l as f32 * new_l as f32;
                    if slx * slx * suml2 > sumlx * sumlx * sl2 {
                        l[i] = new_l as u8;
                        sumlx = slx;
                        suml2 = sl2;
                        changed = true;
                    }
                }
            }
        }
        if !changed {
            break;
        }
    }
    if suml2 > 0.0 {
        sumlx / suml2
    } else {
        0.0
    }
}

/// The IQ2_XXS grid (256 points of 8, neighbours of two distances).
fn grid_iq2_xxs() -> &'static Grid<8> {
    static G: OnceLock<Grid<8>> = OnceLock::new();
    G.get_or_init(|| {
        let t: Vec<[u8; 8]> = IQ2XXS_GRID.iter().map(|g| g.to_le_bytes()).collect();
        Grid::new(&t, 2, 2, 2)
    })
}

/// Quantizes one IQ2_XXS block (layout: `iq2`) with importance weights `qw` (one per value):
/// each value's weight is `qw sqrt(mean(x^2) + x^2)`. A sub-block's trial scales start from
/// the best fit of its magnitudes by five levels (`make_qp_quants`), and the refinement
/// redoes every group.
pub(super) fn quantize_iq2_xxs(x: &[f32], qw: &[f32], b: &mut [u8]) {
    const LMAX: i32 = 2;
    b.fill(0);
    let g = grid_iq2_xxs();
    let mut sumx2 = 0f32;
    for &v in x {
        sumx2 += v * v;
    }
    let sigma2 = sumx2 / 256.0;
    let mut scales = [0f32; 8];
    let mut max_scale = 0f32;
    for ib in 0..8 {
        let xb = &x[32 * ib..32 * ib + 32];
        let q = &qw[32 * ib..32 * ib + 32];
        let weight: [f32; 32] = std::array::from_fn(|i| q[i] * (sigma2 + xb[i] * xb[i]).sqrt());
        let waux: [f32; 32] = std::array::from_fn(|i| weight[i].sqrt());
        let mut xval = [0f32; 32];
        let mut signs = [0u8; 4];
        for k in 0..4 {
            let (mut s, mut flips) = (0u8, 0);
            for i in 0..8 {
                let v = xb[8 * k + i];
                if v >= 0.0 {
                    xval[8 * k + i] = v;
                } else {
                    xval[8 * k + i] = -v;
                    s |= 1 << i;
                    flips += 1;
                }
            }
            if flips % 2 == 1 {
                let mut imin = 0;
                let mut min = weight[8 * k] * xb[8 * k] * xb[8 * k];
                for i in 1..8 {
                    let a = weight[8 * k + i] * xb[8 * k + i] * xb[8 * k + i];
                    if a < min {
                        min = a;
                        imin = i;
                    }
                }
                xval[8 * k + imin] = -xval[8 * k + imin];
                s ^= 1 << imin;
            }
            signs[k] = s & 127;
        }
        let max = xval[1..]
            .iter()
            .fold(xval[0], |m, &v| if m > v { m } else { v });
        if max < 1e-15 {
            continue;
        }
        // ggml's kMaxQ is one more than the largest level: the fit allows one more level and
        // its largest value counts as that many steps.
        let mut scale = make_qp_quants(LMAX + 2, &xval, &weight);
        let eff_max = scale * (LMAX + 1) as f32;
        if eff_max <= 0.0 {
            continue;
        }
        let mut best = 0f32;
        let mut l = [0i8; 32];
        let mut laux = [0i8; 32];
        let round = |x: &[f32], id: f32, l: &mut [i8]| {
            for (l, &x) in l.iter_mut().zip(x) {
                *l = nearest_int(0.5 * (id * x - 1.0)).clamp(0, LMAX) as i8;
            }
        };
        for is in -6..=6 {
            let id = ((2 * LMAX + 1) as f32 + is as f32 * 0.1) / eff_max;
            let this_scale = 1.0 / id;
            for k in 0..4 {
                let at = 8 * k..8 * k + 8;
                round(&xval[at.clone()], id, &mut laux[at.clone()]);
                g.snap(
                    &mut laux[at.clone()],
                    &xval[at.clone()],
                    &waux[at],
                    this_scale,
                );
            }
            let (qx, q2) = fit(&weight, &xval, &laux);
            if q2 > 0.0 && qx * qx > best * q2 {
                scale = qx / q2;
                best = scale * qx;
                l = laux;
            }
        }
        if scale > 0.0 {
            let id = 1.0 / scale;
            for k in 0..4 {
                let at = 8 * k..8 * k + 8;
                round(&xval[at.clone()], id, &mut l[at.clone()]);
                g.snap(&mut l[at.clone()], &xval[at.clone()], &waux[at], scale);
            }
            let (qx, q2) = fit(&weight, &xval, &l);
            if q2 > 0.0 {
                scale = qx / q2;
            }
        }
        if scale < 0.0 {
            scale = -scale;
            for s in &mut signs {
                *s = !*s & 127;
            }
        }
        let mut aux = 0u32;
        for k in 0..4 {
            b[2 + 8 * ib + k] = g.index(&l[8 * k..8 * k + 8]) as u8;
            aux |= u32::from(signs[k]) << (7 * k);
        }
        b[6 + 8 * ib..10 + 8 * ib].copy_from_slice(&aux.to_le_bytes());
        scales[ib] = scale;
        max_scale = max_scale.max(scale);
    }
    if max_scale == 0.0 {
        b.fill(0);
        return;
    }
    let d = max_scale / 31.0;
    put_f16(b, 0, d);
    let id = 1.0 / d;
    for (ib, &s) in scales.iter().enumerate() {
        b[9 + 8 * ib] |= scale_code(id, s) << 4;
    }
}

/// Quantizes one IQ1_S block (layout: `iq1`) with importance weights `qw` (one per value):
/// each value's weight is `qw sqrt(2 mean(x^2) + x^2)`. For each 32-value sub-block every split
/// of its sorted values into the three levels, with the delta added or taken off, is scored
/// exactly; the best split is snapped to the grid, and the block scale is the largest
/// sub-block scale over 15 (times a fudge factor), each sub-block's a 3-bit odd multiple of it.
pub(super) fn quantize_iq1_s(x: &[f32], qw: &[f32], b: &mut [u8]) {
    b.fill(0);
    let g = grid_iq1();
    let mut sumx2 = 0f32;
    for &v in x {
        sumx2 += v * v;
    }
    let sigma2 = 2.0 * sumx2 / 256.0;
    let mut scales = [0f32; 8];
    let mut minus = [false; 8];
    let mut max_scale = 0f32;
    for ib in 0..8 {
        let xb = &x[32 * ib..32 * ib + 32];
        let q = &qw[32 * ib..32 * ib + 32];
        let w: [f32; 32] = std::array::from_fn(|i| q[i] * (sigma2 + xb[i] * xb[i]).sqrt());
        let max = xb[1..]
            .iter()
            .fold(xb[0].abs(), |m, &v| if m > v.abs() { m } else { v.abs() });
        if max < 1e-12 {
            continue;
        }
        let order = ascending(xb);
        let mut sx = [0f32; 33];
        let mut sw = [0f32; 33];
        for (j, &i) in order.iter().enumerate() {
            sx[j + 1] = sx[j] + w[i] * xb[i];
            sw[j + 1] = sw[j] + w[i];
        }
        let mut best_score = -f32::MAX;
        let mut scale = max;
        let mut best: Option<(usize, usize, bool)> = None;
        for i1 in 0..=32 {
            for i2 in i1..=32 {
                for (xx, is_minus) in [(&X_P, false), (&X_M, true)] {
                    let (a, c, e) = (sx[i1] - sx[0], sx[i2] - sx[i1], sx[32] - sx[i2]);
                    let sumqx = a * xx[0] + c * xx[1] + e * xx[2];
                    let (a, c, e) = (sw[i1] - sw[0], sw[i2] - sw[i1], sw[32] - sw[i2]);
                    let sumq2 = a * xx[0] * xx[0] + c * xx[1] * xx[1] + e * xx[2] * xx[2];
                    if sumq2 > 0.0 && sumqx * sumqx > best_score * sumq2 {
                        scale = sumqx / sumq2;
                        best_score = scale * sumqx;
                        best = Some((i1, i2, is_minus));
                    }
                }
            }
        }
        let Some((i1, i2, mut is_minus)) = best else {
            continue;
        };
        let (l, mirror) = iq1_levels::<32>(&order, i1, i2, &mut scale);
        is_minus ^= mirror;
        let xx = if is_minus { &X_M } else { &X_P };
        let index = iq1_snap::<4>(g, &l, xb, &w, &mut scale, |_| xx);
        let mut h = 0u16;
        for (k, &ix) in index.iter().enumerate() {
            b[2 + 4 * ib + k] = ix as u8;
            h |= (ix >> 8) << (3 * k);
        }
        b[34 + 2 * ib..36 + 2 * ib].copy_from_slice(&h.to_le_bytes());
        scales[ib] = scale;
        minus[ib] = is_minus;
        max_scale = max_scale.max(scale);
    }
    if max_scale == 0.0 {
        return;
    }
    let d = max_scale / 15.0;
    put_f16(b, 0, d * 1.125);
    let id = 1.0 / d;
    for ib in 0..8 {
        let mut l = nearest_int(0.5 * (id * scales[ib] - 1.0)).clamp(0, 7) as u8;
        if minus[ib] {
            l |= 8;
        }
        b[35 + 2 * ib] |= l << 4;
    }
}
