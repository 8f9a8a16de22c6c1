//! The CPU's quantized kernels: the dot products `mul_mat` is built on and the activation
//! quantizers, with SIMD variants where this CPU has them.
//!
//! The definitions are tessera-core's portable reference code (`tessera_core::quant`): block
//! layouts, [`vec_dot_type`] pairing, [`tessera_core::quant::vec_dot`] and
//! [`tessera_core::quant::quantize_row`]. On x86-64 CPUs with AVX2, FMA and F16C, the hot
//! pairs (Q4_0, Q4_1, Q5_0, Q8_0, Q4_K, Q6_K, IQ4_NL, IQ4_XS, MXFP4, and the Q8_0/Q8_1
//! activation quantizers) use `std::arch` kernels (`avx2`), chosen once per process by feature
//! detection; each is tested against the reference (the quantizers byte for byte). Every other
//! type runs the reference.

use tessera_core::quant::{self as reference, vec_dot_type};
use tessera_core::{DType, Result};

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(test)]
mod tests;

/// A row dot product over whole blocks of `x` (weights) and `y` (activations); the number of
/// blocks is the smaller of the two slices' block counts.
type DotFn = fn(&[u8], &[u8]) -> f32;
/// Quantizes a row of whole blocks (`dst` has exactly the row's size).
type QuantizeRowFn = fn(&[f32], &mut [u8]);

/// The kernels that have a SIMD variant.
struct Kernels {
    dot_q4_0: DotFn,
    dot_q4_1: DotFn,
    dot_q5_0: DotFn,
    dot_q8_0: DotFn,
    dot_q4_k: DotFn,
    dot_q6_k: DotFn,
    dot_iq4_nl: DotFn,
    dot_iq4_xs: DotFn,
    dot_mxfp4: DotFn,
    quantize_q8_0: QuantizeRowFn,
    quantize_q8_1: QuantizeRowFn,
}

/// The SIMD kernels for this CPU, detected on first use; `None` where it has none.
fn kernels() -> Option<&'static Kernels> {
    static K: std::sync::OnceLock<Option<&'static Kernels>> = std::sync::OnceLock::new();
    *K.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        if let Some(k) = avx2::kernels() {
            log::debug!("cpu quant: using AVX2+FMA+F16C kernels");
            return Some(k);
        }
        log::debug!("cpu quant: using the portable kernels");
        None
    })
}

/// Quantizes (or converts) one row of f32 into `dst` bytes of type `dtype`, as
/// [`tessera_core::quant::quantize_row`] does (the same bytes), with the SIMD quantizers where
/// this CPU has them.
pub(crate) fn quantize_row(dtype: DType, src: &[f32], dst: &mut [u8]) -> Result<()> {
    let fast = kernels().and_then(|k| match dtype {
        DType::Q8_0 => Some(k.quantize_q8_0),
        DType::Q8_1 => Some(k.quantize_q8_1),
        _ => None,
    });
    match fast {
        Some(f) if dst.len() == dtype.row_size(src.len())? => {
            f(src, dst);
            Ok(())
        }
        // The reference also reports a length that is not whole blocks or a wrong size.
        _ => reference::quantize_row(dtype, src, dst),
    }
}

/// Dot product of one weight row `x` (type `dtype`, `n` elements) with one activation row `y`
/// already in `vec_dot_type(dtype)`: [`tessera_core::quant::vec_dot`], with the SIMD kernels
/// where this CPU has them. Lengths are treated as there.
pub(crate) fn vec_dot(dtype: DType, n: usize, x: &[u8], y: &[u8]) -> f32 {
    let fast = kernels().and_then(|k| match dtype {
        DType::Q4_0 => Some(k.dot_q4_0),
        DType::Q4_1 => Some(k.dot_q4_1),
        DType::Q5_0 => Some(k.dot_q5_0),
        DType::Q8_0 => Some(k.dot_q8_0),
        DType::Q4_K => Some(k.dot_q4_k),
        DType::Q6_K => Some(k.dot_q6_k),
        DType::IQ4_NL => Some(k.dot_iq4_nl),
        DType::IQ4_XS => Some(k.dot_iq4_xs),
        DType::MXFP4 => Some(k.dot_mxfp4),
        _ => None,
    });
    let Some(f) = fast else {
        return reference::vec_dot(dtype, n, x, y);
    };
    let nb = n / dtype.block_size();
    let x = &x[..x.len().min(nb * dtype.type_size())];
    let y = &y[..y.len().min(nb * vec_dot_type(dtype).type_size())];
    f(x, y)
}

/// Dot products of `R` weight rows `xs` (type `dtype`, `n` elements each) with `C` activation
/// rows `ys` (in `vec_dot_type(dtype)`): `out[r][c]` is `vec_dot(dtype, n, xs[r], ys[c])` up to
/// the rounding of f32 sums.
///
/// This is the kernel of a quantized matrix product with several columns: for Q4_0, Q4_1 and
/// Q8_0 on CPUs with AVX2 (and `C` at most 4) one pass over the blocks computes the whole tile,
/// so each weight block is unpacked once for `C` columns and each activation block is loaded
/// once for `R` rows. Other types and CPUs compute the `R * C` dot products one by one.
/// Lengths are treated as in [`vec_dot`].
pub(crate) fn vec_dot_tile<const R: usize, const C: usize>(
    dtype: DType,
    n: usize,
    xs: &[&[u8]; R],
    ys: &[&[u8]; C],
) -> [[f32; C]; R] {
    // The whole blocks every row holds (short slices stop every product early).
    let (xt, yt) = (dtype.type_size(), vec_dot_type(dtype).type_size());
    let nb = xs
        .iter()
        .map(|x| x.len() / xt)
        .chain(ys.iter().map(|y| y.len() / yt))
        .fold(n / dtype.block_size(), usize::min);
    #[cfg(target_arch = "x86_64")]
    if let Some(out) = avx2::dot_tile(dtype, nb, xs, ys, true) {
        return out;
    }
    let n = nb * dtype.block_size();
    std::array::from_fn(|r| std::array::from_fn(|c| vec_dot(dtype, n, xs[r], ys[c])))
}
