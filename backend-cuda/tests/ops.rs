//! Every op on the GPU against a host computation on random inputs. Each test prints
//! "skipped: <reason>" and passes when no CUDA device is present.

mod common;

use common::*;
use tessera_core::dtype::DType;
use tessera_core::quant::vec_dot_f32;
use tessera_core::{BinaryOp, GluOp, Graph, RopeMode, RopeParams, UnaryOp};

fn unary_ref(op: UnaryOp, x: f32) -> f32 {
    match op {
        UnaryOp::Sqr => x * x,
        UnaryOp::Sqrt => x.sqrt(),
        UnaryOp::Neg => -x,
        UnaryOp::Abs => x.abs(),
        UnaryOp::Exp => x.exp(),
        UnaryOp::Log => x.ln(),
        UnaryOp::Sin => x.sin(),
        UnaryOp::Cos => x.cos(),
        UnaryOp::Relu => x.max(0.0),
        UnaryOp::Gelu => 0.5 * x * (1.0 + (0.797_884_6 * x * (1.0 + 0.044715 * x * x)).tanh()),
        UnaryOp::GeluErf => 0.5 * x * (1.0 + libm_erf(x / std::f32::consts::SQRT_2)),
        UnaryOp::Silu => x / (1.0 + (-x).exp()),
        UnaryOp::Sigmoid => 1.0 / (1.0 + (-x).exp()),
        UnaryOp::Tanh => x.tanh(),
    }
}

/// erf by its series / continued fraction (enough for a reference at 1e-7).
fn libm_erf(x: f32) -> f32 {
    let x = f64::from(x);
    let t = x.abs();
    let r = if t < 2.5 {
        let mut sum = t;
        let mut term = t;
        let mut n = 0.0;
        loop {
            n += 1.0;
            term *= -t * t / n;
            let add = term / (2.0 * n + 1.0);
            sum += add;
            if add.abs() < 1e-17 {
                break;
            }
        }
        sum * 2.0 / std::f64::consts::PI.sqrt()
    } else {
        // erfc continued fraction
        let mut f = 0.0;
        for k in (1..60).rev() {
            f = f64::from(k) / 2.0 / (t + f);
        }
        1.0 - (-t * t).exp() / std::f64::consts::PI.sqrt() / (t + f)
    };
    (if x < 0.0 { -r } else { r }) as f32
}

#[test]
fn unary_scale_clamp() {
    let Some(dev) = cuda() else { return };
    let mut be = concrete(&dev).cuda_backend().unwrap();
    let mut rng = Rng::new(1);
    for dt in [DType::F32, DType::F16, DType::BF16] {
        for op in UnaryOp::ALL {
            let (lo, hi) = if matches!(op, UnaryOp::Sqrt | UnaryOp::Log) {
                (0.1, 3.0)
            } else {
                (-3.0, 3.0)
            };
            let x = rounded(dt, &rng.vec(4 * 33 * 3, lo, hi));
            let mut g = Graph::new();
            let a = g.input("a", dt, &[33, 4, 3]).unwrap();
            let y = g.unary(a, op).unwrap();
            let out = run(&dev, &mut be, &mut g, &[(a, to_bytes(dt, &x))], &[y]);
            let r: Vec<f32> = rounded(dt, &x.iter().map(|&v| unary_ref(op, v)).collect::<Vec<_>>());
            let max = if dt == DType::F32 { 1e-7 } else { 1e-4 };
            check(
                &format!("{} {}", op.name(), dt.name()),
                &from_bytes(dt, &out[0], x.len()),
                &r,
                max,
            );
        }
        let x = rounded(dt, &rng.vec(1000, -2.0, 2.0));
        let mut g = Graph::new();
        let a = g.input("a", dt, &[1000]).unwrap();
        let s = g.scale_bias(a, 0.75, -0.5).unwrap();
        let c = g.clamp(a, -0.5, 1.0).unwrap();
        let out = run(&dev, &mut be, &mut g, &[(a, to_bytes(dt, &x))], &[s, c]);
        let rs = rounded(dt, &x.iter().map(|&v| v * 0.75 - 0.5).collect::<Vec<_>>());
        let rc = rounded(
            dt,
            &x.iter().map(|&v| v.clamp(-0.5, 1.0)).collect::<Vec<_>>(),
        );
        check(
            &format!("scale {}", dt.name()),
            &from_bytes(dt, &out[0], 1000),
            &rs,
            1e-6,
        );
        check(
            &format!("clamp {}", dt.name()),
            &from_bytes(dt, &out[1], 1000),
            &rc,
            0.0,
        );
    }
}

