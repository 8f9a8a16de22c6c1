//! AVX2 + FMA + F16C kernels for x86-64.
//!
//! Safety rule of this file: every `unsafe fn` here requires the CPU to have AVX2, FMA and F16C.
//! They are reached only through the [`Kernels`] table that [`kernels`] returns after
//! `is_x86_feature_detected!` has confirmed all three; the safe wrappers in that table are
//! private to this file. Memory is read only through pointers into blocks obtained with
//! `chunks_exact`, at offsets that the block sizes guarantee in bounds.

use std::arch::x86_64::*;

use tessera_core::quant::{e8m0_half, scale_min_k4, vec_dot_type, IQ4_VALUES, MXFP4_VALUES};
use tessera_core::DType;

use super::Kernels;

/// The AVX2 kernel table, when this CPU has AVX2, FMA and F16C.
pub(super) fn kernels() -> Option<&'static Kernels> {
    static AVX2: Kernels = Kernels {
        dot_q4_0,
        dot_q4_1,
        dot_q5_0,
        dot_q8_0,
        dot_q4_k,
        dot_q6_k,
        dot_iq4_nl,
        dot_iq4_xs,
        dot_mxfp4,
        quantize_q8_0,
        quantize_q8_1,
    };
    let ok = is_x86_feature_detected!("avx2")
        && is_x86_feature_detected!("fma")
        && is_x86_feature_detected!("f16c");
    ok.then_some(&AVX2)
}

/// Dot products of `R` weight rows with `C` activation rows (`C` at most 4) over their first
/// `nb` blocks, for Q4_0, Q4_1 and Q8_0 weights: `out[r][c]` is the dot product of `xs[r]` with
/// `ys[c]`. Each unpacked weight block meets `C` activation blocks, and each activation block
/// `R` weight blocks, while they are in registers. The AVX-512 VNNI kernels are used when
/// `allow_vnni` is true and the CPU has them. `None` for other types, for `C` above 4, when a
/// slice holds fewer than `nb` blocks, or when this CPU lacks AVX2, FMA or F16C.
pub(super) fn dot_tile<const R: usize, const C: usize>(
    dtype: DType,
    nb: usize,
    xs: &[&[u8]; R],
    ys: &[&[u8]; C],
    allow_vnni: bool,
) -> Option<[[f32; C]; R]> {
    if C > 4 || kernels().is_none() {
        return None;
    }
    let (xt, yt) = (dtype.type_size(), vec_dot_type(dtype).type_size());
    if xs.iter().any(|x| x.len() < nb * xt) || ys.iter().any(|y| y.len() < nb * yt) {
        return None;
    }
    let vnni = allow_vnni
        && is_x86_feature_detected!("avx512f")
        && is_x86_feature_detected!("avx512vl")
        && is_x86_feature_detected!("avx512vnni");
    // SAFETY: `kernels` confirmed AVX2, FMA and F16C, and the `_vnni` kernels run only when
    // AVX-512 F, VL and VNNI were detected too; every slice holds `nb` blocks of its type
    // (checked just above), which is all the kernels read; C <= 4 as `tile_q4_1` needs.
    unsafe {
        match dtype {
            DType::Q4_0 if vnni => Some(tile_q_0_vnni::<true, R, C>(nb, xs, ys)),
            DType::Q8_0 if vnni => Some(tile_q_0_vnni::<false, R, C>(nb, xs, ys)),
            DType::Q4_1 if vnni => Some(tile_q4_1_vnni::<R, C>(nb, xs, ys)),
            DType::Q4_0 => Some(tile_q_0::<true, R, C>(nb, xs, ys)),
            DType::Q8_0 => Some(tile_q_0::<false, R, C>(nb, xs, ys)),
            DType::Q4_1 => Some(tile_q4_1::<R, C>(nb, xs, ys)),
            _ => None,
        }
    }
}

