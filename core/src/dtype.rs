//! Element types: plain scalars and GGUF's block-quantized types.
//!
//! A quantized type stores values in blocks of `block_size()` elements taking `type_size()`
//! bytes; a row of such a tensor is a whole number of blocks. The byte layouts are those of
//! GGUF files (ggml's `ggml-common.h`), so weights are used straight from a mapped file.

use crate::error::{Error, Result};

/// The element type of a tensor (ggml's names, hence the underscores).
#[allow(non_camel_case_types)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DType {
    /// 32-bit IEEE float.
    F32,
    /// 16-bit IEEE float.
    F16,
    /// bfloat16.
    BF16,
    /// 32-bit signed integer.
    I32,
    /// 64-bit signed integer.
    I64,
    /// 32 values: f16 scale, 32 x 4-bit.
    Q4_0,
    /// 32 values: f16 scale and min, 32 x 4-bit.
    Q4_1,
    /// 32 values: f16 scale, 32 high bits, 32 x 4-bit low.
    Q5_0,
    /// 32 values: f16 scale and min, 32 high bits, 32 x 4-bit low.
    Q5_1,
    /// 32 values: f16 scale, 32 x i8.
    Q8_0,
    /// 32 values: f16 scale, f16 scale*sum, 32 x i8 (activations only).
    Q8_1,
    /// 256 values: 2-bit super-block type.
    Q2_K,
    /// 256 values: 3-bit super-block type.
    Q3_K,
    /// 256 values: 4-bit super-block type.
    Q4_K,
    /// 256 values: 5-bit super-block type.
    Q5_K,
    /// 256 values: 6-bit super-block type.
    Q6_K,
    /// 256 values: f32 scale, 256 x i8, 16 block sums (activations only).
    Q8_K,
    /// 256 values: f16 scale, 32 groups of 8 from a 256-entry grid with signs (2.06 bits).
    IQ2_XXS,
    /// 256 values: as IQ2_XXS with a 512-entry grid and 4-bit group scales (2.31 bits).
    IQ2_XS,
    /// 256 values: f16 scale, groups of 4 from a 256-entry grid with signs (3.06 bits).
    IQ3_XXS,
    /// 256 values: f16 scale, groups of 8 from a 2048-entry ternary grid (1.56 bits).
    IQ1_S,
    /// 32 values: f16 scale, 32 x 4-bit indices into a non-linear table.
    IQ4_NL,
    /// 256 values: f16 scale, groups of 4 from a 512-entry grid with signs (3.44 bits).
    IQ3_S,
    /// 256 values: f16 scale, groups of 8 from a 1024-entry grid with signs (2.56 bits).
    IQ2_S,
    /// 256 values: IQ4_NL's table with 6-bit scales per 32 values (4.25 bits).
    IQ4_XS,
    /// 256 values: IQ1_S's grid with 3-bit scales per 16 values (1.75 bits).
    IQ1_M,
    /// 256 values: f16 scale, ternary values packed 5 per byte (1.69 bits).
    TQ1_0,
    /// 256 values: f16 scale, ternary values packed 4 per byte (2.06 bits).
    TQ2_0,
    /// 32 values: an E8M0 shared exponent, 32 x 4-bit E2M1 floats (OCP microscaling).
    MXFP4,
}

impl DType {
    /// The classic quantized types of weights (every quantized type but the activation formats
    /// Q8_1 and Q8_K, and [`DType::QUANTIZED_IQ`]): the 32-value block types, then the K types.
    pub const QUANTIZED: [DType; 10] = [
        DType::Q4_0,
        DType::Q4_1,
        DType::Q5_0,
        DType::Q5_1,
        DType::Q8_0,
        DType::Q2_K,
        DType::Q3_K,
        DType::Q4_K,
        DType::Q5_K,
        DType::Q6_K,
    ];