#[test]
fn binary_broadcast_and_strided() {
    let Some(dev) = cuda() else { return };
    let mut be = concrete(&dev).cuda_backend().unwrap();
    let mut rng = Rng::new(2);
    let ops = [BinaryOp::Add, BinaryOp::Sub, BinaryOp::Mul, BinaryOp::Div];
    for (ta, tb) in [
        (DType::F32, DType::F32),
        (DType::F32, DType::F16),
        (DType::F16, DType::F32),
        (DType::BF16, DType::BF16),
    ] {
        for op in ops {
            for bne in [[16, 5, 3, 2], [16, 1, 1, 1], [1, 5, 1, 2], [16, 5, 1, 1]] {
                let ha = Host::new([16, 5, 3, 2], rounded(ta, &rng.vec(480, -2.0, 2.0)));
                let hb = Host::new(bne, rounded(tb, &rng.vec(bne.iter().product(), 0.5, 2.0)));
                let mut g = Graph::new();
                let a = g.input("a", ta, &ha.ne).unwrap();
                let b = g.input("b", tb, &hb.ne).unwrap();
                let y = g.binary_for_test(op, a, b);
                let out = run(
                    &dev,
                    &mut be,
                    &mut g,
                    &[(a, to_bytes(ta, &ha.v)), (b, to_bytes(tb, &hb.v))],
                    &[y],
                );
                let r: Vec<f32> = Host::coords(ha.ne)
                    .map(|c| {
                        let x = ha.get(c);
                        let z =
                            hb.get([c[0] % bne[0], c[1] % bne[1], c[2] % bne[2], c[3] % bne[3]]);
                        match op {
                            BinaryOp::Add => x + z,
                            BinaryOp::Sub => x - z,
                            BinaryOp::Mul => x * z,
                            BinaryOp::Div => x / z,
                        }
                    })
                    .collect();
                let max = if ta == DType::F32 { 1e-7 } else { 1e-4 };
                check(
                    &format!("{} {}x{} {:?}", op.name(), ta.name(), tb.name(), bne),
                    &from_bytes(ta, &out[0], 480),
                    &rounded(ta, &r),
                    max,
                );
            }
        }
    }
    // A permuted (non-contiguous) first operand.
    let ha = Host::random(&mut rng, [8, 6, 4, 1], -1.0, 1.0);
    let hb = Host::random(&mut rng, [6, 8, 4, 1], -1.0, 1.0);
    let mut g = Graph::new();
    let a = g.input("a", DType::F32, &ha.ne).unwrap();
    let b = g.input("b", DType::F32, &hb.ne).unwrap();
    let at = g.transpose(a).unwrap();
    let y = g.add(at, b).unwrap();
    let out = run(
        &dev,
        &mut be,
        &mut g,
        &[
            (a, to_bytes(DType::F32, &ha.v)),
            (b, to_bytes(DType::F32, &hb.v)),
        ],
        &[y],
    );
    let t = ha.permute([1, 0, 2, 3]);
    let r: Vec<f32> = t.v.iter().zip(&hb.v).map(|(x, z)| x + z).collect();
    check(
        "add transposed",
        &from_bytes(DType::F32, &out[0], r.len()),
        &r,
        1e-7,
    );
}

/// Graph::binary is private; pick the public method by op.
trait BinaryForTest {
    fn binary_for_test(
        &mut self,
        op: BinaryOp,
        a: tessera_core::TensorId,
        b: tessera_core::TensorId,
    ) -> tessera_core::TensorId;
}
impl BinaryForTest for Graph {
    fn binary_for_test(
        &mut self,
        op: BinaryOp,
        a: tessera_core::TensorId,
        b: tessera_core::TensorId,
    ) -> tessera_core::TensorId {
        match op {
            BinaryOp::Add => self.add(a, b),
            BinaryOp::Sub => self.sub(a, b),
            BinaryOp::Mul => self.mul(a, b),
            BinaryOp::Div => self.div(a, b),
        }
        .unwrap()
    }
}

#[test]
fn copies_and_conversions() {
    let Some(dev) = cuda() else { return };
    let mut be = concrete(&dev).cuda_backend().unwrap();
    let mut rng = Rng::new(3);
    let floats = [DType::F32, DType::F16, DType::BF16];
    // Float to float, same shape and reshaped, and a transposed cont.
    for from in floats {
        for to in floats {
            let x = rounded(from, &rng.vec(64 * 6, -4.0, 4.0));
            let mut g = Graph::new();
            let a = g.input("a", from, &[64, 6]).unwrap();
            let b = g.input("b", to, &[64, 6]).unwrap();
            let c = g.cpy(a, b).unwrap();
            let b2 = g.input("b2", to, &[32, 12]).unwrap();
            let c2 = g.cpy(a, b2).unwrap();
            let at = g.transpose(a).unwrap();
            let ct = g.cont(at).unwrap();
            let out = run(
                &dev,
                &mut be,
                &mut g,
                &[
                    (a, to_bytes(from, &x)),
                    (b, to_bytes(to, &vec![0.0; 384])),
                    (b2, to_bytes(to, &vec![0.0; 384])),
                ],
                &[c, c2, ct],
            );
            let r = rounded(to, &x);
            check(
                &format!("cpy {}->{}", from.name(), to.name()),
                &from_bytes(to, &out[0], 384),
                &r,
                0.0,
            );
            check(
                &format!("cpy reshaped {}->{}", from.name(), to.name()),
                &from_bytes(to, &out[1], 384),
                &r,
                0.0,
            );
            let tr = Host::new([64, 6, 1, 1], x.clone()).permute([1, 0, 2, 3]);
            check(
                &format!("cont transposed {}", from.name()),
                &from_bytes(from, &out[2], 384),
                &tr.v,
                0.0,
            );
        }
    }
    // Float into the quantized types: bit-exact with the host quantizer.
    for q in [
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
    ] {
        let x = rng.vec(256 * 3, -1.0, 1.0);
        let mut g = Graph::new();
        let a = g.input("a", DType::F32, &[256, 3]).unwrap();
        let b = g.input("b", q, &[256, 3]).unwrap();
        let c = g.cpy(a, b).unwrap();
        let out = run(
            &dev,
            &mut be,
            &mut g,
            &[
                (a, to_bytes(DType::F32, &x)),
                (b, vec![0u8; q.row_size(768).unwrap()]),
            ],
            &[c],
        );
        let want = to_bytes(q, &x);
        let diff = out[0].iter().zip(&want).filter(|(a, b)| a != b).count();
        // Which fields differ says which step went wrong (super-scale, scales, quants).
        let ts = q.type_size();
        let differing = out[0]
            .iter()
            .zip(&want)
            .enumerate()
            .filter(|(_, (o, w))| o != w);
        for (i, (o, w)) in differing.take(8) {
            eprintln!(
                "{} block {} byte {}: {o:#04x}, host {w:#04x}",
                q.name(),
                i / ts,
                i % ts
            );
        }
        // Q8_0's host quantizer may use SIMD arithmetic: allow a rare last-bit difference there.
        let dec = from_bytes(q, &out[0], 768);
        check(
            &format!("quantize f32->{} ({diff} bytes differ)", q.name()),
            &dec,
            &from_bytes(q, &want, 768),
            if q == DType::Q8_0 { 1e-6 } else { 0.0 },
        );
    }
    // Every quantized type back to f32, and same-type copies of quantized rows.
    for q in DType::QUANTIZED {
        let x = rng.vec(512 * 2, -1.0, 1.0);
        let qb = to_bytes(q, &x);
        let mut g = Graph::new();
        let a = g.input("a", q, &[512, 2]).unwrap();
        // The destination is an input so that its memory is kept (the allocator pins a view's
        // root only when the root itself is flagged).
        let b = g.input("b", DType::F32, &[512, 2]).unwrap();
        let f = g.cpy(a, b).unwrap();
        let d = g.dup(a).unwrap();
        let out = run(
            &dev,
            &mut be,
            &mut g,
            &[(a, qb.clone()), (b, vec![0u8; 4096])],
            &[f, d],
        );
        check(
            &format!("dequantize {}", q.name()),
            &from_bytes(DType::F32, &out[0], 1024),
            &from_bytes(q, &qb, 1024),
            0.0,
        );
        assert_eq!(out[1], qb, "dup {}", q.name());
    }
    // i32 same-type copy, strided.
    let xi: Vec<f32> = (0..60).map(|i| i as f32 - 20.0).collect();
    let mut g = Graph::new();
    let a = g.input("a", DType::I32, &[6, 10]).unwrap();
    let at = g.transpose(a).unwrap();
    let c = g.cont(at).unwrap();
    let out = run(
        &dev,
        &mut be,
        &mut g,
        &[(a, to_bytes(DType::I32, &xi))],
        &[c],
    );
    let want = Host::new([6, 10, 1, 1], xi).permute([1, 0, 2, 3]);
    assert_eq!(
        i32s(&out[0]),
        want.v.iter().map(|&v| v as i32).collect::<Vec<_>>()
    );
    println!("ok cont i32 transposed");
}

