//! Row conversion to and from every [`DType`], and the reference dot products that a CPU
//! `mul_mat` is built on.
//!
//! # Layouts
//!
//! Every block layout is bit-exact with GGUF files (ggml's `ggml-common.h`); all multi-byte
//! fields are little-endian and blocks are packed with no padding. Each family lives in its own
//! file, which documents its layout: `q4` (Q4_0, Q4_1), `q5` (Q5_0, Q5_1), `q8` (Q8_0,
//! Q8_1, Q8_K), `q2_k` .. `q6_k`, `iq1` (IQ1_S, IQ1_M), `iq2` (IQ2_XXS, IQ2_XS, IQ2_S), `iq3`
//! (IQ3_XXS, IQ3_S), `iq4` (IQ4_NL, IQ4_XS), `tq` (TQ1_0, TQ2_0) and `mxfp4`. `k_search` holds
//! the scale searches the K types share; `iq_grids` the lattice grids of the i-quants.
//!
//! # Quantization
//!
//! Quantizers follow ggml's reference algorithms (`quantize_row_*_ref`), so the error of a
//! tessera-quantized tensor is that of a ggml-quantized one: Q4_0/Q5_0 scale by the value of
//! largest magnitude, Q4_1/Q5_1 by min and max, the K types search their sub-block scales
//! (and mins) and then quantize those scales to 4, 6 or 8 bits. One exception: Q8_0, Q8_1 and
//! Q8_K round halfway cases to even (as ggml's SIMD quantizers do) rather than away from zero.
//! IQ4_NL, IQ4_XS, TQ1_0, TQ2_0 and MXFP4 quantize as llama-quantize does without an importance
//! matrix, and so do IQ1_M, IQ2_S, IQ3_XXS and IQ3_S (`lattice_quant`: ggml's search over
//! the lattice grid, bit for bit). ggml's searches for the other lattice types (IQ1_S, IQ2_XXS,
//! IQ2_XS) need an importance matrix: [`quantize_row`] refuses them by name ([`can_quantize`]),
//! and [`quantize_row_imatrix`] writes them with one, bit for bit with ggml.
//!
//! # Dot products
//!
//! [`vec_dot`] multiplies a weight row with an activation row already quantized to
//! [`vec_dot_type`] of the weight type, as ggml's CPU backend does. The integer products of a
//! block are summed exactly; only the per-block scaling is done in f32. The types of
//! [`DType::QUANTIZED_IQ`] pair with Q8_0 (32-value blocks) or Q8_K as in ggml, but their
//! reference dot dequantizes each weight block to f32 and sums its products with the 8-bit
//! activations in f32 (their grid and table values are not small integers times one scale). These are portable
//! reference loops, the definition a fast kernel is tested against: the CPU backend's SIMD
//! kernels (tessera-cpu) match them. [`vec_dot_f32`] is the precise mode: the activations stay
//! f32 and each weight block is dequantized on the fly.
//!
//! Everything here is the plain scalar code that every backend and test may rely on; nothing
//! is chosen per CPU.

use half::{bf16, f16};

use crate::dtype::DType;
use crate::error::{Error, Result};

mod iq1;
mod iq2;
mod iq3;
mod iq4;
pub mod iq_grids;
mod k_search;
mod lattice_quant;
mod mxfp4;
mod q2_k;
mod q3_k;
mod q4;
mod q4_k;
mod q5;
mod q5_k;
mod q6_k;
mod q8;
#[cfg(test)]
mod tests;
mod tq;

pub use iq4::IQ4_VALUES;
pub use k_search::scale_min_k4;
pub use mxfp4::{e8m0_half, MXFP4_VALUES};

