//! The direct tensor-core mat-mat of 2 to 32 columns (`mmt` and `quantize_q8_1_tiles` in
//! kernels/mmvq.cu) traced on the CPU, no GPU needed: its warps' lanes, the stage slots they copy
//! rows into, the tiled columns, the fragments of mma.m16n8k32 and m16n8k16 (s8) as the PTX ISA
//! lays them out (lane 4 g + t: A rows g and g + 8, values 4 t .. 4 t + 3 and 16 + 4 t .. ; B
//! column g, the same values; C rows g and g + 8, columns 2 t and 2 t + 1), the scaling and the
//! sum over the block's warps, each written as the kernel computes it, against the products of
//! the dequantized weights and columns. Random weights and columns, rows and k that are not
//! whole tiles or stages, weights at unaligned addresses.

#[path = "common/mod.rs"]
mod common;

use common::{from_bytes, to_bytes, Rng};
use tessera_core::dtype::DType;

/// The kernel's `MmqA<Q>::load` for one block: (lo, hi, s0, s1) of values 4 t .. 4 t + 3 and
/// 16 + 4 t .. of block `j` (of the 8 of a stage) of the stage row at `row`, and the mode (0:
/// s0 q, 1: s0 q + s1, 2: s0 q for values 0-15, s1 q for 16-31).
type Decode = fn(&[u8], usize, usize) -> (i32, i32, f32, f32);

fn u16_at(b: &[u8], o: usize) -> u32 {
    u32::from(b[o]) | (u32::from(b[o + 1]) << 8)
}

fn u32_at(b: &[u8], o: usize) -> u32 {
    u16_at(b, o) | (u16_at(b, o + 2) << 16)
}

fn f16_at(b: &[u8], o: usize) -> f32 {
    from_bytes(DType::F16, &b[o..o + 2], 1)[0]
}

/// Bytewise a - b (the kernel's __vsub4).
fn vsub4(a: u32, b: u32) -> u32 {
    u32::from_le_bytes(std::array::from_fn(|i| {
        (a.to_le_bytes()[i]).wrapping_sub(b.to_le_bytes()[i])
    }))
}

fn q4_0(row: &[u8], j: usize, t: usize) -> (i32, i32, f32, f32) {
    let b = j * 18;
    let w = u32_at(row, b + 2 + 4 * t);
    let lo = vsub4(w & 0x0F0F_0F0F, 0x0808_0808);
    let hi = vsub4((w >> 4) & 0x0F0F_0F0F, 0x0808_0808);
    (lo as i32, hi as i32, f16_at(row, b), 0.0)
}

fn q8_0(row: &[u8], j: usize, t: usize) -> (i32, i32, f32, f32) {
    let b = j * 34;
    let (lo, hi) = (u32_at(row, b + 2 + 4 * t), u32_at(row, b + 18 + 4 * t));
    (lo as i32, hi as i32, f16_at(row, b), 0.0)
}

/// The 6-bit scale and min pairs of sub-blocks 2 k and 2 k + 1 (k45_scales).
fn k45_scales(k: usize, s: [u32; 3]) -> (u32, u32) {
    let sh = 16 * (k & 1);
    let (a, b, c) = (s[0] >> sh, s[1] >> sh, s[2] >> sh);
    if k >= 2 {
        (
            (c & 0x0F0F) | ((a >> 2) & 0x3030),
            ((c >> 4) & 0x0F0F) | ((b >> 2) & 0x3030),
        )
    } else {
        (a & 0x3F3F, b & 0x3F3F)
    }
}

fn q4_k(row: &[u8], j: usize, t: usize) -> (i32, i32, f32, f32) {
    let (jj, b) = (j % 8, (j / 8) * 144);
    let (c, sh) = (jj / 2, 4 * (jj & 1));
    let s = [u32_at(row, b + 4), u32_at(row, b + 8), u32_at(row, b + 12)];
    let (sc, mn) = k45_scales(c, s);
    let s0 = f16_at(row, b) * ((sc >> (2 * sh)) & 0xFF) as f32;
    let s1 = -f16_at(row, b + 2) * ((mn >> (2 * sh)) & 0xFF) as f32;
    let q = b + 16 + 32 * c + 4 * t;
    let lo = (u32_at(row, q) >> sh) & 0x0F0F_0F0F;
    let hi = (u32_at(row, q + 16) >> sh) & 0x0F0F_0F0F;
    (lo as i32, hi as i32, s0, s1)
}