/// Declares a safe wrapper `$name` around the `unsafe` AVX2 kernel `$imp`.
macro_rules! safe_wrapper {
    ($(#[$doc:meta])* $name:ident => [$($imp:tt)*]($($arg:ident: $ty:ty),*) -> $ret:ty) => {
        $(#[$doc])*
        fn $name($($arg: $ty),*) -> $ret {
            // SAFETY: this wrapper is only stored in the table `kernels` returns after it has
            // detected AVX2, FMA and F16C.
            unsafe { $($imp)*($($arg),*) }
        }
    };
}

safe_wrapper!(
    /// Q4_0 x Q8_0 row dot.
    dot_q4_0 => [dot_q4_0_avx2](x: &[u8], y: &[u8]) -> f32
);
safe_wrapper!(
    /// Q4_1 x Q8_1 row dot.
    dot_q4_1 => [dot_q4_1_avx2](x: &[u8], y: &[u8]) -> f32
);
safe_wrapper!(
    /// Q5_0 x Q8_0 row dot.
    dot_q5_0 => [dot_q5_0_avx2](x: &[u8], y: &[u8]) -> f32
);
safe_wrapper!(
    /// Q8_0 x Q8_0 row dot.
    dot_q8_0 => [dot_q8_0_avx2](x: &[u8], y: &[u8]) -> f32
);
safe_wrapper!(
    /// Q4_K x Q8_K row dot.
    dot_q4_k => [dot_q4_k_avx2](x: &[u8], y: &[u8]) -> f32
);
safe_wrapper!(
    /// Q6_K x Q8_K row dot.
    dot_q6_k => [dot_q6_k_avx2](x: &[u8], y: &[u8]) -> f32
);
safe_wrapper!(
    /// IQ4_NL x Q8_0 row dot.
    dot_iq4_nl => [dot_iq4_nl_avx2](x: &[u8], y: &[u8]) -> f32
);
safe_wrapper!(
    /// IQ4_XS x Q8_K row dot.
    dot_iq4_xs => [dot_iq4_xs_avx2](x: &[u8], y: &[u8]) -> f32
);
safe_wrapper!(
    /// MXFP4 x Q8_0 row dot.
    dot_mxfp4 => [dot_mxfp4_avx2](x: &[u8], y: &[u8]) -> f32
);
safe_wrapper!(
    /// Q8_0 row quantizer.
    quantize_q8_0 => [quantize_q8_avx2::<false>](x: &[f32], y: &mut [u8]) -> ()
);
safe_wrapper!(
    /// Q8_1 row quantizer.
    quantize_q8_1 => [quantize_q8_avx2::<true>](x: &[f32], y: &mut [u8]) -> ()
);

/// The f16 at byte `at` of `b`, as f32.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn h2f(b: &[u8], at: usize) -> f32 {
    let bits = u16::from_le_bytes([b[at], b[at + 1]]);
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(i32::from(bits))))
}

/// The two f16 at byte `at` of `b` (lanes 0 and 1; lanes 2 and 3 are 0), as f32.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn h2f_pair(b: &[u8], at: usize) -> __m128 {
    let bits = u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]]);
    _mm_cvtph_ps(_mm_cvtsi32_si128(bits as i32))
}

/// Stores `v` as an f16 (rounded to nearest even) at byte `at` of `b`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn put_f16(b: &mut [u8], at: usize, v: f32) {
    let h = _mm_cvtsi128_si32(_mm_cvtps_ph(_mm_set_ss(v), _MM_FROUND_TO_NEAREST_INT)) as u16;
    b[at..at + 2].copy_from_slice(&h.to_le_bytes());
}

/// The sum of the 8 lanes of `v`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn hsum(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
    _mm_cvtss_f32(s)
}

/// The 32 nibbles of the 16 bytes at `p` as bytes: low nibbles in lanes 0..16, high in 16..32.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn nibbles(p: *const u8) -> __m256i {
    let q = _mm_loadu_si128(p as *const __m128i);
    let m = _mm_set1_epi8(15);
    _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(q, 4), m), _mm_and_si128(q, m))
}

