//! Perf-only cases (not in the test table): the model-sized products and the decode and
//! prefill sizes of the per-token ops that BENCHMARKS.md reports.

use tessera_core::{DType, GluOp, RopeMode, TensorId};

use super::matmul::MulMat;
use super::moe::{moe_glu, MulMatId};
use super::rope::Rope;
use super::softmax::SoftMax;
use crate::case::{Case, Tolerance};

/// Appends the perf-only cases.
pub(super) fn cases(v: &mut Vec<Case>) {
    // The types of the common files; Q4_K against the i-quants, MXFP4 and the ternary types
    // gives each one's share of the read bandwidth (GB/s at one column) beside the K type.
    let types = [
        DType::Q4_0,
        DType::Q8_0,
        DType::F16,
        DType::F32,
        DType::Q4_K,
        DType::IQ4_XS,
        DType::IQ4_NL,
        DType::MXFP4,
        DType::IQ3_S,
        DType::IQ2_XS,
        DType::TQ2_0,
    ];
    for t in types {
        for n in [1, 512] {
            v.push(MulMat::new(t, DType::F32, 4096, n, 14336).case().large());
        }
    }
    // A MoE layer's expert products at decode: Qwen3-30B-A3B's (8 of 128 experts; gate and up
    // 2048 -> 768 in Q4_K, down 768 -> 2048 in Q6_K, as its Q4_K_M file) and gpt-oss-20b's (4
    // of 32 MXFP4 experts of 2880), one by one and the gate/up/glu fused.
    for (type_a, n_mats, n_used, m, k) in [
        (DType::Q4_K, 128, 8, 768, 2048),
        (DType::Q6_K, 128, 8, 2048, 768),
        (DType::MXFP4, 32, 4, 2880, 2880),
    ] {
        v.push(
            MulMatId {
                type_a,
                type_b: DType::F32,
                n_mats,
                n_used,
                b: true,
                m,
                n: 1,
                k,
            }
            .case()
            .large(),
        );
    }
    v.push(moe_glu(DType::Q4_K, [2048, 768], 128, 8, 1, GluOp::Swiglu, 0).large());
    v.push(moe_glu(DType::MXFP4, [2880, 2880], 32, 4, 1, GluOp::Swiglu, 0).large());
    // The test model's output head (its Q8_0 token embedding, tied) for one token, and its
    // largest Q4_1 product (up).
    v.push(
        MulMat::new(DType::Q8_0, DType::F32, 49152, 1, 576)
            .case()
            .large(),
    );
    v.push(
        MulMat::new(DType::Q4_1, DType::F32, 1536, 1, 576)
            .case()
            .large(),
    );
    // A 512-token prompt's products in a Llama-8B block: K and V, Q and O, gate and up.
    for m in [1024, 4096, 14336] {
        v.push(
            MulMat::new(DType::Q4_0, DType::F32, m, 512, 4096)
                .case()
                .large(),
        );
    }
    for n in [1, 512] {
        v.push(
            Case::new(
                "RMS_NORM",
                format!("type=f32,ne=[4096,{n},1,1],eps=1e-5,v=perf"),
                &[DType::F32],
                Tolerance::DEFAULT,
                move |g| -> tessera_core::Result<TensorId> {
                    let a = g.leaf(DType::F32, &[4096, n])?;
                    g.rms_norm(a, 1e-5)
                },
            )
            .large(),
        );
    }
    // Decode: 32 heads, one query, 4096 keys; prefill: 512 queries over 512 keys.
    for ne in [[4096, 1, 32, 1], [512, 512, 32, 1]] {
        v.push(
            SoftMax {
                ne,
                mask: Some(DType::F16),
                mask_broadcast: true,
                scale: 0.088,
                max_bias: 0.0,
            }
            .case()
            .large(),
        );
    }
    for tokens in [1, 512] {
        let r = Rope::plain(
            DType::F32,
            [128, 32, tokens, 1],
            128,
            RopeMode::Normal,
            1.0,
            4096,
        );
        v.push(r.case().large());
        // Llama 3's: the same with frequency factors, to weigh them against the plain rotation.
        v.push(Rope { factors: true, ..r }.case().large());
    }
}