/// Quantizes one block: `src` is exactly one block of floats, `dst` exactly one block of bytes.
type QuantizeBlock = fn(&[f32], &mut [u8]);
/// Dequantizes one block: `src` is exactly one block of bytes, `dst` one block of floats.
type DequantizeBlock = fn(&[u8], &mut [f32]);
/// The block quantizer (where tessera has one) and dequantizer of a quantized type.
fn block_fns(dtype: DType) -> Option<(Option<QuantizeBlock>, DequantizeBlock)> {
    let q = |f: QuantizeBlock| Some(f);
    Some(match dtype {
        DType::Q4_0 => (q(q4::quantize_q4_0), q4::dequantize_q4_0),
        DType::Q4_1 => (q(q4::quantize_q4_1), q4::dequantize_q4_1),
        DType::Q5_0 => (q(q5::quantize_q5_0), q5::dequantize_q5_0),
        DType::Q5_1 => (q(q5::quantize_q5_1), q5::dequantize_q5_1),
        DType::Q8_0 => (q(q8::quantize_q8_0), q8::dequantize_q8_0),
        DType::Q8_1 => (q(q8::quantize_q8_1), q8::dequantize_q8_1),
        DType::Q8_K => (q(q8::quantize_q8_k), q8::dequantize_q8_k),
        DType::Q2_K => (q(q2_k::quantize), q2_k::dequantize),
        DType::Q3_K => (q(q3_k::quantize), q3_k::dequantize),
        DType::Q4_K => (q(q4_k::quantize), q4_k::dequantize),
        DType::Q5_K => (q(q5_k::quantize), q5_k::dequantize),
        DType::Q6_K => (q(q6_k::quantize), q6_k::dequantize),
        DType::IQ4_NL => (q(iq4::quantize_nl), iq4::dequantize_nl),
        DType::IQ4_XS => (q(iq4::quantize_xs), iq4::dequantize_xs),
        DType::TQ1_0 => (q(tq::quantize_tq1), tq::dequantize_tq1),
        DType::TQ2_0 => (q(tq::quantize_tq2), tq::dequantize_tq2),
        DType::MXFP4 => (q(mxfp4::quantize), mxfp4::dequantize),
        DType::IQ1_S => (None, iq1::dequantize_s),
        DType::IQ1_M => (q(lattice_quant::quantize_iq1_m), iq1::dequantize_m),
        DType::IQ2_XXS => (None, iq2::dequantize_xxs),
        DType::IQ2_XS => (None, iq2::dequantize_xs),
        DType::IQ2_S => (q(lattice_quant::quantize_iq2_s), iq2::dequantize_s),
        DType::IQ3_XXS => (q(lattice_quant::quantize_iq3_xxs), iq3::dequantize_xxs),
        DType::IQ3_S => (q(lattice_quant::quantize_iq3_s), iq3::dequantize_s),
        DType::F32 | DType::F16 | DType::BF16 | DType::I32 | DType::I64 => return None,
    })
}

/// Whether [`quantize_row`] can write `dtype`: every type but the lattice i-quants IQ1_S,
/// IQ2_XXS and IQ2_XS, whose ggml quantizers need an importance matrix (IQ1_M, IQ2_S, IQ3_XXS
/// and IQ3_S are written by ggml's grid search without one).
pub fn can_quantize(dtype: DType) -> bool {
    block_fns(dtype).is_none_or(|(q, _)| q.is_some())
}

/// Whether `dtype` is a lattice i-quant (IQ1_S, IQ1_M, IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S):
/// its blocks index the grids of [`iq_grids`], and it is written (where it is) by a search
/// over them on the CPU, not by a per-value rounding a GPU copy could do.
pub fn is_lattice(dtype: DType) -> bool {
    matches!(
        dtype,
        DType::IQ1_S
            | DType::IQ1_M
            | DType::IQ2_XXS
            | DType::IQ2_XS
            | DType::IQ2_S
            | DType::IQ3_XXS
            | DType::IQ3_S
    )
}

/// Makes `block`, random bytes of one block of a lattice i-quant, a block whose values have
/// the root mean square `rms`: its grid indices, signs
/// and sub-block scales stay as drawn, and its f16 super-block scale is set to give that RMS
/// (as near as f16 allows). This is how tests and random-weight models get data of these types
/// without a quantizer. Errors for any other type or a block of the wrong size.
pub fn fit_random_block(dtype: DType, block: &mut [u8], rms: f32) -> Result<()> {
    if !is_lattice(dtype) {
        return Err(Error::Invalid(format!(
            "{dtype} is not a lattice i-quant: quantize its values instead"
        )));
    }
    if block.len() != dtype.type_size() {
        return Err(wrong_size(
            dtype,
            dtype.block_size(),
            dtype.type_size(),
            block.len(),
        ));
    }
    // The block's values with a super-block scale of 1 give the scale that yields `rms`.
    let set_scale = |block: &mut [u8], d: f32| {
        let bits = f16::from_f32(d).to_bits();
        if dtype == DType::IQ1_M {
            // The scale's four nibbles are the top nibbles of the four u16 sub-block scale
            // words.
            for k in 0..4 {
                let at = 49 + 2 * k;
                block[at] = (block[at] & 0x0f) | ((((bits >> (4 * k)) & 15) as u8) << 4);
            }
        } else {
            block[..2].copy_from_slice(&bits.to_le_bytes());
        }
    };
    set_scale(block, 1.0);
    let mut v = [0f32; 256];
    dequantize_row(dtype, block, &mut v)?;
    let unit = (v.iter().map(|x| f64::from(*x).powi(2)).sum::<f64>() / 256.0).sqrt() as f32;
    set_scale(block, if unit > 0.0 { rms / unit } else { 0.0 });
    Ok(())
}

