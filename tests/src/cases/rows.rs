//! get_rows and set_rows cases.

use tessera_core::DType;

use super::{ne_str, FLOATS};
use crate::case::{Case, Tolerance};
use crate::init::Init;

/// get_rows from every float, integer and quantized type.
pub(super) fn get_rows(v: &mut Vec<Case>) {
    let mut types = FLOATS.to_vec();
    types.push(DType::I32);
    types.extend(DType::QUANTIZED);
    types.extend(DType::QUANTIZED_IQ);
    // (row length, rows, rows picked, batch); the odd lengths only for unblocked types.
    const SHAPES: [(usize, usize, usize, usize); 4] =
        [(256, 5, 3, 1), (256, 8, 10, 3), (10, 4, 7, 2), (1, 3, 4, 1)];
    for t in types {
        let shapes = if t.is_quantized() {
            &SHAPES[..2]
        } else {
            &SHAPES[..]
        };
        for &(n, m, r, b) in shapes {
            let tol = if t == DType::I32 {
                Tolerance::Exact
            } else {
                Tolerance::DEFAULT
            };
            let init = if t == DType::I32 {
                Init::Uniform(-1000.0, 1000.0)
            } else {
                Init::Uniform(-1.0, 1.0)
            };
            v.push(Case::new(
                "GET_ROWS",
                format!("type={t},n={n},m={m},r={r},b={b}"),
                &[t, DType::I32],
                tol,
                move |g| {
                    let a = g.input(t, &[n, m, b], init)?;
                    let idx = g.input(DType::I32, &[r, b], Init::Indices(m))?;
                    g.get_rows(a, idx)
                },
            ));
        }
    }
    // Token embeddings: a few rows picked from a longer table of a model's row width and type
    // (262144 rows in Gemma 3; fewer here, the indices spread over all of them).
    for (t, n) in [
        (DType::Q8_0, 640),
        (DType::Q5_0, 640),
        (DType::Q4_K, 1024),
        (DType::Q6_K, 1024),
    ] {
        let (m, r) = (3000, 7);
        v.push(Case::new(
            "GET_ROWS",
            format!("type={t},n={n},m={m},r={r},b=1"),
            &[t, DType::I32],
            Tolerance::DEFAULT,
            move |g| {
                let a = g.input(t, &[n, m], Init::Uniform(-1.0, 1.0))?;
                let idx = g.input(DType::I32, &[r], Init::Indices(m))?;
                g.get_rows(a, idx)
            },
        ));
    }
}

/// set_rows into float and quantized destinations, with i32 and i64 indices, indices
/// broadcast over dims 2-3.
pub(super) fn set_rows(v: &mut Vec<Case>) {
    let mut types = FLOATS.to_vec();
    types.extend([
        DType::Q4_0,
        DType::Q4_1,
        DType::Q5_0,
        DType::Q5_1,
        DType::Q8_0,
        DType::Q4_K,
        DType::Q6_K,
    ]);
    for t in types {
        for idx_t in [DType::I32, DType::I64] {
            // (row length, destination rows, rows written, dims 2-3, index dims 2-3)
            let mut shapes = vec![(256, 16, 5, [1, 1], [1, 1]), (256, 6, 3, [2, 3], [1, 3])];
            if t.block_size() < 256 {
                shapes.push((64, 10, 10, [2, 1], [2, 1]));
            }
            for (n, rows, m, b, ib) in shapes {
                let dst_n = n * rows * b[0] * b[1];
                let tol = if t.is_quantized() {
                    Tolerance::quantized(t, dst_n)
                } else {
                    Tolerance::DEFAULT
                };
                let params = format!(
                    "type={t},type_idx={idx_t},ne=[{n},{rows}],m={m},b={},ib={}",
                    ne_str(&b),
                    ne_str(&ib)
                );
                v.push(Case::new("SET_ROWS", params, &[t, idx_t], tol, move |g| {
                    let dst = g.input(t, &[n, rows, b[0], b[1]], Init::Uniform(-1.0, 1.0))?;
                    let src = g.leaf(DType::F32, &[n, m, b[0], b[1]])?;
                    let idx = g.input(idx_t, &[m, ib[0], ib[1]], Init::UniqueIndices(rows))?;
                    g.set_rows(dst, src, idx)
                }));
            }
        }
    }
}
