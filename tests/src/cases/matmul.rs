//! mul_mat cases: every weight type against f32 and f16 activations, n from 1 to 67, batches
//! broadcast over dims 2-3, permuted (non-contiguous) activations, odd sizes.

use tessera_core::DType;

use super::{ne_str, permuted, FLOATS};
use crate::case::{Case, Tolerance};
use crate::init::Init;

/// One mul_mat case's parameters (ggml's names).
#[derive(Clone, Copy)]
pub(super) struct MulMat {
    pub type_a: DType,
    pub type_b: DType,
    pub m: usize,
    pub n: usize,
    pub k: usize,
    /// src0's batch dims 2-3.
    pub bs: [usize; 2],
    /// How many times src1's batch repeats src0's.
    pub nr: [usize; 2],
    /// Permutation through which src1 is seen.
    pub per: [usize; 4],
    /// Make the permuted src1 contiguous (cont) before the product.
    pub cont: bool,
}

impl MulMat {
    pub(super) fn new(type_a: DType, type_b: DType, m: usize, n: usize, k: usize) -> MulMat {
        MulMat {
            type_a,
            type_b,
            m,
            n,
            k,
            bs: [1, 1],
            nr: [1, 1],
            per: [0, 1, 2, 3],
            cont: false,
        }
    }

    pub(super) fn case(self) -> Case {
        let MulMat {
            type_a,
            type_b,
            m,
            n,
            k,
            bs,
            nr,
            per,
            cont,
        } = self;
        let mut params = format!(
            "type_a={type_a},type_b={type_b},m={m},n={n},k={k},bs={},nr={},per={}",
            ne_str(&bs),
            ne_str(&nr),
            ne_str(&per)
        );
        if cont {
            params.push_str(",v=cont");
        }
        let batches = bs[0] * nr[0] * bs[1] * nr[1];
        let flops = 2.0 * (m * n * k * batches) as f64;
        Case::new(
            "MUL_MAT",
            params,
            &[type_a, type_b],
            Tolerance::MATMUL,
            move |g| {
                let a = g.leaf(type_a, &[k, m, bs[0], bs[1]])?;
                let ne_b = [k, n, bs[0] * nr[0], bs[1] * nr[1]];
                let mut b = permuted(g, type_b, ne_b, per, Init::Uniform(-1.0, 1.0))?;
                if cont {
                    b = g.cont(b)?;
                }
                g.mul_mat(a, b)
            },
        )
        .with_flops(flops)
    }
}

/// Every mul_mat test case.
pub(super) fn cases(v: &mut Vec<Case>) {
    let mut weights = FLOATS.to_vec();
    weights.extend(DType::QUANTIZED);
    for &t in &weights {
        for n in [1, 2, 3, 4, 5, 6, 7, 8, 13, 16, 17, 67] {
            v.push(MulMat::new(t, DType::F32, 16, n, 256).case());
        }
        for n in [1, 8, 67] {
            v.push(MulMat::new(t, DType::F16, 16, n, 256).case());
        }
    }
    // BF16 activations with float weights (a BF16 x BF16 product is one cuBLAS call).
    for t in FLOATS {
        for n in [1, 8, 67] {
            v.push(MulMat::new(t, DType::BF16, 16, n, 256).case());
        }
    }
    for t in [
        DType::F32,
        DType::F16,
        DType::Q4_0,
        DType::Q8_0,
        DType::Q4_K,
    ] {
        for (bs, nr) in [([1, 1], [2, 1]), ([4, 1], [1, 3]), ([2, 2], [2, 2])] {
            for n in [1, 9] {
                v.push(
                    MulMat {
                        bs,
                        nr,
                        ..MulMat::new(t, DType::F32, 16, n, 256)
                    }
                    .case(),
                );
            }
        }
    }
    for t in [DType::F32, DType::F16, DType::Q4_0, DType::Q8_0] {
        for per in [[0, 2, 1, 3], [0, 1, 3, 2]] {
            v.push(
                MulMat {
                    bs: [2, 3],
                    per,
                    ..MulMat::new(t, DType::F32, 16, 5, 256)
                }
                .case(),
            );
        }
        v.push(
            MulMat {
                bs: [2, 3],
                per: [0, 2, 1, 3],
                cont: true,
                ..MulMat::new(t, DType::F32, 16, 5, 256)
            }
            .case(),
        );
    }
    // Odd sizes: m not a multiple of anything, k a few blocks, n odd.
    let blocked = [
        DType::F32,
        DType::F16,
        DType::BF16,
        DType::Q4_0,
        DType::Q4_1,
        DType::Q5_0,
        DType::Q5_1,
        DType::Q8_0,
    ];
    for t in blocked {
        for (m, n, k) in [(17, 3, 64), (1, 7, 96), (33, 1, 32), (7, 5, 160)] {
            v.push(MulMat::new(t, DType::F32, m, n, k).case());
        }
    }
    // Past one 128 x 64 prompt tile (wgpu's default for float weights) with ragged edges.
    for t in [DType::F32, DType::F16, DType::Q4_0] {
        v.push(MulMat::new(t, DType::F32, 200, 70, 288).case());
    }
    for t in FLOATS {
        for (m, n, k) in [(5, 3, 13), (3, 2, 1)] {
            v.push(MulMat::new(t, DType::F32, m, n, k).case());
        }
    }
    for &t in &DType::QUANTIZED[5..] {
        v.push(MulMat::new(t, DType::F32, 17, 3, 512).case());
    }
    // Rows of many 32-task tiles, the last one ragged (a GPU's staged mat-vec splits a row's
    // tiles over several warps), an odd number of rows, one and two columns.
    for t in [DType::Q4_K, DType::Q5_K, DType::Q6_K] {
        for n in [1, 2] {
            v.push(MulMat::new(t, DType::F32, 37, n, 14336).case());
        }
    }
    // The i-quants, ternary types and MXFP4: mat-vecs of 1 to 8 columns (the GPUs' mat-vec
    // paths), a prompt-sized product, f16 activations, and rows of several blocks with an odd
    // number of rows.
    for t in DType::QUANTIZED_IQ {
        for n in [1, 2, 3, 8, 67] {
            v.push(MulMat::new(t, DType::F32, 16, n, 256).case());
        }
        v.push(MulMat::new(t, DType::F16, 16, 8, 256).case());
        for n in [1, 2] {
            v.push(MulMat::new(t, DType::F32, 37, n, 2048).case());
        }
    }
    // A GPU's quantized mat-mat of a few sequences (2 to 64 columns): rows past a 64-row tile,
    // column tiles of 8 to 32 with ragged ends, k long enough to be split over blocks.
    for t in [
        DType::Q4_0,
        DType::Q4_1,
        DType::Q5_0,
        DType::Q5_1,
        DType::Q8_0,
        DType::Q4_K,
        DType::Q5_K,
        DType::Q6_K,
        DType::IQ4_NL,
        DType::IQ4_XS,
        DType::MXFP4,
    ] {
        for n in [2, 11, 40, 64] {
            v.push(MulMat::new(t, DType::F32, 72, n, 1024).case());
        }
    }
    v.push(MulMat::new(DType::Q4_0, DType::F16, 72, 24, 1024).case());
    few_columns(v);
    v.push(
        MulMat::new(DType::F32, DType::F32, 256, 32, 4096)
            .case()
            .large(),
    );
    v.push(
        MulMat::new(DType::Q4_0, DType::F32, 512, 8, 4096)
            .case()
            .large(),
    );
    gpu_paths(v);
}