fn q6_k(row: &[u8], j: usize, t: usize) -> (i32, i32, f32, f32) {
    let (jj, b) = (j % 8, (j / 8) * 210);
    let (n, g) = (jj / 4, jj % 4);
    let d = f16_at(row, b + 208);
    let sc = u16_at(row, b + 192 + 8 * n + 2 * g);
    let s0 = d * f32::from((sc & 0xFF) as u8 as i8);
    let s1 = d * f32::from((sc >> 8) as u8 as i8);
    let ql = b + 64 * n + 32 * (g % 2) + 4 * t;
    let qh = b + 128 + 32 * n + 4 * t;
    let sh = 4 * (g / 2);
    let l0 = (u32_at(row, ql) >> sh) & 0x0F0F_0F0F;
    let l1 = (u32_at(row, ql + 16) >> sh) & 0x0F0F_0F0F;
    let h0 = ((u32_at(row, qh) >> (2 * g)) & 0x0303_0303) << 4;
    let h1 = ((u32_at(row, qh + 16) >> (2 * g)) & 0x0303_0303) << 4;
    let lo = vsub4(l0 | h0, 0x2020_2020);
    let hi = vsub4(l1 | h1, 0x2020_2020);
    (lo as i32, hi as i32, s0, s1)
}

fn bytes4(x: i32) -> [i32; 4] {
    x.to_le_bytes().map(|b| i32::from(b as i8))
}

/// mma.m16n8k32 s8: a[lane] = (a0, a1, a2, a3), b[lane] = (b0, b1); returns c[lane].
fn mma_k32(a: &[[i32; 4]; 32], b: &[[i32; 2]; 32]) -> [[i32; 4]; 32] {
    let mut am = [[0i32; 32]; 16];
    let mut bm = [[0i32; 8]; 32];
    for l in 0..32 {
        let (g, t) = (l / 4, l % 4);
        for i in 0..4 {
            am[g][4 * t + i] = bytes4(a[l][0])[i];
            am[g + 8][4 * t + i] = bytes4(a[l][1])[i];
            am[g][16 + 4 * t + i] = bytes4(a[l][2])[i];
            am[g + 8][16 + 4 * t + i] = bytes4(a[l][3])[i];
            bm[4 * t + i][g] = bytes4(b[l][0])[i];
            bm[16 + 4 * t + i][g] = bytes4(b[l][1])[i];
        }
    }
    let c = |r: usize, col: usize| (0..32).map(|k| am[r][k] * bm[k][col]).sum::<i32>();
    std::array::from_fn(|l| {
        let (g, t) = (l / 4, l % 4);
        [
            c(g, 2 * t),
            c(g, 2 * t + 1),
            c(g + 8, 2 * t),
            c(g + 8, 2 * t + 1),
        ]
    })
}

/// mma.m16n8k16 s8: a[lane] = (a0, a1), b[lane] = b0.
fn mma_k16(a: &[[i32; 2]; 32], b: &[i32; 32]) -> [[i32; 4]; 32] {
    let aa = std::array::from_fn(|l| [a[l][0], a[l][1], 0, 0]);
    let bb = std::array::from_fn(|l| [b[l], 0]);
    mma_k32(&aa, &bb)
}

/// quantize_q8_1_tiles: the tiled (qs, ds) of columns x ([n][k]).
fn quantize_tiles(x: &[Vec<f32>], k: usize) -> (Vec<i8>, Vec<[f32; 2]>) {
    let nblk = k / 32;
    let cols = x.len().div_ceil(8) * 8;
    let mut qs = vec![0i8; nblk * cols * 32];
    let mut ds = vec![[0f32; 2]; nblk * cols];
    for c in 0..cols {
        for j in 0..nblk {
            let v: Vec<f32> = (0..32)
                .map(|l| if c < x.len() { x[c][32 * j + l] } else { 0.0 })
                .collect();
            let d = v.iter().fold(0f32, |m, a| m.max(a.abs())) / 127.0;
            let tb = (c / 8) * nblk + j;
            let g = c % 8;
            let mut sum = 0f32;
            for (l, &xv) in v.iter().enumerate() {
                let q = if d == 0.0 {
                    0
                } else {
                    (xv / d).round_ties_even() as i32
                };
                sum += q as f32;
                qs[tb * 256 + 8 * (4 * g + l % 16 / 4) + 4 * (l / 16) + l % 4] = q as i8;
            }
            ds[tb * 8 + g] = [d, d * sum];
        }
    }
    (qs, ds)
}

/// Bytes of a row's stage slot (MmtSlot).
fn slot(sb: usize) -> usize {
    (((sb + 30) / 16) | 1) * 16
}