/// The error for a byte buffer of the wrong size for a row.
fn wrong_size(dtype: DType, n: usize, expected: usize, got: usize) -> Error {
    Error::Buffer {
        buffer: format!("{dtype} row of {n} elements"),
        reason: format!("needs {expected} bytes, got {got}"),
    }
}

/// Whether ggml quantizes `dtype` only with an importance matrix (ggml's
/// `ggml_quantize_requires_imatrix`): IQ1_S, IQ2_XXS and IQ2_XS. [`quantize_row`] refuses them;
/// [`quantize_row_imatrix`] writes them.
pub fn requires_imatrix(dtype: DType) -> bool {
    matches!(dtype, DType::IQ1_S | DType::IQ2_XXS | DType::IQ2_XS)
}

/// Quantizes one row of f32 into `dst` bytes of `dtype`, a type whose quantizer needs an
/// importance matrix ([`requires_imatrix`]: IQ1_S, IQ2_XXS, IQ2_XS), with `imatrix` holding one
/// weight per value of the row (llama-quantize's imatrix entries for the row's columns), as
/// ggml's `ggml_quantize_chunk` does: bit for bit with ggml's bytes. Errors for every other type
/// (use [`quantize_row`]) and for lengths that do not fit.
pub fn quantize_row_imatrix(
    dtype: DType,
    src: &[f32],
    imatrix: &[f32],
    dst: &mut [u8],
) -> Result<()> {
    let need = dtype.row_size(src.len())?;
    if dst.len() != need {
        return Err(wrong_size(dtype, src.len(), need, dst.len()));
    }
    if imatrix.len() != src.len() {
        return Err(Error::Invalid(format!(
            "an importance matrix of {} weights for a row of {} values",
            imatrix.len(),
            src.len()
        )));
    }
    let quantize: fn(&[f32], &[f32], &mut [u8]) = match dtype {
        DType::IQ2_XS => lattice_quant::quantize_iq2_xs,
        DType::IQ2_XXS => lattice_quant::quantize_iq2_xxs,
        DType::IQ1_S => lattice_quant::quantize_iq1_s,
        _ => {
            return Err(Error::Unsupported {
                backend: "tessera's quantizer".into(),
                what: format!("writing {dtype} with an importance matrix"),
            })
        }
    };
    let (bs, ts) = (dtype.block_size(), dtype.type_size());
    for ((s, w), d) in src
        .chunks_exact(bs)
        .zip(imatrix.chunks_exact(bs))
        .zip(dst.chunks_exact_mut(ts))
    {
        quantize(s, w, d);
    }
    Ok(())
}

