//! cpy (every float pair, float to every quantized type, quantized to f32, permuted,
//! transposed and strided sources and destinations), cont of permuted views, and dup.

use tessera_core::DType;

use super::{ne_str, permuted, FLOATS};
use crate::case::{Case, Tolerance};
use crate::init::Init;

/// How the cpy destination is laid out.
#[derive(Clone, Copy, PartialEq)]
enum Dst {
    /// A fresh contiguous tensor (poisoned; the copy overwrites all of it).
    Whole,
    /// A strided view into a wider tensor (the rest must be left alone).
    Strided,
    /// A permuted view.
    Permuted,
    /// A contiguous tensor of another shape with as many elements (half the row length).
    Reshaped,
}

fn cpy_case(src: DType, dst: DType, ne: [usize; 4], per_src: [usize; 4], d: Dst) -> Case {
    let tol = if src == dst {
        Tolerance::Exact
    } else if dst.is_quantized() {
        Tolerance::quantized(dst, ne.iter().product())
    } else {
        Tolerance::DEFAULT
    };
    let v = match d {
        Dst::Whole => "",
        Dst::Strided => ",dst=strided",
        Dst::Permuted => ",dst=permuted",
        Dst::Reshaped => ",dst=reshaped",
    };
    let params = format!(
        "type_src={src},type_dst={dst},ne={},per_src={}{v}",
        ne_str(&ne),
        ne_str(&per_src)
    );
    Case::new("CPY", params, &[src, dst], tol, move |g| {
        let a = permuted(g, src, ne, per_src, Init::Uniform(-1.0, 1.0))?;
        let b = match d {
            Dst::Whole => g.input(dst, &ne, Init::Poison)?,
            Dst::Strided => {
                let wide = g.leaf(dst, &[ne[0] + 5, ne[1], ne[2], ne[3]])?;
                let nb = g.get(wide).nb;
                g.view(wide, &ne, &nb[1..], 0)?
            }
            Dst::Permuted => permuted(g, dst, ne, [0, 2, 1, 3], Init::Poison)?,
            Dst::Reshaped => {
                let half = [ne[0] / 2, ne[1] * 2, ne[2], ne[3]];
                g.input(dst, &half, Init::Poison)?
            }
        };
        g.cpy(a, b)
    })
}

/// Every cpy, cont and dup case.
pub(super) fn cases(v: &mut Vec<Case>) {
    let id = [0, 1, 2, 3];
    for src in FLOATS {
        for dst in FLOATS {
            for ne in [[10, 10, 10, 1], [256, 2, 3, 2]] {
                v.push(cpy_case(src, dst, ne, id, Dst::Whole));
            }
            v.push(cpy_case(
                src,
                dst,
                [10, 10, 10, 1],
                [0, 2, 1, 3],
                Dst::Whole,
            ));
            v.push(cpy_case(src, dst, [64, 6, 1, 1], id, Dst::Reshaped));
        }
    }
    for (src, dst) in [
        (DType::F32, DType::F32),
        (DType::F32, DType::F16),
        (DType::F16, DType::F32),
        (DType::BF16, DType::F32),
    ] {
        v.push(cpy_case(src, dst, [10, 7, 3, 1], [1, 0, 2, 3], Dst::Whole));
    }
    for (src, dst) in [
        (DType::F32, DType::F32),
        (DType::F32, DType::F16),
        (DType::F16, DType::F32),
    ] {
        v.push(cpy_case(src, dst, [10, 10, 10, 1], id, Dst::Strided));
    }
    for (src, dst) in [(DType::F32, DType::F32), (DType::F32, DType::F16)] {
        v.push(cpy_case(src, dst, [10, 10, 10, 1], id, Dst::Permuted));
    }
    for q in DType::QUANTIZED {
        v.push(cpy_case(DType::F32, q, [256, 4, 3, 1], id, Dst::Whole));
        v.push(cpy_case(q, DType::F32, [256, 4, 3, 1], id, Dst::Whole));
    }
    // The newer types: all are read, and all but the lattice i-quants written (those that
    // tessera writes are a grid search on the CPU, as llama-quantize's, not a copy any GPU
    // runs: core/tests/quant_reference.rs checks them against ggml's bytes).
    for q in DType::QUANTIZED_IQ {
        if tessera_core::quant::can_quantize(q) && !tessera_core::quant::is_lattice(q) {
            v.push(cpy_case(DType::F32, q, [256, 4, 3, 1], id, Dst::Whole));
        }
        v.push(cpy_case(q, DType::F32, [256, 4, 3, 1], id, Dst::Whole));
    }
    for (src, dst) in [
        (DType::F16, DType::Q4_0),
        (DType::F16, DType::Q8_0),
        (DType::F16, DType::Q4_K),
        (DType::BF16, DType::Q8_0),
    ] {
        v.push(cpy_case(src, dst, [256, 4, 3, 1], id, Dst::Whole));
    }
    v.push(cpy_case(
        DType::F32,
        DType::Q8_0,
        [256, 4, 3, 1],
        [0, 2, 1, 3],
        Dst::Whole,
    ));
    cont_dup(v);
}

fn cont_dup(v: &mut Vec<Case>) {
    for t in FLOATS {
        for per in [
            [1, 0, 2, 3],
            [0, 2, 1, 3],
            [2, 0, 1, 3],
            [0, 1, 3, 2],
            [3, 2, 1, 0],
        ] {
            let ne = [10, 7, 5, 3];
            let params = format!("type={t},ne={},per={}", ne_str(&ne), ne_str(&per));
            v.push(Case::new(
                "CONT",
                params,
                &[t],
                Tolerance::Exact,
                move |g| {
                    let a = permuted(g, t, ne, per, Init::Uniform(-1.0, 1.0))?;
                    g.cont(a)
                },
            ));
        }
    }
    for t in [DType::Q4_0, DType::Q8_0] {
        let ne = [256, 4, 3, 1];
        v.push(Case::new(
            "CONT",
            format!("type={t},ne={},per=[0,2,1,3]", ne_str(&ne)),
            &[t],
            Tolerance::Exact,
            move |g| {
                let a = permuted(g, t, ne, [0, 2, 1, 3], Init::Uniform(-1.0, 1.0))?;
                g.cont(a)
            },
        ));
    }
    let mut dup_types = FLOATS.to_vec();
    dup_types.extend([DType::I32, DType::Q4_0, DType::Q8_0]);
    for t in dup_types {
        let ne = [256, 3, 2, 1];
        let init = if t == DType::I32 {
            Init::Uniform(-1000.0, 1000.0)
        } else {
            Init::Uniform(-1.0, 1.0)
        };
        v.push(Case::new(
            "DUP",
            format!("type={t},ne={}", ne_str(&ne)),
            &[t],
            Tolerance::Exact,
            move |g| {
                let a = g.input(t, &ne, init)?;
                g.dup(a)
            },
        ));
    }
    for t in [DType::F32, DType::F16] {
        let ne = [10, 7, 5, 3];
        v.push(Case::new(
            "DUP",
            format!("type={t},ne={},per=[0,2,1,3]", ne_str(&ne)),
            &[t],
            Tolerance::Exact,
            move |g| {
                let a = permuted(g, t, ne, [0, 2, 1, 3], Init::Uniform(-1.0, 1.0))?;
                g.dup(a)
            },
        ));
    }
}