#[test]
fn get_rows_and_set_rows() {
    let Some(dev) = cuda() else { return };
    let mut be = concrete(&dev).cuda_backend().unwrap();
    let mut rng = Rng::new(4);
    let mut types = vec![DType::F32, DType::F16, DType::BF16];
    types.extend(DType::QUANTIZED);
    for dt in types {
        let (n, rows, b2) = (256, 7, 2);
        let x = rng.vec(n * rows * b2, -1.0, 1.0);
        let bytes = to_bytes(dt, &x);
        let vals = from_bytes(dt, &bytes, x.len());
        let idx: Vec<f32> = vec![3.0, 0.0, 6.0, 3.0, 1.0, 5.0];
        let mut g = Graph::new();
        let a = g.input("a", dt, &[n, rows, b2]).unwrap();
        let i = g.input("i", DType::I32, &[3, b2]).unwrap();
        let y = g.get_rows(a, i).unwrap();
        let out = run(
            &dev,
            &mut be,
            &mut g,
            &[(a, bytes), (i, to_bytes(DType::I32, &idx))],
            &[y],
        );
        let mut r = Vec::new();
        for j2 in 0..b2 {
            for j in 0..3 {
                let row = idx[j2 * 3 + j] as usize;
                r.extend_from_slice(&vals[(j2 * rows + row) * n..(j2 * rows + row + 1) * n]);
            }
        }
        check(
            &format!("get_rows {}", dt.name()),
            &from_bytes(DType::F32, &out[0], r.len()),
            &r,
            0.0,
        );
    }
    for dt in [
        DType::F32,
        DType::F16,
        DType::BF16,
        DType::Q4_0,
        DType::Q4_1,
        DType::Q5_0,
        DType::Q5_1,
        DType::Q8_0,
    ] {
        for it in [DType::I32, DType::I64] {
            let (n, rows) = (64, 9);
            let base = rng.vec(n * rows, -1.0, 1.0);
            let src = rng.vec(n * 3, -1.0, 1.0);
            let idx = [7i64, 2, 4];
            let idx_bytes: Vec<u8> = if it == DType::I32 {
                idx.iter().flat_map(|&v| (v as i32).to_le_bytes()).collect()
            } else {
                idx.iter().flat_map(|&v| v.to_le_bytes()).collect()
            };
            let mut g = Graph::new();
            let a = g.input("a", dt, &[n, rows]).unwrap();
            let b = g.input("b", DType::F32, &[n, 3]).unwrap();
            let i = g.input("i", it, &[3]).unwrap();
            let y = g.set_rows(a, b, i).unwrap();
            let out = run(
                &dev,
                &mut be,
                &mut g,
                &[
                    (a, to_bytes(dt, &base)),
                    (b, to_bytes(DType::F32, &src)),
                    (i, idx_bytes),
                ],
                &[y],
            );
            let mut want = base.clone();
            for (j, &r) in idx.iter().enumerate() {
                want[r as usize * n..(r as usize + 1) * n]
                    .copy_from_slice(&src[j * n..(j + 1) * n]);
            }
            let want_bytes = to_bytes(dt, &want);
            check(
                &format!("set_rows {} {}", dt.name(), it.name()),
                &from_bytes(dt, &out[0], n * rows),
                &from_bytes(dt, &want_bytes, n * rows),
                if dt == DType::Q8_0 { 1e-6 } else { 0.0 },
            );
        }
    }
}