/// Quantizes (or converts) one row of f32 into `dst` bytes of type `dtype`; works for F32, F16,
/// BF16 and every quantized type [`can_quantize`] accepts. Errors when src.len() is not whole
/// blocks, dst has the wrong size, or the type is a lattice i-quant tessera does not write
/// without an importance matrix.
///
/// I32 and I64 are converted with Rust's `as` cast (truncation toward zero, saturating, NaN to 0).
pub fn quantize_row(dtype: DType, src: &[f32], dst: &mut [u8]) -> Result<()> {
    let need = dtype.row_size(src.len())?;
    if dst.len() != need {
        return Err(wrong_size(dtype, src.len(), need, dst.len()));
    }
    match dtype {
        DType::F32 => convert_out(src, dst, |v| v.to_le_bytes()),
        DType::F16 => convert_out(src, dst, |v| f16::from_f32(v).to_le_bytes()),
        DType::BF16 => convert_out(src, dst, |v| bf16::from_f32(v).to_le_bytes()),
        DType::I32 => convert_out(src, dst, |v| (v as i32).to_le_bytes()),
        DType::I64 => convert_out(src, dst, |v| (v as i64).to_le_bytes()),
        _ => {
            if let Some((quantize, _)) = block_fns(dtype) {
                let quantize = quantize.ok_or_else(|| Error::Unsupported {
                    backend: "tessera's quantizer".into(),
                    what: format!(
                        "writing {dtype} without an importance matrix (ggml's search for this \
                         lattice i-quant needs one: quantize such files with llama-quantize \
                         and an imatrix)"
                    ),
                })?;
                let (bs, ts) = (dtype.block_size(), dtype.type_size());
                for (s, d) in src.chunks_exact(bs).zip(dst.chunks_exact_mut(ts)) {
                    quantize(s, d);
                }
            }
        }
    }
    Ok(())
}

/// Dequantizes (or converts) one row of `dtype` bytes into f32 (all float + quantized types; I32
/// too as a plain cast is fine).
///
/// `dst.len()` is the row length; `src` must hold exactly that row. I32 and I64 are cast to f32.
pub fn dequantize_row(dtype: DType, src: &[u8], dst: &mut [f32]) -> Result<()> {
    let need = dtype.row_size(dst.len())?;
    if src.len() != need {
        return Err(wrong_size(dtype, dst.len(), need, src.len()));
    }
    match dtype {
        DType::F32 => convert_in(src, dst, f32::from_le_bytes),
        DType::F16 => convert_in(src, dst, |b| f16::from_le_bytes(b).to_f32()),
        DType::BF16 => convert_in(src, dst, |b| bf16::from_le_bytes(b).to_f32()),
        DType::I32 => convert_in(src, dst, |b| i32::from_le_bytes(b) as f32),
        DType::I64 => convert_in(src, dst, |b| i64::from_le_bytes(b) as f32),
        _ => {
            if let Some((_, dequantize)) = block_fns(dtype) {
                let (bs, ts) = (dtype.block_size(), dtype.type_size());
                for (s, d) in src.chunks_exact(ts).zip(dst.chunks_exact_mut(bs)) {
                    dequantize(s, d);
                }
            }
        }
    }
    Ok(())
}

/// Writes each value of `src` as the `N` bytes `f` gives.
fn convert_out<const N: usize>(src: &[f32], dst: &mut [u8], f: impl Fn(f32) -> [u8; N]) {
    for (d, &v) in dst.chunks_exact_mut(N).zip(src) {
        d.copy_from_slice(&f(v));
    }
}

/// Reads each `N`-byte value of `src` into `dst` with `f`.
fn convert_in<const N: usize>(src: &[u8], dst: &mut [f32], f: impl Fn([u8; N]) -> f32) {
    for (s, d) in src.chunks_exact(N).zip(dst.iter_mut()) {
        let mut b = [0u8; N];
        b.copy_from_slice(s);
        *d = f(b);
    }
}

/// The type that src1 (activations) is quantized to for `vec_dot` with a weight row of `dtype`
/// (ggml's vec_dot_type: Q8_0 for Q4_0/Q5_0/Q8_0, Q8_1 for Q4_1/Q5_1, Q8_K for the K types, F32
/// for F32, F16 for F16, BF16 for BF16 is fine).
///
/// The rest: Q8_1 pairs with Q8_1, Q8_K with Q8_K, and I32/I64 with F32 (the weights are cast).
/// Of the newer types, IQ4_NL and MXFP4 (32-value blocks) pair with Q8_0, the others with Q8_K.
pub fn vec_dot_type(dtype: DType) -> DType {
    match dtype {
        DType::IQ4_NL | DType::MXFP4 => DType::Q8_0,
        DType::IQ1_S
        | DType::IQ1_M
        | DType::IQ2_XXS
        | DType::IQ2_XS
        | DType::IQ2_S
        | DType::IQ3_XXS
        | DType::IQ3_S
        | DType::IQ4_XS
        | DType::TQ1_0
        | DType::TQ2_0 => DType::Q8_K,
        DType::F32 | DType::I32 | DType::I64 => DType::F32,
        DType::F16 => DType::F16,
        DType::BF16 => DType::BF16,
        DType::Q4_0 | DType::Q5_0 | DType::Q8_0 => DType::Q8_0,
        DType::Q4_1 | DType::Q5_1 | DType::Q8_1 => DType::Q8_1,
        DType::Q2_K | DType::Q3_K | DType::Q4_K | DType::Q5_K | DType::Q6_K | DType::Q8_K => {
            DType::Q8_K
        }
    }
}