/// The kernel's output for weights `w` (m rows of `row_bytes`, starting `base` bytes into
/// `mem`) by the tiled columns, with `mt` 16-row tiles a warp and `warps` warps a block.
#[allow(clippy::too_many_arguments)]
fn mmt(
    mem: &[u8],
    base: usize,
    row_bytes: usize,
    m: usize,
    k: usize,
    n: usize,
    (qs, ds): (&[i8], &[[f32; 2]]),
    (decode, mode, sb): (Decode, u32, usize),
    mt: usize,
    warps: usize,
) -> Vec<Vec<f32>> {
    let nblk = k / 32;
    let nt = n.div_ceil(8);
    let r = 16 * mt;
    let (sl, ch) = (slot(sb), (sb + 30) / 16);
    let ns = nblk.div_ceil(8);
    let small_i2f = |x: i32| {
        assert!(
            x.abs() < 1 << 22,
            "an integer sum past the exact conversion"
        );
        f32::from_bits((0x4B40_0000i32 + x) as u32) - 12_582_912.0
    };
    let mut out = vec![vec![0f32; m]; n];
    for bx in 0..m.div_ceil(r) {
        let r0 = bx * r;
        let src_row = |rr: usize, s: usize| base + (r0 + rr).min(m - 1) * row_bytes + s * sb;
        // red[w][col][row]
        let mut red = vec![vec![vec![0f32; r]; 8 * nt]; warps];
        for (warp, red_w) in red.iter_mut().enumerate() {
            let mut acc = vec![[[[0f32; 4]; 32]; 4]; mt];
            let mut s = warp;
            while s < ns {
                // The stage's copy into the slot: the aligned 16-byte chunks holding each row's
                // bytes of the stage.
                let bytes = if nblk - 8 * s >= 8 {
                    sb
                } else {
                    (nblk - 8 * s) * (sb / 8)
                };
                let mut st = vec![0xA5u8; r * sl];
                for x in 0..r * ch {
                    let (rr, c) = (x / ch, x % ch);
                    let src = src_row(rr, s);
                    let off = src & 15;
                    if 16 * c < off + bytes {
                        let from = src - off + 16 * c;
                        st[rr * sl + 16 * c..rr * sl + 16 * c + 16]
                            .copy_from_slice(&mem[from..from + 16]);
                    }
                }
                let nbk = (nblk - 8 * s).min(8);
                for jj in 0..nbk {
                    let j = 8 * s + jj;
                    for (i2, acc_i) in acc.iter_mut().enumerate() {
                        // Lane l's A registers and scales from the slot.
                        let mut a = [[0i32; 4]; 32];
                        let mut w = [[[0f32; 2]; 2]; 32];
                        for (l, (al, wl)) in a.iter_mut().zip(w.iter_mut()).enumerate() {
                            let (g, t) = (l / 4, l % 4);
                            for h in 0..2 {
                                let rr = 16 * i2 + 8 * h + g;
                                let start = rr * sl + (src_row(rr, s) & 15);
                                let (lo, hi, s0, s1) = decode(&st[start..rr * sl + sl], jj, t);
                                al[h] = lo;
                                al[2 + h] = hi;
                                wl[h] = [s0, s1];
                            }
                        }
                        for (c, acc_c) in acc_i.iter_mut().enumerate().take(nt) {
                            let tb = c * nblk + j;
                            let b: [[i32; 2]; 32] = std::array::from_fn(|l| {
                                let q = &qs[(tb * 32 + l) * 8..(tb * 32 + l) * 8 + 8];
                                let word = |o: usize| {
                                    i32::from_le_bytes(std::array::from_fn(|i| q[o + i] as u8))
                                };
                                [word(0), word(4)]
                            });
                            let (cs, ch2) = if mode == 2 {
                                let lo = mma_k16(
                                    &std::array::from_fn(|l| [a[l][0], a[l][1]]),
                                    &b.map(|x| x[0]),
                                );
                                let hi = mma_k16(
                                    &std::array::from_fn(|l| [a[l][2], a[l][3]]),
                                    &b.map(|x| x[1]),
                                );
                                (lo, hi)
                            } else {
                                (mma_k32(&a, &b), [[0; 4]; 32])
                            };
                            for l in 0..32 {
                                let t = l % 4;
                                let y = [ds[tb * 8 + 2 * t], ds[tb * 8 + 2 * t + 1]];
                                for e in 0..4 {
                                    let (dx, sx) = (y[e & 1][0], y[e & 1][1]);
                                    let [w0, w1] = w[l][e >> 1];
                                    if mode == 2 {
                                        acc_c[l][e] += dx
                                            * (w0 * small_i2f(cs[l][e])
                                                + w1 * small_i2f(ch2[l][e]));
                                    } else {
                                        // scaled_i2f: w0 (M + x) - M w0 in one rounding.
                                        assert!(cs[l][e].abs() < 1 << 22);
                                        let bits =
                                            f32::from_bits((0x4B40_0000i32 + cs[l][e]) as u32);
                                        let wm = -12_582_912.0f32 * w0;
                                        assert_eq!(f64::from(wm), -12_582_912.0 * f64::from(w0));
                                        acc_c[l][e] += dx * w0.mul_add(bits, wm);
                                        if mode == 1 {
                                            acc_c[l][e] += w1 * sx;
                                        }
                                    }
                                }
                            }
                        }
                    }
                }
                s += warps;
            }
            for (i2, acc_i) in acc.iter().enumerate() {
                for (c, acc_c) in acc_i.iter().enumerate().take(nt) {
                    for (l, al) in acc_c.iter().enumerate() {
                        let (g, t) = (l / 4, l % 4);
                        for (e, &v) in al.iter().enumerate() {
                            red_w[8 * c + 2 * t + (e & 1)][16 * i2 + 8 * (e >> 1) + g] = v;
                        }
                    }
                }
            }
        }
        for (col, out_c) in out.iter_mut().enumerate() {
            for rr in 0..r {
                if r0 + rr < m {
                    out_c[r0 + rr] = (0..warps).map(|w| red[w][col][rr]).sum();
                }
            }
        }
    }
    out
}