/// out[m, n, b2, b3] = sum_k a[k, m, b2 / r2, b3 / r3] b[k, n, b2, b3] with a dequantized.
fn matmul_ref(at: DType, abytes: &[u8], ane: [usize; 4], b: &Host) -> Vec<f32> {
    let (k, m) = (ane[0], ane[1]);
    let rs = at.row_size(k).unwrap();
    let (r2, r3) = (b.ne[2] / ane[2], b.ne[3] / ane[3]);
    let mut out = Vec::new();
    for i3 in 0..b.ne[3] {
        for i2 in 0..b.ne[2] {
            for j in 0..b.ne[1] {
                let col: Vec<f32> = (0..k).map(|x| b.get([x, j, i2, i3])).collect();
                for i in 0..m {
                    let row = ((i3 / r3) * ane[2] + i2 / r2) * m + i;
                    out.push(vec_dot_f32(at, k, &abytes[row * rs..(row + 1) * rs], &col));
                }
            }
        }
    }
    out
}

#[test]
fn mul_mat_all_paths() {
    let Some(dev) = cuda() else { return };
    let mut be = concrete(&dev).cuda_backend().unwrap();
    let mut rng = Rng::new(5);
    let mut types = vec![DType::F32, DType::F16, DType::BF16];
    types.extend(DType::QUANTIZED);
    for at in types {
        for bt in [DType::F32, DType::F16] {
            for (k, m, n, ab, bb) in [
                (256usize, 35usize, 1usize, [1usize, 1], [1usize, 1]),
                (512, 64, 3, [1, 1], [1, 1]),
                (256, 48, 8, [2, 1], [4, 1]),
                (768, 70, 33, [1, 1], [1, 1]),
                (256, 40, 20, [2, 1], [4, 2]),
            ] {
                if bt == DType::F16 && n != 3 && n != 33 {
                    continue;
                }
                let ane = [k, m, ab[0], ab[1]];
                let x = rng.vec(ane.iter().product(), -1.0, 1.0);
                let abytes = to_bytes(at, &x);
                let hb = Host::new(
                    [k, n, bb[0], bb[1]],
                    rounded(bt, &rng.vec(k * n * bb[0] * bb[1], -1.0, 1.0)),
                );
                let mut g = Graph::new();
                let a = g.input("a", at, &ane).unwrap();
                let b = g.input("b", bt, &hb.ne).unwrap();
                let y = g.mul_mat(a, b).unwrap();
                let out = run(
                    &dev,
                    &mut be,
                    &mut g,
                    &[(a, abytes.clone()), (b, to_bytes(bt, &hb.v))],
                    &[y],
                );
                let r = matmul_ref(at, &abytes, ane, &hb);
                check(
                    &format!(
                        "mul_mat {}x{} k={k} m={m} n={n} a{ab:?} b{bb:?}",
                        at.name(),
                        bt.name()
                    ),
                    &from_bytes(DType::F32, &out[0], r.len()),
                    &r,
                    5e-4,
                );
            }
        }
    }
    // Permuted src1 (attention-style KQ product with GQA broadcast).
    let kx = Host::random(&mut rng, [64, 40, 2, 1], -1.0, 1.0);
    let qx = Host::random(&mut rng, [64, 4, 6, 1], -1.0, 1.0);
    let mut g = Graph::new();
    let k = g.input("k", DType::F16, &kx.ne).unwrap();
    let q0 = g.input("q", DType::F32, &[64, 6, 4, 1]).unwrap();
    let q = g.permute(q0, [0, 2, 1, 3]).unwrap();
    let y = g.mul_mat(k, q).unwrap();
    let qperm = qx.permute([0, 2, 1, 3]);
    let out = run(
        &dev,
        &mut be,
        &mut g,
        &[
            (k, to_bytes(DType::F16, &kx.v)),
            (q0, to_bytes(DType::F32, &qperm.v)),
        ],
        &[y],
    );
    let r = matmul_ref(DType::F16, &to_bytes(DType::F16, &kx.v), kx.ne, &qx);
    check(
        "mul_mat f16 x permuted f32, broadcast",
        &from_bytes(DType::F32, &out[0], r.len()),
        &r,
        5e-4,
    );
}