/// Dot product of one weight row `x` (type dtype, n elements) with one activation row `y`
/// already in vec_dot_type(dtype).
///
/// `n` must be a whole number of blocks and the slices must hold the `n` elements (checked in
/// debug builds only). In release builds a short slice gives the dot product of the blocks both
/// slices hold, never an out-of-bounds read.
pub fn vec_dot(dtype: DType, n: usize, x: &[u8], y: &[u8]) -> f32 {
    let yt = vec_dot_type(dtype);
    let nb = n / dtype.block_size();
    debug_assert_eq!(
        n % dtype.block_size(),
        0,
        "vec_dot: {n} is not whole {dtype} blocks"
    );
    debug_assert!(x.len() >= nb * dtype.type_size(), "vec_dot: x too short");
    debug_assert!(y.len() >= nb * yt.type_size(), "vec_dot: y too short");
    let x = &x[..x.len().min(nb * dtype.type_size())];
    let y = &y[..y.len().min(nb * yt.type_size())];
    match dtype {
        DType::F32 => dot_plain(x, y, f32::from_le_bytes, f32::from_le_bytes),
        DType::F16 => dot_plain(x, y, f16_of, f16_of),
        DType::BF16 => dot_plain(x, y, bf16_of, bf16_of),
        DType::I32 => dot_plain(x, y, |b| i32::from_le_bytes(b) as f32, f32::from_le_bytes),
        DType::I64 => dot_plain(x, y, |b| i64::from_le_bytes(b) as f32, f32::from_le_bytes),
        DType::Q4_0 => q4::dot_q4_0(x, y),
        DType::Q4_1 => q4::dot_q4_1(x, y),
        DType::Q5_0 => q5::dot_q5_0(x, y),
        DType::Q5_1 => q5::dot_q5_1(x, y),
        DType::Q8_0 => q8::dot_q8_0(x, y),
        DType::Q8_1 => q8::dot_q8_1(x, y),
        DType::Q8_K => q8::dot_q8_k(x, y),
        DType::Q2_K => q2_k::dot(x, y),
        DType::Q3_K => q3_k::dot(x, y),
        DType::Q4_K => q4_k::dot(x, y),
        DType::Q5_K => q5_k::dot(x, y),
        DType::Q6_K => q6_k::dot(x, y),
        DType::IQ4_NL | DType::MXFP4 => dot_dequantized(dtype, x, y, 2, 34),
        DType::IQ1_S
        | DType::IQ1_M
        | DType::IQ2_XXS
        | DType::IQ2_XS
        | DType::IQ2_S
        | DType::IQ3_XXS
        | DType::IQ3_S
        | DType::IQ4_XS
        | DType::TQ1_0
        | DType::TQ2_0 => dot_dequantized(dtype, x, y, 4, 292),
    }
}

/// A weight row of `dtype` times 8-bit activations whose blocks (one per weight block, of
/// `y_size` bytes) hold their scale first (f16 for 2 bytes, f32 for 4) and then one i8 per
/// value: each weight block is dequantized and its products with the i8 values summed in f32,
/// then scaled by the activation block's scale.
fn dot_dequantized(dtype: DType, x: &[u8], y: &[u8], scale_bytes: usize, y_size: usize) -> f32 {
    let Some((_, dequantize)) = block_fns(dtype) else {
        return 0.0;
    };
    let (bs, ts) = (dtype.block_size(), dtype.type_size());
    let mut w = [0f32; 256];
    let w = &mut w[..bs];
    let mut acc = 0f32;
    for (bx, by) in x.chunks_exact(ts).zip(y.chunks_exact(y_size)) {
        dequantize(bx, w);
        let dy = if scale_bytes == 2 {
            get_f16(by, 0)
        } else {
            f32::from_le_bytes(bytes(by))
        };
        let q = &by[scale_bytes..scale_bytes + bs];
        // Eight running sums (summed at the end), which the compiler keeps in one vector.
        let mut part = [0f32; 8];
        for (wc, qc) in w.chunks_exact(8).zip(q.chunks_exact(8)) {
            for i in 0..8 {
                part[i] += wc[i] * f32::from(qc[i] as i8);
            }
        }
        acc += part.iter().sum::<f32>() * dy;
    }
    acc
}