/// Batched decoding's products (2 to 64 columns) for the types a GPU's integer-dot mat-vec
/// takes (wgpu's computes up to 16 columns per workgroup, each vec4 of its sums full or cut
/// part-way, the last group of columns ragged): an odd number of rows, several 256-value
/// blocks, column counts on both sides of each tile of 8; batched dims with src0 broadcast; f16
/// activations; rows longer than the columns' chunk in workgroup memory (several chunks); many
/// rows. For the 32-value types also k of 13 blocks (a 256-value stage of CUDA's mat-mat and
/// part of another), and rows a few past a multiple of 16 and 32.
fn few_columns(v: &mut Vec<Case>) {
    for t in [
        DType::Q4_0,
        DType::Q4_1,
        DType::Q8_0,
        DType::Q4_K,
        DType::Q5_K,
        DType::Q6_K,
    ] {
        for n in [2, 3, 5, 7, 8, 9, 12, 15, 16, 17, 31, 32, 64] {
            v.push(MulMat::new(t, DType::F32, 37, n, 512).case());
        }
        if t.block_size() == 32 {
            for n in [3, 9, 32] {
                v.push(MulMat::new(t, DType::F32, 37, n, 13 * 32).case());
            }
            v.push(MulMat::new(t, DType::F32, 4100, 17, 64).case());
        }
        for n in [5, 16] {
            v.push(
                MulMat {
                    bs: [2, 1],
                    nr: [1, 2],
                    ..MulMat::new(t, DType::F32, 21, n, 256)
                }
                .case(),
            );
        }
        v.push(MulMat::new(t, DType::F16, 37, 12, 512).case());
        v.push(MulMat::new(t, DType::F32, 19, 6, 9216).case());
        // Enough rows for several to a subgroup (row sums by shuffles where a GPU has them).
        v.push(MulMat::new(t, DType::F32, 512, 16, 512).case());
    }
}

/// Shapes that take each of the CUDA backend's mul_mat paths in turn, for every weight type
/// (see backend-cuda/src/ops/matmul.rs): mat-vecs of one column (rows not a multiple of a
/// block's), three columns, and eight with src0 broadcast over src1's batches; GEMMs past eight
/// columns, plain and batched with broadcast on both batch dims; f16 activations on a mat-vec
/// and a GEMM; and an attention-style K * Q product (f16 K, permuted f32 Q, grouped heads).
fn gpu_paths(v: &mut Vec<Case>) {
    let mut weights = FLOATS.to_vec();
    weights.extend(DType::QUANTIZED);
    for &t in &weights {
        // (k, m, n, bs, nr)
        for (k, m, n, bs, nr) in [
            (256, 35, 1, [1, 1], [1, 1]),
            (512, 64, 3, [1, 1], [1, 1]),
            (256, 48, 8, [2, 1], [2, 1]),
            (768, 70, 33, [1, 1], [1, 1]),
            (256, 40, 20, [2, 1], [2, 2]),
        ] {
            v.push(
                MulMat {
                    bs,
                    nr,
                    ..MulMat::new(t, DType::F32, m, n, k)
                }
                .case(),
            );
        }
        for (k, m, n) in [(512, 64, 3), (768, 70, 33)] {
            v.push(MulMat::new(t, DType::F16, m, n, k).case());
        }
    }
    v.push(
        MulMat {
            bs: [2, 1],
            nr: [3, 1],
            per: [0, 2, 1, 3],
            ..MulMat::new(DType::F16, DType::F32, 40, 4, 64)
        }
        .case(),
    );
}
