//! The case table, one module per op family, modelled on ggml's test-backend-ops: each op over
//! its types, shapes chosen to hit edge cases (odd sizes, one row, broadcasting, views), and the
//! few large cases that slow devices may skip.

mod attn;
mod binary;
mod copy;
mod fused;
mod gpt_oss;
mod matmul;
mod moe;
mod norm;
mod perf_only;
mod reduce;
mod rope;
mod rows;
mod shape;
mod softmax;
mod unary;
mod views;

use tessera_core::{DType, Result, TensorId};

use crate::case::{Case, CaseGraph};
use crate::init::Init;

/// Every test case, in a fixed order.
pub fn cases() -> Vec<Case> {
    let mut v = Vec::new();
    rows::get_rows(&mut v);
    rows::set_rows(&mut v);
    matmul::cases(&mut v);
    binary::cases(&mut v);
    unary::cases(&mut v);
    norm::cases(&mut v);
    softmax::cases(&mut v);
    rope::cases(&mut v);
    attn::cases(&mut v);
    copy::cases(&mut v);
    shape::cases(&mut v);
    reduce::cases(&mut v);
    views::cases(&mut v);
    fused::cases(&mut v);
    moe::cases(&mut v);
    gpt_oss::cases(&mut v);
    v
}

/// The perf table: every test case, then the perf-only cases (model-sized mul_mat, and
/// rms_norm, soft_max and rope at decode and prefill sizes; flash_attn_ext's model sizes are
/// large test cases).
pub fn perf_cases() -> Vec<Case> {
    let mut v = cases();
    perf_only::cases(&mut v);
    v
}

/// `[a,b,c]`, as ggml prints shapes.
pub(crate) fn ne_str(ne: &[usize]) -> String {
    let parts: Vec<String> = ne.iter().map(|n| n.to_string()).collect();
    format!("[{}]", parts.join(","))
}

/// The plain float types.
pub(crate) const FLOATS: [DType; 3] = [DType::F32, DType::F16, DType::BF16];

/// A leaf of logical shape `ne` reached through `permute(axes)` (a non-contiguous view when
/// `axes` is not the identity).
pub(crate) fn permuted(
    g: &mut CaseGraph,
    dtype: DType,
    ne: [usize; 4],
    axes: [usize; 4],
    init: Init,
) -> Result<TensorId> {
    if axes == [0, 1, 2, 3] {
        return g.input(dtype, &ne, init);
    }
    let stored = [ne[axes[0]], ne[axes[1]], ne[axes[2]], ne[axes[3]]];
    let leaf = g.input(dtype, &stored, init)?;
    g.permute(leaf, axes)
}

/// A leaf of shape `ne` seen through a view whose rows are `gap` elements further apart than
/// contiguous rows (a strided, non-contiguous view).
pub(crate) fn strided(
    g: &mut CaseGraph,
    dtype: DType,
    ne: [usize; 4],
    gap: usize,
    init: Init,
) -> Result<TensorId> {
    let wide = [ne[0] + gap, ne[1], ne[2], ne[3]];
    let leaf = g.input(dtype, &wide, init)?;
    let nb = g.get(leaf).nb;
    g.view(leaf, &ne, &nb[1..], 0)
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use tessera_core::Op;

    use super::*;

    #[test]
    fn every_case_builds_and_names_are_unique() {
        let all = perf_cases();
        let mut names = HashSet::new();
        let mut broken = Vec::new();
        for c in &all {
            assert!(names.insert(c.name()), "duplicate case {}", c.name());
            if let Err(e) = c.build() {
                broken.push(format!("{}: {e}", c.name()));
            }
        }
        assert!(
            broken.is_empty(),
            "{} cases do not build:\n{}",
            broken.len(),
            broken.join("\n")
        );
        assert!(cases().len() >= 500, "only {} cases", cases().len());
    }

    #[test]
    fn every_op_is_covered() {
        let mut seen = HashSet::new();
        for c in cases() {
            let Ok((g, _)) = c.build() else { continue };
            seen.extend(g.ids().map(|id| g.get(id).op.name()));
        }
        let probe = [
            Op::View,
            Op::Reshape,
            Op::Permute([0, 1, 2, 3]),
            Op::Transpose,
            Op::Cpy,
            Op::Cont,
            Op::Dup,
            Op::GetRows,
            Op::SetRows,
            Op::MulMat,
            Op::Sum,
            Op::SumRows,
            Op::Mean,
            Op::Argmax,
            Op::Repeat,
            Op::Concat(0),
            Op::Pad([0; 4]),
            Op::DiagMaskInf(0),
            Op::MulMatId { first: 0 },
            Op::AddId,
            Op::Argsort { descending: false },
            Op::TopK(1),
        ];
        for op in probe {
            assert!(seen.contains(op.name()), "no case uses {}", op.name());
        }
        for name in [
            "ADD",
            "SUB",
            "MUL",
            "DIV",
            "SCALE",
            "CLAMP",
            "SWIGLU",
            "GEGLU",
            "SWIGLU_OAI",
            "RMS_NORM",
            "NORM",
            "SOFT_MAX",
            "ROPE",
            "FLASH_ATTN_EXT",
            "ARANGE",
            "SQR",
            "GELU_ERF",
            "TANH",
        ] {
            assert!(seen.contains(name), "no case uses {name}");
        }
    }
}