#[test]
fn norms_softmax_masks() {
    let Some(dev) = cuda() else { return };
    let mut be = concrete(&dev).cuda_backend().unwrap();
    let mut rng = Rng::new(6);
    for n in [64usize, 1000, 4096] {
        let h = Host::random(&mut rng, [n, 5, 2, 1], -2.0, 2.0);
        let mut g = Graph::new();
        let a = g.input("a", DType::F32, &h.ne).unwrap();
        let r1 = g.rms_norm(a, 1e-5).unwrap();
        let r2 = g.norm(a, 1e-5).unwrap();
        let out = run(
            &dev,
            &mut be,
            &mut g,
            &[(a, to_bytes(DType::F32, &h.v))],
            &[r1, r2],
        );
        let (mut w1, mut w2) = (Vec::new(), Vec::new());
        for row in h.v.chunks(n) {
            let ms = row
                .iter()
                .map(|&x| f64::from(x) * f64::from(x))
                .sum::<f64>()
                / n as f64;
            let s = 1.0 / (ms + 1e-5).sqrt();
            w1.extend(row.iter().map(|&x| (f64::from(x) * s) as f32));
            let mean = row.iter().map(|&x| f64::from(x)).sum::<f64>() / n as f64;
            let var = row
                .iter()
                .map(|&x| (f64::from(x) - mean).powi(2))
                .sum::<f64>()
                / n as f64;
            let s = 1.0 / (var + 1e-5).sqrt();
            w2.extend(row.iter().map(|&x| ((f64::from(x) - mean) * s) as f32));
        }
        check(
            &format!("rms_norm {n}"),
            &from_bytes(DType::F32, &out[0], w1.len()),
            &w1,
            1e-7,
        );
        check(
            &format!("norm {n}"),
            &from_bytes(DType::F32, &out[1], w2.len()),
            &w2,
            1e-7,
        );
    }
    // soft_max with scale, f16 and f32 masks broadcast over heads, and ALiBi.
    for (mt, max_bias) in [
        (None, 0.0f32),
        (Some(DType::F16), 0.0),
        (Some(DType::F32), 0.0),
        (Some(DType::F16), 8.0),
    ] {
        let (n0, n1, h) = (100usize, 6usize, 4usize);
        let x = Host::random(&mut rng, [n0, n1, h, 1], -3.0, 3.0);
        let mut mask = Host::random(&mut rng, [n0, n1 + 2, 1, 1], -1.0, 0.0);
        for i in 0..n1 + 2 {
            for j in 0..n0 {
                if j > 50 + i * 7 {
                    mask.set([j, i, 0, 0], f32::NEG_INFINITY);
                }
            }
        }
        let mut g = Graph::new();
        let a = g.input("a", DType::F32, &x.ne).unwrap();
        let mut inputs = vec![(a, to_bytes(DType::F32, &x.v))];
        let m = mt.map(|t| {
            let m = g.input("m", t, &mask.ne).unwrap();
            inputs.push((m, to_bytes(t, &mask.v)));
            m
        });
        let y = g.soft_max_ext(a, m, 0.7, max_bias).unwrap();
        let out = run(&dev, &mut be, &mut g, &inputs, &[y]);
        let mv = mt.map(|t| Host::new(mask.ne, rounded(t, &mask.v)));
        let nl = 1usize << (usize::BITS - 1 - h.leading_zeros());
        let (m0, m1) = (
            2f32.powf(-max_bias / nl as f32),
            2f32.powf(-(max_bias / 2.0) / nl as f32),
        );
        let mut r = Vec::new();
        for hh in 0..h {
            let slope = if max_bias > 0.0 {
                if hh < nl {
                    m0.powi(hh as i32 + 1)
                } else {
                    m1.powi(2 * (hh - nl) as i32 + 1)
                }
            } else {
                1.0
            };
            for i in 0..n1 {
                let row: Vec<f64> = (0..n0)
                    .map(|j| {
                        f64::from(x.get([j, i, hh, 0]) * 0.7)
                            + mv.as_ref()
                                .map_or(0.0, |m| f64::from(slope * m.get([j, i, 0, 0])))
                    })
                    .collect();
                let mx = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let s: f64 = row.iter().map(|v| (v - mx).exp()).sum();
                r.extend(row.iter().map(|v| ((v - mx).exp() / s) as f32));
            }
        }
        check(
            &format!("soft_max mask {mt:?} max_bias {max_bias}"),
            &from_bytes(DType::F32, &out[0], r.len()),
            &r,
            1e-6,
        );
    }
    let x = Host::random(&mut rng, [10, 7, 2, 1], -1.0, 1.0);
    let mut g = Graph::new();
    let a = g.input("a", DType::F32, &x.ne).unwrap();
    let y = g.diag_mask_inf(a, 2).unwrap();
    let out = run(
        &dev,
        &mut be,
        &mut g,
        &[(a, to_bytes(DType::F32, &x.v))],
        &[y],
    );
    let r: Vec<f32> = Host::coords(x.ne)
        .map(|c| {
            if c[0] > 2 + c[1] {
                f32::NEG_INFINITY
            } else {
                x.get(c)
            }
        })
        .collect();
    check(
        "diag_mask_inf",
        &from_bytes(DType::F32, &out[0], r.len()),
        &r,
        0.0,
    );
}

fn rope_ref(x: &Host, pos: &[i32], p: &RopeParams) -> Host {
    let mut out = x.clone();
    let ts = p.freq_base.powf(-2.0 / p.n_dims as f32);
    for c in Host::coords([x.ne[0] / 2, x.ne[1], x.ne[2], x.ne[3]]) {
        let k = c[0];
        if 2 * k >= p.n_dims {
            continue;
        }
        let (ia, ib) = match p.mode {
            RopeMode::Normal => (2 * k, 2 * k + 1),
            RopeMode::Neox => (k, k + p.n_dims / 2),
        };
        let mut t = pos[c[2]] as f32;
        for _ in 0..k {
            t *= ts;
        }
        let theta = p.freq_scale * t;
        let (s, co) = theta.sin_cos();
        let x0 = x.get([ia, c[1], c[2], c[3]]);
        let x1 = x.get([ib, c[1], c[2], c[3]]);
        out.set([ia, c[1], c[2], c[3]], x0 * co - x1 * s);
        out.set([ib, c[1], c[2], c[3]], x0 * s + x1 * co);
    }
    out
}