    /// The newer quantized weight types: the i-quants (lattice grids and non-linear tables),
    /// the ternary types and MXFP4. A backend reads only those it names.
    pub const QUANTIZED_IQ: [DType; 12] = [
        DType::IQ1_S,
        DType::IQ1_M,
        DType::IQ2_XXS,
        DType::IQ2_XS,
        DType::IQ2_S,
        DType::IQ3_XXS,
        DType::IQ3_S,
        DType::IQ4_NL,
        DType::IQ4_XS,
        DType::TQ1_0,
        DType::TQ2_0,
        DType::MXFP4,
    ];

    /// Every type, in declaration order.
    pub const ALL: [DType; 29] = [
        DType::F32,
        DType::F16,
        DType::BF16,
        DType::I32,
        DType::I64,
        DType::Q4_0,
        DType::Q4_1,
        DType::Q5_0,
        DType::Q5_1,
        DType::Q8_0,
        DType::Q8_1,
        DType::Q2_K,
        DType::Q3_K,
        DType::Q4_K,
        DType::Q5_K,
        DType::Q6_K,
        DType::Q8_K,
        DType::IQ2_XXS,
        DType::IQ2_XS,
        DType::IQ3_XXS,
        DType::IQ1_S,
        DType::IQ4_NL,
        DType::IQ3_S,
        DType::IQ2_S,
        DType::IQ4_XS,
        DType::IQ1_M,
        DType::TQ1_0,
        DType::TQ2_0,
        DType::MXFP4,
    ];

    /// Elements per block (1 for plain types).
    pub const fn block_size(self) -> usize {
        match self {
            DType::F32 | DType::F16 | DType::BF16 | DType::I32 | DType::I64 => 1,
            DType::Q4_0
            | DType::Q4_1
            | DType::Q5_0
            | DType::Q5_1
            | DType::Q8_0
            | DType::Q8_1
            | DType::IQ4_NL
            | DType::MXFP4 => 32,
            DType::Q2_K
            | DType::Q3_K
            | DType::Q4_K
            | DType::Q5_K
            | DType::Q6_K
            | DType::Q8_K
            | DType::IQ2_XXS
            | DType::IQ2_XS
            | DType::IQ3_XXS
            | DType::IQ1_S
            | DType::IQ3_S
            | DType::IQ2_S
            | DType::IQ4_XS
            | DType::IQ1_M
            | DType::TQ1_0
            | DType::TQ2_0 => 256,
        }
    }

    /// Bytes per block (bytes per element for plain types).
    pub const fn type_size(self) -> usize {
        match self {
            DType::F32 | DType::I32 => 4,
            DType::F16 | DType::BF16 => 2,
            DType::I64 => 8,
            DType::Q4_0 => 18,
            DType::Q4_1 => 20,
            DType::Q5_0 => 22,
            DType::Q5_1 => 24,
            DType::Q8_0 => 34,
            DType::Q8_1 => 36,
            DType::Q2_K => 84,
            DType::Q3_K => 110,
            DType::Q4_K => 144,
            DType::Q5_K => 176,
            DType::Q6_K => 210,
            DType::Q8_K => 292,
            DType::IQ2_XXS => 66,
            DType::IQ2_XS => 74,
            DType::IQ3_XXS => 98,
            DType::IQ1_S => 50,
            DType::IQ4_NL => 18,
            DType::IQ3_S => 110,
            DType::IQ2_S => 82,
            DType::IQ4_XS => 136,
            DType::IQ1_M => 56,
            DType::TQ1_0 => 54,
            DType::TQ2_0 => 66,
            DType::MXFP4 => 17,
        }
    }

    /// Whether the type is block-quantized.
    pub const fn is_quantized(self) -> bool {
        self.block_size() > 1
    }

    /// Whether the type is a float type (F32, F16, BF16).
    pub const fn is_float(self) -> bool {
        matches!(self, DType::F32 | DType::F16 | DType::BF16)
    }

    /// Bytes taken by a row of `n` elements, or an error when `n` is not a whole number of blocks.
    pub fn row_size(self, n: usize) -> Result<usize> {
        let bs = self.block_size();
        if !n.is_multiple_of(bs) {
            return Err(Error::NotWholeBlocks {
                dtype: self,
                n,
                block: bs,
            });
        }
        (n / bs)
            .checked_mul(self.type_size())
            .ok_or(Error::Overflow("row size"))
    }