/// [`nibbles`] without a cross-lane insert: the 16 bytes are loaded into both halves and the
/// upper half shifted by 4, which keeps the shuffle port free for the kernels' broadcasts.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn nibbles_wide(p: *const u8) -> __m256i {
    let q = _mm256_broadcastsi128_si256(_mm_loadu_si128(p as *const __m128i));
    let q = _mm256_srlv_epi64(q, _mm256_setr_epi64x(0, 0, 4, 4));
    _mm256_and_si256(q, _mm256_set1_epi8(15))
}

/// The 8 i32 pair sums of unsigned bytes `u` times signed bytes `s` (`u * s` must fit i16 per
/// pair, which holds for |u| <= 128 and |s| <= 127).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_u8_i8(u: __m256i, s: __m256i) -> __m256 {
    _mm256_cvtepi32_ps(_mm256_madd_epi16(
        _mm256_maddubs_epi16(u, s),
        _mm256_set1_epi16(1),
    ))
}

/// The products of two vectors of signed bytes, summed in groups of 4 to f32.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_i8_i8(a: __m256i, b: __m256i) -> __m256 {
    dot_u8_i8(_mm256_sign_epi8(a, a), _mm256_sign_epi8(b, a))
}

/// Q4_0 x Q8_0.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_q4_0_avx2(x: &[u8], y: &[u8]) -> f32 {
    let mut acc = _mm256_setzero_ps();
    for (bx, by) in x.chunks_exact(18).zip(y.chunks_exact(34)) {
        let qx = _mm256_sub_epi8(nibbles(bx.as_ptr().add(2)), _mm256_set1_epi8(8));
        let qy = _mm256_loadu_si256(by.as_ptr().add(2) as *const __m256i);
        let d = _mm256_set1_ps(h2f(bx, 0) * h2f(by, 0));
        acc = _mm256_fmadd_ps(d, dot_i8_i8(qx, qy), acc);
    }
    hsum(acc)
}

/// The 32 bits of `bits` as 32 bytes, byte i 0x10 where bit i is set and 0 elsewhere (Q5_0's
/// fifth bits, in place).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn fifth_bits(bits: u32) -> __m256i {
    // Byte i of the result looks at byte i / 8 of `bits` (the shuffle works per 128-bit half,
    // and every 32-bit lane holds `bits`), then at bit i % 8 of it.
    let bytes = _mm256_shuffle_epi8(
        _mm256_set1_epi32(bits as i32),
        _mm256_setr_epi64x(
            0,
            0x0101_0101_0101_0101,
            0x0202_0202_0202_0202,
            0x0303_0303_0303_0303,
        ),
    );
    let bit = _mm256_set1_epi64x(0x8040_2010_0804_0201_u64 as i64);
    let set = _mm256_cmpeq_epi8(_mm256_and_si256(bytes, bit), bit);
    _mm256_and_si256(set, _mm256_set1_epi8(0x10))
}

/// Q5_0 x Q8_0: each weight is its nibble plus the fifth bit from `qh`, minus 16.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_q5_0_avx2(x: &[u8], y: &[u8]) -> f32 {
    let mut acc = _mm256_setzero_ps();
    for (bx, by) in x.chunks_exact(22).zip(y.chunks_exact(34)) {
        let qh = (bx.as_ptr().add(2) as *const u32).read_unaligned();
        let q = _mm256_or_si256(nibbles(bx.as_ptr().add(6)), fifth_bits(qh));
        let qx = _mm256_sub_epi8(q, _mm256_set1_epi8(16));
        let qy = _mm256_loadu_si256(by.as_ptr().add(2) as *const __m256i);
        let d = _mm256_set1_ps(h2f(bx, 0) * h2f(by, 0));
        acc = _mm256_fmadd_ps(d, dot_i8_i8(qx, qy), acc);
    }
    hsum(acc)
}

/// The two f16 at `p` (lanes 0 and 1; lanes 2 and 3 are 0), as f32; `p` must point at 4
/// readable bytes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn h2f_pair_at(p: *const u8) -> __m128 {
    _mm_cvtph_ps(_mm_cvtsi32_si128((p as *const i32).read_unaligned()))
}

/// The f16 at `p` as f32; `p` must point at 2 readable bytes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn h2f_at(p: *const u8) -> f32 {
    let bits = (p as *const u16).read_unaligned();
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(i32::from(bits))))
}

