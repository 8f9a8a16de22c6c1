//! View ops (view with an offset, reshape, permute, transpose) feeding computing ops.

use tessera_core::DType;

use crate::case::{Case, Tolerance};

/// Every case whose input reaches its op through view, reshape or transpose.
pub(super) fn cases(v: &mut Vec<Case>) {
    let f32 = DType::F32;
    for t in [DType::F32, DType::F16] {
        v.push(Case::new(
            "CONT",
            format!("type={t},ne=[7,10,3,1],v=transpose"),
            &[t],
            Tolerance::Exact,
            move |g| {
                let a = g.leaf(t, &[10, 7, 3])?;
                let tr = g.transpose(a)?;
                g.cont(tr)
            },
        ));
    }
    v.push(Case::new(
        "ADD",
        "type_a=f32,type_b=f32,ne=[10,6,5,1],v=reshape",
        &[f32],
        Tolerance::DEFAULT,
        move |g| {
            let a = g.leaf(f32, &[60, 5])?;
            let r = g.reshape(a, &[10, 6, 5])?;
            let b = g.leaf(f32, &[10, 1, 5])?;
            g.add(r, b)
        },
    ));
    v.push(Case::new(
        "MUL_MAT",
        "type_a=q4_0,type_b=f32,m=16,n=3,k=256,bs=[2,1],v=reshape",
        &[DType::Q4_0, f32],
        Tolerance::MATMUL,
        move |g| {
            let a = g.leaf(DType::Q4_0, &[256, 16, 2])?;
            let b = g.leaf(f32, &[256, 6])?;
            let r = g.reshape(b, &[256, 3, 2])?;
            g.mul_mat(a, r)
        },
    ));
    v.push(Case::new(
        "MUL_MAT",
        "type_a=f32,type_b=f32,m=9,n=5,k=12,v=transpose_cont",
        &[f32],
        Tolerance::MATMUL,
        move |g| {
            let a = g.leaf(f32, &[12, 9])?;
            let b = g.leaf(f32, &[5, 12])?;
            let bt = g.transpose(b)?;
            let bc = g.cont(bt)?;
            g.mul_mat(a, bc)
        },
    ));
    v.push(Case::new(
        "RMS_NORM",
        "type=f32,ne=[64,3,1,1],v=view_offset",
        &[f32],
        Tolerance::DEFAULT,
        move |g| {
            let a = g.leaf(f32, &[64, 5])?;
            let nb1 = g.get(a).nb[1];
            let rows = g.view(a, &[64, 3], &[nb1], nb1)?;
            g.rms_norm(rows, 1e-6)
        },
    ));
    v.push(Case::new(
        "SOFT_MAX",
        "type=f32,ne=[12,8,1,1],v=transpose_cont",
        &[f32],
        Tolerance::SOFT_MAX,
        move |g| {
            let a = g.leaf(f32, &[8, 12])?;
            let at = g.transpose(a)?;
            let c = g.cont(at)?;
            g.soft_max_ext(c, None, 1.0, 0.0)
        },
    ));
    v.push(Case::new(
        "GET_ROWS",
        "type=f32,n=32,m=6,r=4,b=1,v=view_offset",
        &[f32, DType::I32],
        Tolerance::DEFAULT,
        move |g| {
            let a = g.leaf(f32, &[32, 8])?;
            let nb1 = g.get(a).nb[1];
            let rows = g.view(a, &[32, 6], &[nb1], 2 * nb1)?;
            let idx = g.input(DType::I32, &[4], crate::Init::Indices(6))?;
            g.get_rows(rows, idx)
        },
    ));
}