/// An f16 from its little-endian bytes, as f32.
fn f16_of(b: [u8; 2]) -> f32 {
    f16::from_le_bytes(b).to_f32()
}

/// A bf16 from its little-endian bytes, as f32.
fn bf16_of(b: [u8; 2]) -> f32 {
    bf16::from_le_bytes(b).to_f32()
}

/// The dot product of two rows of plain scalars, accumulated in f32.
fn dot_plain<const A: usize, const B: usize>(
    x: &[u8],
    y: &[u8],
    fx: impl Fn([u8; A]) -> f32,
    fy: impl Fn([u8; B]) -> f32,
) -> f32 {
    x.chunks_exact(A)
        .zip(y.chunks_exact(B))
        .map(|(a, b)| fx(bytes(a)) * fy(bytes(b)))
        .sum()
}

/// The first `N` bytes of `b` as an array (`b` has at least `N`).
#[inline(always)]
fn bytes<const N: usize>(b: &[u8]) -> [u8; N] {
    let mut a = [0u8; N];
    a.copy_from_slice(&b[..N]);
    a
}

/// Dot product of one weight row of `dtype` with an f32 row, without quantizing y (the precise
/// mode used for checking; dequantize block by block on the fly, never a whole matrix).
///
/// Each block's products are summed in f32 and the blocks in f64. Lengths are treated as in
/// [`vec_dot`].
pub fn vec_dot_f32(dtype: DType, n: usize, x: &[u8], y: &[f32]) -> f32 {
    let (bs, ts) = (dtype.block_size(), dtype.type_size());
    debug_assert_eq!(n % bs, 0, "vec_dot_f32: {n} is not whole {dtype} blocks");
    debug_assert!(
        x.len() >= (n / bs) * ts && y.len() >= n,
        "vec_dot_f32: row too short"
    );
    let x = &x[..x.len().min((n / bs) * ts)];
    let y = &y[..y.len().min(n)];
    match dtype {
        DType::F32 | DType::F16 | DType::BF16 | DType::I32 | DType::I64 => {
            x.chunks_exact(ts)
                .zip(y)
                .map(|(b, &v)| f64::from(plain_to_f32(dtype, b)) * f64::from(v))
                .sum::<f64>() as f32
        }
        _ => {
            let Some((_, dequantize)) = block_fns(dtype) else {
                return 0.0;
            };
            let mut buf = [0f32; 256];
            let buf = &mut buf[..bs];
            let mut acc = 0f64;
            for (xb, yc) in x.chunks_exact(ts).zip(y.chunks_exact(bs)) {
                dequantize(xb, buf);
                let s: f32 = buf.iter().zip(yc).map(|(a, b)| a * b).sum();
                acc += f64::from(s);
            }
            acc as f32
        }
    }
}

/// One element of a plain (non-block) type from its little-endian bytes, as f32.
fn plain_to_f32(dtype: DType, b: &[u8]) -> f32 {
    match dtype {
        DType::F16 => f16_of(bytes(b)),
        DType::BF16 => bf16_of(bytes(b)),
        DType::I32 => i32::from_le_bytes(bytes(b)) as f32,
        DType::I64 => i64::from_le_bytes(bytes(b)) as f32,
        _ => f32::from_le_bytes(bytes(b)),
    }
}

/// The f16 at byte `at` of `b`, as f32.
#[inline(always)]
fn get_f16(b: &[u8], at: usize) -> f32 {
    f16::from_le_bytes([b[at], b[at + 1]]).to_f32()
}

/// Stores `v` as an f16 at byte `at` of `b`.
#[inline(always)]
fn put_f16(b: &mut [u8], at: usize, v: f32) {
    b[at..at + 2].copy_from_slice(&f16::from_f32(v).to_le_bytes());
}

/// `1 / d`, or 0 when `d` is 0 (a block of zeros).
#[inline(always)]
fn inverse(d: f32) -> f32 {
    if d != 0.0 {
        1.0 / d
    } else {
        0.0
    }
}