#[test]
fn rope_glu() {
    let Some(dev) = cuda() else { return };
    let mut be = concrete(&dev).cuda_backend().unwrap();
    let mut rng = Rng::new(7);
    for dt in [DType::F32, DType::F16] {
        for mode in [RopeMode::Normal, RopeMode::Neox] {
            for n_dims in [64usize, 32] {
                let x = Host::new([64, 4, 5, 1], rounded(dt, &rng.vec(64 * 20, -1.0, 1.0)));
                let pos = [0i32, 7, 100, 511, 4000];
                let p = RopeParams {
                    n_dims,
                    mode,
                    freq_base: 10000.0,
                    freq_scale: 1.0,
                };
                let mut g = Graph::new();
                let a = g.input("a", dt, &x.ne).unwrap();
                let ps = g.input("p", DType::I32, &[5]).unwrap();
                let y = g.rope(a, ps, p).unwrap();
                let pf: Vec<f32> = pos.iter().map(|&v| v as f32).collect();
                let out = run(
                    &dev,
                    &mut be,
                    &mut g,
                    &[(a, to_bytes(dt, &x.v)), (ps, to_bytes(DType::I32, &pf))],
                    &[y],
                );
                let r = rope_ref(&x, &pos, &p);
                let max = if dt == DType::F32 { 1e-7 } else { 1e-5 };
                check(
                    &format!("rope {} {mode:?} n_dims {n_dims}", dt.name()),
                    &from_bytes(dt, &out[0], r.v.len()),
                    &rounded(dt, &r.v),
                    max,
                );
            }
        }
        // A strided source: the K part of a fused QKV row.
        let x = Host::new([32, 6, 3, 1], rounded(dt, &rng.vec(32 * 18, -1.0, 1.0)));
        let mut g = Graph::new();
        let a = g.input("a", dt, &x.ne).unwrap();
        let es = dt.type_size();
        let v = g
            .view(a, &[32, 2, 3], &[32 * es, 6 * 32 * es], 4 * 32 * es)
            .unwrap();
        let ps = g.input("p", DType::I32, &[3]).unwrap();
        let p = RopeParams {
            n_dims: 32,
            mode: RopeMode::Neox,
            freq_base: 500000.0,
            freq_scale: 0.5,
        };
        let y = g.rope(v, ps, p).unwrap();
        let out = run(
            &dev,
            &mut be,
            &mut g,
            &[
                (a, to_bytes(dt, &x.v)),
                (ps, to_bytes(DType::I32, &[3.0, 9.0, 27.0])),
            ],
            &[y],
        );
        let mut xv = Host::zeros([32, 2, 3, 1]);
        for c in Host::coords(xv.ne) {
            xv.set(c, x.get([c[0], c[1] + 4, c[2], 0]));
        }
        let r = rope_ref(&xv, &[3, 9, 27], &p);
        check(
            &format!("rope {} strided", dt.name()),
            &from_bytes(dt, &out[0], r.v.len()),
            &rounded(dt, &r.v),
            if dt == DType::F32 { 1e-7 } else { 1e-5 },
        );

        // glu: fused rows, swapped, and split.
        let x = Host::new([64, 3, 2, 1], rounded(dt, &rng.vec(64 * 6, -3.0, 3.0)));
        let u = Host::new([32, 3, 2, 1], rounded(dt, &rng.vec(32 * 6, -3.0, 3.0)));
        let mut g = Graph::new();
        let a = g.input("a", dt, &x.ne).unwrap();
        let b = g.input("b", dt, &u.ne).unwrap();
        let y1 = g.glu(a, GluOp::Swiglu, false).unwrap();
        let y2 = g.glu(a, GluOp::Geglu, true).unwrap();
        let half = g
            .view(
                a,
                &[32, 3, 2],
                &[64 * dt.type_size(), 64 * 3 * dt.type_size()],
                0,
            )
            .unwrap();
        let y3 = g.swiglu_split(half, b).unwrap();
        let out = run(
            &dev,
            &mut be,
            &mut g,
            &[(a, to_bytes(dt, &x.v)), (b, to_bytes(dt, &u.v))],
            &[y1, y2, y3],
        );
        let (mut r1, mut r2, mut r3) = (Vec::new(), Vec::new(), Vec::new());
        for c in Host::coords([32, 3, 2, 1]) {
            let lo = x.get(c);
            let hi = x.get([c[0] + 32, c[1], c[2], c[3]]);
            r1.push(unary_ref(UnaryOp::Silu, lo) * hi);
            r2.push(unary_ref(UnaryOp::Gelu, hi) * lo);
            r3.push(unary_ref(UnaryOp::Silu, lo) * u.get(c));
        }
        let max = if dt == DType::F32 { 1e-7 } else { 1e-5 };
        check(
            &format!("swiglu {}", dt.name()),
            &from_bytes(dt, &out[0], 192),
            &rounded(dt, &r1),
            max,
        );
        check(
            &format!("geglu swapped {}", dt.name()),
            &from_bytes(dt, &out[1], 192),
            &rounded(dt, &r2),
            max,
        );
        check(
            &format!("swiglu split {}", dt.name()),
            &from_bytes(dt, &out[2], 192),
            &rounded(dt, &r3),
            max,
        );
    }
}