/// One type: m rows (not a multiple of 32) of k values at `base` bytes into the buffer, by
/// 2, 5, 9 and 17 columns, in both geometries and with 1 to 3 warps.
fn trace(dt: DType, decode: Decode, mode: u32, k: usize, base: usize) {
    let (m, nmax) = (37usize, 17usize);
    let mut rng = Rng::new(k as u64 + base as u64);
    let row_bytes = dt.row_size(k).unwrap();
    let sb = dt.type_size() * 256 / dt.block_size();
    let mut mem: Vec<u8> = (0..base).map(|_| rng.uniform(0.0, 256.0) as u8).collect();
    let mut w = Vec::new();
    for _ in 0..m {
        let v = rng.vec(k, -1.0, 1.0);
        let b = to_bytes(dt, &v);
        w.push(from_bytes(dt, &b, k));
        mem.extend_from_slice(&b);
    }
    // The copies read the aligned 16 bytes holding a row's last byte.
    mem.resize(mem.len().div_ceil(16) * 16 + 16, 0x5A);
    let x: Vec<Vec<f32>> = (0..nmax).map(|_| rng.vec(k, -2.0, 2.0)).collect();
    for n in [2usize, 5, 9, 17] {
        let (qs, ds) = quantize_tiles(&x[..n], k);
        // The columns as the kernel's integers and scales give them, column-major by block.
        let xq: Vec<Vec<f32>> = (0..n)
            .map(|c| {
                (0..k)
                    .map(|i| {
                        let (j, l) = (i / 32, i % 32);
                        let tb = (c / 8) * (k / 32) + j;
                        let q =
                            qs[tb * 256 + 8 * (4 * (c % 8) + l % 16 / 4) + 4 * (l / 16) + l % 4];
                        ds[tb * 8 + c % 8][0] * f32::from(q)
                    })
                    .collect()
            })
            .collect();
        for (mt, warps) in [(1usize, 1usize), (1, 3), (2, 2)] {
            let got = mmt(
                &mem,
                base,
                row_bytes,
                m,
                k,
                n,
                (&qs, &ds),
                (decode, mode, sb),
                mt,
                warps,
            );
            for c in 0..n {
                for r in 0..m {
                    let want: f64 = (0..k)
                        .map(|i| f64::from(w[r][i]) * f64::from(xq[c][i]))
                        .sum();
                    let scale: f64 = (0..k)
                        .map(|i| (f64::from(w[r][i]) * f64::from(xq[c][i])).abs())
                        .sum::<f64>()
                        + 1e-6;
                    let err = (f64::from(got[c][r]) - want).abs() / scale;
                    assert!(
                        err < 1e-4,
                        "{} k={k} n={n} mt={mt} warps={warps} row {r} column {c}: {} against {want}",
                        dt.name(),
                        got[c][r]
                    );
                }
            }
        }
        // Each value of the tiled columns is its column's value, to half a step of its block.
        for (c, xc) in x[..n].iter().enumerate() {
            for i in 0..k {
                let d = ds[((c / 8) * (k / 32) + i / 32) * 8 + c % 8][0];
                assert!(
                    (xc[i] - xq[c][i]).abs() <= 0.5001 * d,
                    "column {c} value {i}"
                );
            }
        }
    }
}

#[test]
fn q4_0_fragments() {
    // 13 blocks: one whole stage and a partial one; rows 2 bytes off a 4-byte boundary.
    trace(DType::Q4_0, q4_0, 0, 13 * 32, 2);
    trace(DType::Q4_0, q4_0, 0, 24 * 32, 6);
}

#[test]
fn q8_0_fragments() {
    trace(DType::Q8_0, q8_0, 0, 11 * 32, 10);
}

#[test]
fn q4_k_fragments() {
    trace(DType::Q4_K, q4_k, 1, 3 * 256, 16);
}

#[test]
fn q6_k_fragments() {
    trace(DType::Q6_K, q6_k, 2, 2 * 256, 2);
}