/// Bytes ahead of each weight block that the one-column tile kernels prefetch, where a tile's
/// rows are short (`prefetch_ahead`). The R interleaved rows of such a tile are R streams of a
/// few cache lines each, too short for the hardware prefetchers to pick up: without it a
/// decode step's mat-vecs over short rows wait on memory at every block.
const PREFETCH_AHEAD: usize = 8192;

/// Whether the one-column (`C` = 1) tile kernels prefetch: where the `R` rows of `nb` blocks of
/// `xt` bytes end before [`PREFETCH_AHEAD`], so that each prefetch lands past the tile's rows
/// (in the rows the kernel reads next), not in rows it is reading (long rows, which the
/// hardware prefetchers already follow).
fn prefetch_ahead(rows: usize, cols: usize, nb: usize, xt: usize) -> bool {
    cols == 1 && rows * nb * xt <= PREFETCH_AHEAD
}

/// Defines the tile kernels `$q_0` (Q4_0 or Q8_0 by Q8_0) and `$q4_1` (Q4_1 by Q8_1) for the
/// target features `$features`, with `$dot` as the block's integer dot product: one body, built
/// once for AVX2 and once for AVX-512 VNNI (which also has 32 vector registers, so the tile's
/// accumulators do not spill).
macro_rules! tile_kernels {
    ($features:literal, $q_0:ident, $q4_1:ident, $dot:ident) => {
        /// An R x C tile of Q4_0 x Q8_0 (`Q4` true) or Q8_0 x Q8_0 (`Q4` false) dot products over `nb`
        /// blocks. Safety: every `xs[r]` and `ys[c]` holds at least `nb` blocks.
        #[target_feature(enable = $features)]
        unsafe fn $q_0<const Q4: bool, const R: usize, const C: usize>(
            nb: usize,
            xs: &[&[u8]; R],
            ys: &[&[u8]; C],
        ) -> [[f32; C]; R] {
            let xt = if Q4 { 18 } else { 34 };
            let ahead = prefetch_ahead(R, C, nb, xt);
            let mut acc = [[_mm256_setzero_ps(); C]; R];
            for b in 0..nb {
                let mut dy = [0f32; C];
                for (d, y) in dy.iter_mut().zip(ys) {
                    *d = h2f_at(y.as_ptr().add(34 * b));
                }
                for (acc, x) in acc.iter_mut().zip(xs) {
                    let p = x.as_ptr().add(xt * b);
                    if ahead {
                        _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(PREFETCH_AHEAD) as *const i8);
                    }
                    let qx = if Q4 {
                        _mm256_sub_epi8(nibbles_wide(p.add(2)), _mm256_set1_epi8(8))
                    } else {
                        _mm256_loadu_si256(p.add(2) as *const __m256i)
                    };
                    // |x| times y with x's sign: unsigned by signed bytes, as maddubs wants.
                    let ax = _mm256_sign_epi8(qx, qx);
                    let dx = _mm256_set1_ps(h2f_at(p));
                    for ((a, y), &d) in acc.iter_mut().zip(ys).zip(&dy) {
                        let qy = _mm256_loadu_si256(y.as_ptr().add(34 * b + 2) as *const __m256i);
                        let s = $dot(ax, _mm256_sign_epi8(qy, qx));
                        *a = _mm256_fmadd_ps(_mm256_mul_ps(dx, _mm256_set1_ps(d)), s, *a);
                    }
                }
            }
            let mut out = [[0f32; C]; R];
            for (o, acc) in out.iter_mut().zip(&acc) {
                for (o, &a) in o.iter_mut().zip(acc) {
                    *o = hsum(a);
                }
            }
            out
        }

        /// An R x C tile of Q4_1 x Q8_1 dot products over `nb` blocks (C at most 4). Safety: every
        /// `xs[r]` and `ys[c]` holds at least `nb` blocks.
        #[target_feature(enable = $features)]
        unsafe fn $q4_1<const R: usize, const C: usize>(
            nb: usize,
            xs: &[&[u8]; R],
            ys: &[&[u8]; C],
        ) -> [[f32; C]; R] {
            let ahead = prefetch_ahead(R, C, nb, 20);
            let mut acc = [[_mm256_setzero_ps(); C]; R];
            // Lane c of mins[r]: the sum of m_x * s_y of row r and column c.
            let mut mins = [_mm_setzero_ps(); R];
            for b in 0..nb {
                let mut dy = [0f32; C];
                let mut sy = _mm_setzero_ps();
                for (c, (d, y)) in dy.iter_mut().zip(ys).enumerate() {
                    // [d_y, s_y, 0, 0]; s_y goes to lane c of sy.
                    let ds = h2f_pair_at(y.as_ptr().add(36 * b));
                    *d = _mm_cvtss_f32(ds);
                    sy = match c {
                        0 => _mm_insert_ps::<0b01_00_0000>(sy, ds),
                        1 => _mm_insert_ps::<0b01_01_0000>(sy, ds),
                        2 => _mm_insert_ps::<0b01_10_0000>(sy, ds),
                        _ => _mm_insert_ps::<0b01_11_0000>(sy, ds),
                    };
                }
                for ((acc, m), x) in acc.iter_mut().zip(&mut mins).zip(xs) {
                    let p = x.as_ptr().add(20 * b);
                    if ahead {
                        _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(PREFETCH_AHEAD) as *const i8);
                    }
                    let qx = nibbles_wide(p.add(4));
                    // [d_x, m_x, 0, 0]
                    let dm = h2f_pair_at(p);
                    *m = if C == 1 {
                        // Lane 1 gathers m_x * s_y of the one column (sy holds it in lane 0).
                        _mm_fmadd_ps(dm, _mm_moveldup_ps(sy), *m)
                    } else {
                        _mm_fmadd_ps(_mm_permute_ps::<0b01_01_01_01>(dm), sy, *m)
                    };
                    let dx = _mm256_broadcastss_ps(dm);
                    for ((a, y), &d) in acc.iter_mut().zip(ys).zip(&dy) {
                        let qy = _mm256_loadu_si256(y.as_ptr().add(36 * b + 4) as *const __m256i);
                        let s = $dot(qx, qy);
                        *a = _mm256_fmadd_ps(_mm256_mul_ps(dx, _mm256_set1_ps(d)), s, *a);
                    }
                }
            }
            let mut out = [[0f32; C]; R];
            for ((o, acc), m) in out.iter_mut().zip(&acc).zip(&mins) {
                let mut lanes = [0f32; 4];
                // With one column its sum is in lane 1 (see above).
                let m = if C == 1 { _mm_movehdup_ps(*m) } else { *m };
                _mm_storeu_ps(lanes.as_mut_ptr(), m);
                for ((o, &a), &l) in o.iter_mut().zip(acc).zip(&lanes) {
                    *o = hsum(a) + l;
                }
            }
            out
        }
    };
}

