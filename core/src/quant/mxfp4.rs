//! MXFP4 (32 values, 17 bytes): the OCP microscaling FP4 format. Byte 0 is an E8M0 exponent
//! `e`, then 16 bytes `qs` of E2M1 4-bit floats; value `j` (0..16) is `s * F[qs[j] & 15]` and
//! value `j + 16` is `s * F[qs[j] >> 4]`, where `F` = [`MXFP4_VALUES`] holds each E2M1 value
//! doubled and `s = 2^(e - 128)` (half the block's scale `2^(e - 127)`, undoing the doubling).
//!
//! The quantizer is ggml's: `e = floor(log2(amax)) - 2 + 127`, then each value takes the
//! nearest table entry (the first of a tie).

/// The E2M1 values, doubled so that they are integers (sign in bit 3).
pub const MXFP4_VALUES: [i8; 16] = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12];

/// `2^(e - 128)` as f32 (subnormal for `e` < 2), ggml's `GGML_E8M0_TO_FP32_HALF`.
pub fn e8m0_half(e: u8) -> f32 {
    let bits = if e < 2 {
        0x0020_0000u32 << e
    } else {
        u32::from(e - 1) << 23
    };
    f32::from_bits(bits)
}

/// Quantizes one MXFP4 block.
pub(super) fn quantize(x: &[f32], b: &mut [u8]) {
    let amax = x
        .iter()
        .fold(0f32, |m, v| if m < v.abs() { v.abs() } else { m });
    // Blocks too small for the smallest exponent take exponent 0, as zeros do.
    let e = if amax > 0.0 {
        (amax.log2().floor() - 2.0 + 127.0).clamp(0.0, 254.0) as u8
    } else {
        0
    };
    let s = e8m0_half(e);
    b[0] = e;
    let nearest = |v: f32| {
        let mut best = (0usize, (f32::from(MXFP4_VALUES[0]) * s - v).abs());
        for (i, &t) in MXFP4_VALUES.iter().enumerate().skip(1) {
            let err = (f32::from(t) * s - v).abs();
            if err < best.1 {
                best = (i, err);
            }
        }
        best.0 as u8
    };
    for j in 0..16 {
        b[1 + j] = nearest(x[j]) | (nearest(x[j + 16]) << 4);
    }
}

/// Dequantizes one MXFP4 block.
pub(super) fn dequantize(b: &[u8], y: &mut [f32]) {
    let s = e8m0_half(b[0]);
    for j in 0..16 {
        y[j] = f32::from(MXFP4_VALUES[(b[1 + j] & 15) as usize]) * s;
        y[j + 16] = f32::from(MXFP4_VALUES[(b[1 + j] >> 4) as usize]) * s;
    }
}