/// Host attention: out [dv, heads, nq, b].
#[allow(clippy::too_many_arguments)]
fn attn_ref(
    q: &Host,
    k: &Host,
    v: &Host,
    mask: Option<&Host>,
    scale: f32,
    max_bias: f32,
    softcap: f32,
) -> Vec<f32> {
    let (d, nq, heads, nb) = (q.ne[0], q.ne[1], q.ne[2], q.ne[3]);
    let (nkv, kvh) = (k.ne[1], k.ne[2]);
    let dv = v.ne[0];
    let gqa = heads / kvh;
    let rb = nb / k.ne[3];
    let nl = 1usize << (usize::BITS - 1 - heads.leading_zeros());
    let (m0, m1) = (
        2f32.powf(-max_bias / nl as f32),
        2f32.powf(-(max_bias / 2.0) / nl as f32),
    );
    let mut out = vec![0f32; dv * heads * nq * nb];
    for b in 0..nb {
        for iq in 0..nq {
            for h in 0..heads {
                let slope = if max_bias > 0.0 {
                    if h < nl {
                        m0.powi(h as i32 + 1)
                    } else {
                        m1.powi(2 * (h - nl) as i32 + 1)
                    }
                } else {
                    1.0
                };
                let kh = h / gqa;
                let s: Vec<f64> = (0..nkv)
                    .map(|c| {
                        let mut acc = 0f64;
                        for x in 0..d {
                            acc += f64::from(q.get([x, iq, h, b]))
                                * f64::from(k.get([x, c, kh, b / rb]));
                        }
                        let mut s = acc * f64::from(scale);
                        if softcap != 0.0 {
                            s = f64::from(softcap) * (s / f64::from(softcap)).tanh();
                        }
                        if let Some(m) = mask {
                            s += f64::from(slope)
                                * f64::from(m.get([c, iq, h % m.ne[2], b % m.ne[3]]));
                        }
                        s
                    })
                    .collect();
                let mx = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let w: Vec<f64> = s.iter().map(|x| (x - mx).exp()).collect();
                let sum: f64 = w.iter().sum();
                for col in 0..dv {
                    let acc: f64 = (0..nkv)
                        .map(|c| w[c] * f64::from(v.get([col, c, kh, b / rb])))
                        .sum();
                    out[((b * nq + iq) * heads + h) * dv + col] = (acc / sum) as f32;
                }
            }
        }
    }
    out
}

#[test]
fn flash_attention() {
    let Some(dev) = cuda() else { return };
    let mut be = concrete(&dev).cuda_backend().unwrap();
    let mut rng = Rng::new(8);
    // (d, dv, nq, heads, kv_heads, nkv, batch, kv type, mask type, max_bias, softcap)
    let cases = [
        (
            64usize,
            64usize,
            1usize,
            8usize,
            2usize,
            300usize,
            1usize,
            DType::F16,
            Some(DType::F16),
            0.0f32,
            0.0f32,
        ),
        (128, 128, 1, 32, 8, 1000, 1, DType::F16, None, 0.0, 0.0),
        (
            64,
            64,
            37,
            4,
            4,
            90,
            2,
            DType::F32,
            Some(DType::F32),
            0.0,
            0.0,
        ),
        (
            128,
            128,
            20,
            6,
            2,
            70,
            1,
            DType::F16,
            Some(DType::F16),
            4.0,
            0.0,
        ),
        (
            80,
            64,
            5,
            3,
            1,
            50,
            1,
            DType::F32,
            Some(DType::F16),
            0.0,
            30.0,
        ),
        (
            256,
            256,
            3,
            2,
            1,
            40,
            1,
            DType::F16,
            Some(DType::F16),
            0.0,
            0.0,
        ),
    ];
    for (d, dv, nq, heads, kvh, nkv, nb, kt, mt, max_bias, softcap) in cases {
        let qh = Host::random(&mut rng, [d, nq, heads, nb], -1.0, 1.0);
        let kh = Host::new(
            [d, nkv, kvh, nb],
            rounded(kt, &rng.vec(d * nkv * kvh * nb, -1.0, 1.0)),
        );
        let vh = Host::new(
            [dv, nkv, kvh, nb],
            rounded(kt, &rng.vec(dv * nkv * kvh * nb, -1.0, 1.0)),
        );
        let mut mh = Host::random(&mut rng, [nkv, nq + 3, 1, 1], -0.5, 0.0);
        for i in 0..nq + 3 {
            for c in 0..nkv {
                if c > nkv - nq + i {
                    mh.set([c, i, 0, 0], f32::NEG_INFINITY);
                }
            }
        }
        let mut g = Graph::new();
        let q = g.input("q", DType::F32, &qh.ne).unwrap();
        let k = g.input("k", kt, &kh.ne).unwrap();
        let v = g.input("v", kt, &vh.ne).unwrap();
        let mut inputs = vec![
            (q, to_bytes(DType::F32, &qh.v)),
            (k, to_bytes(kt, &kh.v)),
            (v, to_bytes(kt, &vh.v)),
        ];
        let m = mt.map(|t| {
            let m = g.input("m", t, &mh.ne).unwrap();
            inputs.push((m, to_bytes(t, &mh.v)));
            m
        });
        let scale = 1.0 / (d as f32).sqrt();
        let y = g
            .flash_attn_ext(q, k, v, m, scale, max_bias, softcap)
            .unwrap();
        let out = run(&dev, &mut be, &mut g, &inputs, &[y]);
        let mref = mt.map(|t| Host::new(mh.ne, rounded(t, &mh.v)));
        let r = attn_ref(&qh, &kh, &vh, mref.as_ref(), scale, max_bias, softcap);
        check(&format!("flash_attn d={d} dv={dv} nq={nq} heads={heads}/{kvh} nkv={nkv} b={nb} {} mask {mt:?} bias {max_bias} softcap {softcap}", kt.name()), &from_bytes(DType::F32, &out[0], r.len()), &r, 5e-4);
    }
}