tile_kernels!("avx2,fma,f16c", tile_q_0, tile_q4_1, dot_u8_i8);
tile_kernels!(
    "avx2,fma,f16c,avx512f,avx512vl,avx512vnni",
    tile_q_0_vnni,
    tile_q4_1_vnni,
    dot_u8_i8_vnni
);

/// [`dot_u8_i8`] with one AVX-512 VNNI instruction (exact: no 16-bit saturation on the way).
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512vnni")]
unsafe fn dot_u8_i8_vnni(u: __m256i, s: __m256i) -> __m256 {
    _mm256_cvtepi32_ps(_mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s))
}

/// Q4_1 x Q8_1.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_q4_1_avx2(x: &[u8], y: &[u8]) -> f32 {
    let mut acc = _mm256_setzero_ps();
    // Lane 1 accumulates m_x * s_y.
    let mut mins = _mm_setzero_ps();
    for (bx, by) in x.chunks_exact(20).zip(y.chunks_exact(36)) {
        let qx = nibbles(bx.as_ptr().add(4));
        let qy = _mm256_loadu_si256(by.as_ptr().add(4) as *const __m256i);
        // [d_x d_y, m_x s_y, 0, 0]
        let p = _mm_mul_ps(h2f_pair(bx, 0), h2f_pair(by, 0));
        acc = _mm256_fmadd_ps(_mm256_broadcastss_ps(p), dot_u8_i8(qx, qy), acc);
        mins = _mm_add_ps(mins, p);
    }
    hsum(acc) + _mm_cvtss_f32(_mm_shuffle_ps(mins, mins, 1))
}