    /// ggml's lower-case name ("f32", "q4_0", "q4_K").
    pub const fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::I32 => "i32",
            DType::I64 => "i64",
            DType::Q4_0 => "q4_0",
            DType::Q4_1 => "q4_1",
            DType::Q5_0 => "q5_0",
            DType::Q5_1 => "q5_1",
            DType::Q8_0 => "q8_0",
            DType::Q8_1 => "q8_1",
            DType::Q2_K => "q2_K",
            DType::Q3_K => "q3_K",
            DType::Q4_K => "q4_K",
            DType::Q5_K => "q5_K",
            DType::Q6_K => "q6_K",
            DType::Q8_K => "q8_K",
            DType::IQ2_XXS => "iq2_xxs",
            DType::IQ2_XS => "iq2_xs",
            DType::IQ3_XXS => "iq3_xxs",
            DType::IQ1_S => "iq1_s",
            DType::IQ4_NL => "iq4_nl",
            DType::IQ3_S => "iq3_s",
            DType::IQ2_S => "iq2_s",
            DType::IQ4_XS => "iq4_xs",
            DType::IQ1_M => "iq1_m",
            DType::TQ1_0 => "tq1_0",
            DType::TQ2_0 => "tq2_0",
            DType::MXFP4 => "mxfp4",
        }
    }

    /// Parses a name as [`DType::name`] gives it (case-insensitive).
    pub fn from_name(s: &str) -> Result<DType> {
        let l = s.to_ascii_lowercase();
        DType::ALL
            .iter()
            .copied()
            .find(|t| t.name().to_ascii_lowercase() == l)
            .ok_or_else(|| Error::UnknownType(s.to_string()))
    }

    /// The GGUF / ggml type id.
    pub const fn gguf_id(self) -> u32 {
        match self {
            DType::F32 => 0,
            DType::F16 => 1,
            DType::Q4_0 => 2,
            DType::Q4_1 => 3,
            DType::Q5_0 => 6,
            DType::Q5_1 => 7,
            DType::Q8_0 => 8,
            DType::Q8_1 => 9,
            DType::Q2_K => 10,
            DType::Q3_K => 11,
            DType::Q4_K => 12,
            DType::Q5_K => 13,
            DType::Q6_K => 14,
            DType::Q8_K => 15,
            DType::IQ2_XXS => 16,
            DType::IQ2_XS => 17,
            DType::IQ3_XXS => 18,
            DType::IQ1_S => 19,
            DType::IQ4_NL => 20,
            DType::IQ3_S => 21,
            DType::IQ2_S => 22,
            DType::IQ4_XS => 23,
            DType::IQ1_M => 29,
            DType::TQ1_0 => 34,
            DType::TQ2_0 => 35,
            DType::MXFP4 => 39,
            DType::I32 => 26,
            DType::I64 => 27,
            DType::BF16 => 30,
        }
    }

    /// The type with a GGUF / ggml type id.
    pub fn from_gguf_id(id: u32) -> Result<DType> {
        DType::ALL
            .iter()
            .copied()
            .find(|t| t.gguf_id() == id)
            .ok_or_else(|| Error::UnknownType(format!("ggml type id {id}")))
    }
}

impl std::fmt::Display for DType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_ids_round_trip() {
        for t in DType::ALL {
            assert_eq!(DType::from_name(t.name()).unwrap(), t);
            assert_eq!(DType::from_gguf_id(t.gguf_id()).unwrap(), t);
        }
        assert!(DType::from_name("q9_9").is_err());
        assert!(DType::from_gguf_id(999).is_err());
    }

    #[test]
    fn row_sizes() {
        assert_eq!(DType::Q4_0.row_size(64).unwrap(), 36);
        assert_eq!(DType::Q4_K.row_size(512).unwrap(), 288);
        assert!(DType::Q4_0.row_size(33).is_err());
        assert_eq!(DType::F16.row_size(3).unwrap(), 6);
        assert_eq!(DType::IQ4_XS.row_size(512).unwrap(), 272);
        assert_eq!(DType::MXFP4.row_size(64).unwrap(), 34);
    }
}
