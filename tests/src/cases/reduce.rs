//! sum, sum_rows, mean and argmax, over contiguous and non-contiguous inputs.

use tessera_core::{DType, Result, TensorId};

use super::{ne_str, permuted, strided, FLOATS};
use crate::case::{Case, CaseGraph, Tolerance};
use crate::init::Init;

/// A row reduction's builder.
type RowFn = fn(&mut CaseGraph, TensorId) -> Result<TensorId>;

/// Every reduction case.
pub(super) fn cases(v: &mut Vec<Case>) {
    let u = Init::Uniform(-1.0, 1.0);
    // [1000, 100]: more values than one block of a GPU's sum takes.
    for t in FLOATS {
        for ne in [[10, 5, 4, 3], [1000, 3, 1, 1], [1000, 100, 1, 1]] {
            v.push(Case::new(
                "SUM",
                format!("type={t},ne={}", ne_str(&ne)),
                &[t],
                Tolerance::DEFAULT,
                move |g| {
                    let a = g.leaf(t, &ne)?;
                    g.sum(a)
                },
            ));
        }
    }
    v.push(Case::new(
        "SUM",
        "type=f32,ne=[10,5,4,3],per=[0,2,1,3]",
        &[DType::F32],
        Tolerance::DEFAULT,
        move |g| {
            let a = permuted(g, DType::F32, [10, 5, 4, 3], [0, 2, 1, 3], u)?;
            g.sum(a)
        },
    ));
    let ops: [(&'static str, RowFn); 2] = [
        ("SUM_ROWS", |g, a| g.sum_rows(a)),
        ("MEAN", |g, a| g.mean(a)),
    ];
    for (name, f) in ops {
        for ne in [[10, 5, 4, 3], [1000, 3, 1, 1], [33, 1, 1, 1]] {
            v.push(Case::new(
                name,
                format!("type=f32,ne={}", ne_str(&ne)),
                &[DType::F32],
                Tolerance::DEFAULT,
                move |g| {
                    let a = g.leaf(DType::F32, &ne)?;
                    f(g, a)
                },
            ));
        }
        v.push(Case::new(
            name,
            "type=f32,ne=[10,5,4,3],per=[0,2,1,3]",
            &[DType::F32],
            Tolerance::DEFAULT,
            move |g| {
                let a = permuted(g, DType::F32, [10, 5, 4, 3], [0, 2, 1, 3], u)?;
                f(g, a)
            },
        ));
        v.push(Case::new(
            name,
            "type=f32,ne=[64,5,3,1],v=strided",
            &[DType::F32],
            Tolerance::DEFAULT,
            move |g| {
                let a = strided(g, DType::F32, [64, 5, 3, 1], 7, u)?;
                f(g, a)
            },
        ));
    }
    // [50000, 3]: rows longer than a GPU block's threads take in one pass.
    for ne in [[32, 10], [100, 7], [1024, 12], [5, 1], [50000, 3]] {
        v.push(Case::new(
            "ARGMAX",
            format!("type=f32,ne={}", ne_str(&ne)),
            &[DType::F32, DType::I32],
            Tolerance::Exact,
            move |g| {
                let a = g.leaf(DType::F32, &ne)?;
                g.argmax(a)
            },
        ));
    }
    v.push(Case::new(
        "ARGMAX",
        "type=f32,ne=[64,5],v=strided",
        &[DType::F32, DType::I32],
        Tolerance::Exact,
        move |g| {
            let a = strided(g, DType::F32, [64, 5, 1, 1], 3, u)?;
            g.argmax(a)
        },
    ));
}