/// Q8_0 x Q8_0.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_q8_0_avx2(x: &[u8], y: &[u8]) -> f32 {
    let mut acc = _mm256_setzero_ps();
    for (bx, by) in x.chunks_exact(34).zip(y.chunks_exact(34)) {
        let qx = _mm256_loadu_si256(bx.as_ptr().add(2) as *const __m256i);
        let qy = _mm256_loadu_si256(by.as_ptr().add(2) as *const __m256i);
        let d = _mm256_set1_ps(h2f(bx, 0) * h2f(by, 0));
        acc = _mm256_fmadd_ps(d, dot_i8_i8(qx, qy), acc);
    }
    hsum(acc)
}

/// Q8_0 (`SUM` false) or Q8_1 (`SUM` true) row quantizer; the same bytes as the scalar one.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn quantize_q8_avx2<const SUM: bool>(x: &[f32], y: &mut [u8]) {
    let (ts, qoff) = if SUM { (36, 4) } else { (34, 2) };
    let sign = _mm256_set1_ps(-0.0);
    for (xb, b) in x.chunks_exact(32).zip(y.chunks_exact_mut(ts)) {
        let p = xb.as_ptr();
        let v = [
            _mm256_loadu_ps(p),
            _mm256_loadu_ps(p.add(8)),
            _mm256_loadu_ps(p.add(16)),
            _mm256_loadu_ps(p.add(24)),
        ];
        let mut m = _mm256_andnot_ps(sign, v[0]);
        for &vi in &v[1..] {
            m = _mm256_max_ps(m, _mm256_andnot_ps(sign, vi));
        }
        let m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
        let m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        let amax = _mm_cvtss_f32(_mm_max_ss(m4, _mm_shuffle_ps(m4, m4, 1)));
        let d = amax / 127.0;
        let id = _mm256_set1_ps(if d != 0.0 { 1.0 / d } else { 0.0 });
        let round = |v: __m256| {
            _mm256_cvtps_epi32(_mm256_round_ps(
                _mm256_mul_ps(v, id),
                _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC,
            ))
        };
        let i = [round(v[0]), round(v[1]), round(v[2]), round(v[3])];
        // packs works within 128-bit lanes; the permute restores element order.
        let w01 = _mm256_packs_epi32(i[0], i[1]);
        let w23 = _mm256_packs_epi32(i[2], i[3]);
        let bytes = _mm256_packs_epi16(w01, w23);
        let bytes = _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        _mm256_storeu_si256(b.as_mut_ptr().add(qoff) as *mut __m256i, bytes);
        put_f16(b, 0, d);
        if SUM {
            let s = _mm256_add_epi32(_mm256_add_epi32(i[0], i[1]), _mm256_add_epi32(i[2], i[3]));
            let s = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
            let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0b01_00_11_10));
            let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0b10_11_00_01));
            put_f16(b, 2, _mm_cvtsi128_si32(s) as f32 * d);
        }
    }
}

/// A 16-entry int8 table in both 128-bit halves, for byte shuffles by 4-bit index.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn table16(t: &[i8; 16]) -> __m256i {
    _mm256_broadcastsi128_si256(_mm_loadu_si128(t.as_ptr() as *const __m128i))
}

/// A 32-value block of 4-bit table indices (IQ4_NL's and MXFP4's layout: byte j holds values
/// j and j + 16) at `p`, as the table's signed bytes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn looked_up(table: __m256i, p: *const u8) -> __m256i {
    _mm256_shuffle_epi8(table, nibbles(p))
}