#[test]
fn shape_ops_and_reductions() {
    let Some(dev) = cuda() else { return };
    let mut be = concrete(&dev).cuda_backend().unwrap();
    let mut rng = Rng::new(9);
    for dt in [DType::F32, DType::F16, DType::I32] {
        for dim in 0..4 {
            let ane = [4usize, 3, 2, 2];
            let mut bne = ane;
            bne[dim] = 3;
            let ha = Host::new(
                ane,
                rng.vec(48, -9.0, 9.0).iter().map(|v| v.round()).collect(),
            );
            let hb = Host::new(
                bne,
                rng.vec(bne.iter().product(), -9.0, 9.0)
                    .iter()
                    .map(|v| v.round())
                    .collect(),
            );
            let mut g = Graph::new();
            let a = g.input("a", dt, &ane).unwrap();
            let b = g.input("b", dt, &bne).unwrap();
            let y = g.concat(a, b, dim).unwrap();
            let out = run(
                &dev,
                &mut be,
                &mut g,
                &[(a, to_bytes(dt, &ha.v)), (b, to_bytes(dt, &hb.v))],
                &[y],
            );
            let mut one = ane;
            one[dim] += 3;
            let r: Vec<f32> = Host::coords(one)
                .map(|c| {
                    if c[dim] < ane[dim] {
                        ha.get(c)
                    } else {
                        let mut cc = c;
                        cc[dim] -= ane[dim];
                        hb.get(cc)
                    }
                })
                .collect();
            let got = if dt == DType::I32 {
                i32s(&out[0]).iter().map(|&v| v as f32).collect()
            } else {
                from_bytes(dt, &out[0], r.len())
            };
            check(&format!("concat {} dim {dim}", dt.name()), &got, &r, 0.0);
        }
        let ha = Host::new(
            [3, 2, 1, 2],
            rng.vec(12, -9.0, 9.0).iter().map(|v| v.round()).collect(),
        );
        let mut g = Graph::new();
        let a = g.input("a", dt, &ha.ne).unwrap();
        let y = g.repeat(a, &[6, 4, 3, 2]).unwrap();
        let out = run(&dev, &mut be, &mut g, &[(a, to_bytes(dt, &ha.v))], &[y]);
        let r: Vec<f32> = Host::coords([6, 4, 3, 2])
            .map(|c| ha.get([c[0] % 3, c[1] % 2, 0, c[3] % 2]))
            .collect();
        let got = if dt == DType::I32 {
            i32s(&out[0]).iter().map(|&v| v as f32).collect()
        } else {
            from_bytes(dt, &out[0], r.len())
        };
        check(&format!("repeat {}", dt.name()), &got, &r, 0.0);
    }
    let ha = Host::random(&mut rng, [5, 3, 2, 1], -1.0, 1.0);
    let mut g = Graph::new();
    let a = g.input("a", DType::F32, &ha.ne).unwrap();
    let p = g.pad(a, [2, 1, 0, 1]).unwrap();
    let s = g.sum(a).unwrap();
    let sr = g.sum_rows(a).unwrap();
    let mn = g.mean(a).unwrap();
    let ar = g.arange(-1.5, 4.0, 0.5).unwrap();
    let out = run(
        &dev,
        &mut be,
        &mut g,
        &[(a, to_bytes(DType::F32, &ha.v))],
        &[p, s, sr, mn, ar],
    );
    let rp: Vec<f32> = Host::coords([7, 4, 2, 2])
        .map(|c| {
            if c[0] < 5 && c[1] < 3 && c[3] < 1 {
                ha.get(c)
            } else {
                0.0
            }
        })
        .collect();
    check("pad", &from_bytes(DType::F32, &out[0], rp.len()), &rp, 0.0);
    check(
        "sum",
        &from_bytes(DType::F32, &out[1], 1),
        &[ha.v.iter().sum::<f32>()],
        1e-7,
    );
    let rows: Vec<f32> = ha.v.chunks(5).map(|r| r.iter().sum()).collect();
    check("sum_rows", &from_bytes(DType::F32, &out[2], 6), &rows, 1e-7);
    let means: Vec<f32> = rows.iter().map(|v| v / 5.0).collect();
    check("mean", &from_bytes(DType::F32, &out[3], 6), &means, 1e-7);
    let ra: Vec<f32> = (0..11).map(|i| -1.5 + 0.5 * i as f32).collect();
    check("arange", &from_bytes(DType::F32, &out[4], 11), &ra, 0.0);
    // sum of f16 and bf16, a larger tensor.
    for dt in [DType::F16, DType::BF16] {
        let x = rounded(dt, &rng.vec(100_000, -1.0, 1.0));
        let mut g = Graph::new();
        let a = g.input("a", dt, &[1000, 100]).unwrap();
        let s = g.sum(a).unwrap();
        let out = run(&dev, &mut be, &mut g, &[(a, to_bytes(dt, &x))], &[s]);
        let want = x.iter().map(|&v| f64::from(v)).sum::<f64>() as f32;
        check(
            &format!("sum {}", dt.name()),
            &from_bytes(DType::F32, &out[0], 1),
            &[want],
            1e-7,
        );
    }
    // argmax with ties (first index wins) over long rows.
    let mut x = rng.vec(50_000 * 3, -1.0, 1.0);
    x[1234] = 5.0;
    x[40_000] = 5.0;
    x[50_000 + 7] = 2.0;
    x[100_000 + 49_999] = 3.0;
    let mut g = Graph::new();
    let a = g.input("a", DType::F32, &[50_000, 3]).unwrap();
    let y = g.argmax(a).unwrap();
    let out = run(
        &dev,
        &mut be,
        &mut g,
        &[(a, to_bytes(DType::F32, &x))],
        &[y],
    );
    assert_eq!(i32s(&out[0]), vec![1234, 7, 49_999]);
    println!("ok argmax");
}