/// IQ4_NL x Q8_0: each nibble indexes the non-linear table.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_iq4_nl_avx2(x: &[u8], y: &[u8]) -> f32 {
    let t = table16(&IQ4_VALUES);
    let mut acc = _mm256_setzero_ps();
    for (bx, by) in x.chunks_exact(18).zip(y.chunks_exact(34)) {
        let qx = looked_up(t, bx.as_ptr().add(2));
        let qy = _mm256_loadu_si256(by.as_ptr().add(2) as *const __m256i);
        let d = _mm256_set1_ps(h2f(bx, 0) * h2f(by, 0));
        acc = _mm256_fmadd_ps(d, dot_i8_i8(qx, qy), acc);
    }
    hsum(acc)
}

/// MXFP4 x Q8_0: each nibble indexes the doubled E2M1 values, scaled by half the block's
/// power of two.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_mxfp4_avx2(x: &[u8], y: &[u8]) -> f32 {
    let t = table16(&MXFP4_VALUES);
    let mut acc = _mm256_setzero_ps();
    for (bx, by) in x.chunks_exact(17).zip(y.chunks_exact(34)) {
        let qx = looked_up(t, bx.as_ptr().add(1));
        let qy = _mm256_loadu_si256(by.as_ptr().add(2) as *const __m256i);
        let d = _mm256_set1_ps(e8m0_half(bx[0]) * h2f(by, 0));
        acc = _mm256_fmadd_ps(d, dot_i8_i8(qx, qy), acc);
    }
    hsum(acc)
}

/// IQ4_XS x Q8_K: per 32 values the table's bytes times the activations, weighted by the
/// sub-block's 6-bit scale less 32, summed exactly in i32 over the block.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_iq4_xs_avx2(x: &[u8], y: &[u8]) -> f32 {
    let t = table16(&IQ4_VALUES);
    let mut acc = _mm256_setzero_ps();
    for (bx, by) in x.chunks_exact(136).zip(y.chunks_exact(292)) {
        let dy = f32::from_le_bytes([by[0], by[1], by[2], by[3]]);
        let sh = u16::from_le_bytes([bx[2], bx[3]]);
        let mut sumi = _mm256_setzero_si256();
        for ib in 0..8 {
            let lo = (bx[4 + ib / 2] >> (4 * (ib % 2))) & 15;
            let ls = i16::from(lo) | ((((sh >> (2 * ib)) & 3) as i16) << 4);
            let qx = looked_up(t, bx.as_ptr().add(8 + 16 * ib));
            let qy = _mm256_loadu_si256(by.as_ptr().add(4 + 32 * ib) as *const __m256i);
            let pairs = _mm256_maddubs_epi16(_mm256_sign_epi8(qx, qx), _mm256_sign_epi8(qy, qx));
            sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(pairs, _mm256_set1_epi16(ls - 32)));
        }
        let d = _mm256_set1_ps(h2f(bx, 0) * dy);
        acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(sumi), acc);
    }
    hsum(acc)
}

/// Q4_K x Q8_K.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_q4_k_avx2(x: &[u8], y: &[u8]) -> f32 {
    let mut acc = _mm256_setzero_ps();
    let mut mins = 0f32;
    let m4 = _mm256_set1_epi8(15);
    for (bx, by) in x.chunks_exact(144).zip(y.chunks_exact(292)) {
        let dy = f32::from_le_bytes([by[0], by[1], by[2], by[3]]);
        let (qs, qy) = (bx.as_ptr().add(16), by.as_ptr().add(4));
        let mut sumi = _mm256_setzero_si256();
        let mut summ = 0i32;
        for k in 0..4 {
            let (sc0, m0) = scale_min_k4(2 * k, &bx[4..16]);
            let (sc1, m1) = scale_min_k4(2 * k + 1, &bx[4..16]);
            let b = 2 * k;
            let bs = |g: usize| i32::from(i16::from_le_bytes([by[260 + 2 * g], by[261 + 2 * g]]));
            summ += i32::from(m0) * (bs(2 * b) + bs(2 * b + 1));
            summ += i32::from(m1) * (bs(2 * b + 2) + bs(2 * b + 3));
            let q = _mm256_loadu_si256(qs.add(32 * k) as *const __m256i);
            let lo = _mm256_and_si256(q, m4);
            let hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
            let y0 = _mm256_loadu_si256(qy.add(64 * k) as *const __m256i);
            let y1 = _mm256_loadu_si256(qy.add(64 * k + 32) as *const __m256i);
            let p0 = _mm256_madd_epi16(
                _mm256_maddubs_epi16(lo, y0),
                _mm256_set1_epi16(i16::from(sc0)),
            );
            let p1 = _mm256_madd_epi16(
                _mm256_maddubs_epi16(hi, y1),
                _mm256_set1_epi16(i16::from(sc1)),
            );
            sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(p0, p1));
        }
        let dm = _mm_mul_ps(h2f_pair(bx, 0), _mm_set1_ps(dy));
        acc = _mm256_fmadd_ps(_mm256_broadcastss_ps(dm), _mm256_cvtepi32_ps(sumi), acc);
        mins += _mm_cvtss_f32(_mm_shuffle_ps(dm, dm, 1)) * summ as f32;
    }
    hsum(acc) - mins
}

/// Q6_K x Q8_K: the quants are summed unsigned (0..64) and the offset 32 is taken off with
/// the activations' group sums.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_q6_k_avx2(x: &[u8], y: &[u8]) -> f32 {
    let mut acc = _mm256_setzero_ps();
    let m4 = _mm256_set1_epi8(15);
    let m2 = _mm256_set1_epi8(3);
    let pair = _mm_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
    for (bx, by) in x.chunks_exact(210).zip(y.chunks_exact(292)) {
        let dy = f32::from_le_bytes([by[0], by[1], by[2], by[3]]);
        let sc = &bx[192..208];
        let mut offset = 0i32;
        for (g, &s) in sc.iter().enumerate() {
            offset += i32::from(s as i8)
                * i32::from(i16::from_le_bytes([by[260 + 2 * g], by[261 + 2 * g]]));
        }
        let (ql, qh, qy) = (bx.as_ptr(), bx.as_ptr().add(128), by.as_ptr().add(4));
        let sc16 = _mm_loadu_si128(sc.as_ptr() as *const __m128i);
        let mut sumi = _mm256_setzero_si256();
        for n in 0..2 {
            let l0 = _mm256_loadu_si256(ql.add(64 * n) as *const __m256i);
            let l1 = _mm256_loadu_si256(ql.add(64 * n + 32) as *const __m256i);
            let h = _mm256_loadu_si256(qh.add(32 * n) as *const __m256i);
            let lows = [
                _mm256_and_si256(l0, m4),
                _mm256_and_si256(l1, m4),
                _mm256_and_si256(_mm256_srli_epi16(l0, 4), m4),
                _mm256_and_si256(_mm256_srli_epi16(l1, 4), m4),
            ];
            let highs = [
                _mm256_and_si256(h, m2),
                _mm256_and_si256(_mm256_srli_epi16(h, 2), m2),
                _mm256_and_si256(_mm256_srli_epi16(h, 4), m2),
                _mm256_and_si256(_mm256_srli_epi16(h, 6), m2),
            ];
            for m in 0..4 {
                let q = _mm256_or_si256(lows[m], _mm256_slli_epi16(highs[m], 4));
                let yv = _mm256_loadu_si256(qy.add(128 * n + 32 * m) as *const __m256i);
                // [sc[s] x 8, sc[s + 1] x 8] as i16, for sub-blocks s and s + 1.
                let s = (8 * n + 2 * m) as i8;
                let pick = _mm_add_epi8(pair, _mm_set1_epi8(s));
                let scales = _mm256_cvtepi8_epi16(_mm_shuffle_epi8(sc16, pick));
                let p = _mm256_madd_epi16(_mm256_maddubs_epi16(q, yv), scales);
                sumi = _mm256_add_epi32(sumi, p);
            }
        }
        let d = h2f(bx, 208) * dy;
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
        acc = _mm256_add_ps(
            acc,
            _mm256_setr_ps(-32.0 * d * offset as f32, 0., 0., 0., 0., 0., 0., 0.),
        );
    }
    hsum(acc)
}
