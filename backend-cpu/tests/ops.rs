//! Every op family on small cases that can be checked by hand or by a plain loop.

mod common;

use common::{assert_close, nmse, rand_vec, round_trip, Case};
use tessera_core::{DType, GluOp, RopeMode, RopeParams, UnaryOp};

// ---- element-wise ----

#[test]
fn binary_ops_broadcast_the_second_source() {
    let a: Vec<f32> = (0..24).map(|i| i as f32).collect();
    let mut c = Case::new();
    let ta = c.input(DType::F32, &[4, 3, 2], &a);
    let tb = c.input(DType::F32, &[2, 1, 2], &[1.0, 2.0, 3.0, 4.0]);
    let add = c.g.add(ta, tb).unwrap();
    let div = c.g.div(ta, tb).unwrap();
    let out = c.run(&[add, div]).unwrap();
    for i in 0..24 {
        let b = [1.0, 2.0, 3.0, 4.0][(i % 2) + 2 * (i / 12)];
        assert_eq!(out[0][i], a[i] + b);
        assert_eq!(out[1][i], a[i] / b);
    }
}

#[test]
fn binary_ops_in_f16_and_bf16() {
    let mut c = Case::new();
    let ta = c.input(DType::F16, &[3], &[1.0, 2.0, 3.0]);
    let tb = c.input(DType::BF16, &[3], &[0.5, 0.5, 2.0]);
    let mul = c.g.mul(ta, tb).unwrap();
    let sub = c.g.sub(ta, tb).unwrap();
    let out = c.run(&[mul, sub]).unwrap();
    assert_eq!(out[0], vec![0.5, 1.0, 6.0]);
    assert_eq!(out[1], vec![0.5, 1.5, 1.0]);
}

#[test]
fn an_op_may_write_over_its_first_source() {
    // Bind the result to the very bytes of its source, as the graph allocator does.
    let mut c = Case::new();
    let ta = c.input(
        DType::F32,
        &[5, 2],
        &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0],
    );
    let tb = c.input(DType::F32, &[5], &[1.0; 5]);
    let y = c.g.add(ta, tb).unwrap();
    let buf = tessera_core::BufferType::alloc(&tessera_cpu::CpuBufferType, 64).unwrap();
    c.g.bind(ta, buf.clone(), 0).unwrap();
    c.g.bind(y, buf, 0).unwrap();
    let out = c.run(&[y]).unwrap();
    assert_eq!(out[0], (2..12).map(|i| i as f32).collect::<Vec<_>>());
}

#[test]
fn unary_functions_at_known_points() {
    let x = [-2.0f32, -0.5, 0.0, 0.5, 2.0];
    type Case1 = (UnaryOp, fn(f32) -> f32);
    let cases: [Case1; 8] = [
        (UnaryOp::Sqr, |x| x * x),
        (UnaryOp::Neg, |x| -x),
        (UnaryOp::Abs, f32::abs),
        (UnaryOp::Relu, |x| x.max(0.0)),
        (UnaryOp::Exp, f32::exp),
        (UnaryOp::Tanh, f32::tanh),
        (UnaryOp::Sigmoid, |x| 1.0 / (1.0 + (-x).exp())),
        (UnaryOp::Silu, |x| x / (1.0 + (-x).exp())),
    ];
    for (op, f) in cases {
        let mut c = Case::new();
        let a = c.input(DType::F32, &[5], &x);
        let y = c.g.unary(a, op).unwrap();
        let out = c.run(&[y]).unwrap();
        assert_close(&out[0], &x.map(f), 1e-6);
    }
    let mut c = Case::new();
    let a = c.input(DType::F32, &[3], &[-1.0, 0.0, 1.0]);
    let g = c.g.unary(a, UnaryOp::Gelu).unwrap();
    let ge = c.g.unary(a, UnaryOp::GeluErf).unwrap();
    let out = c.run(&[g, ge]).unwrap();
    assert_close(&out[0], &[-0.158_808, 0.0, 0.841_192], 1e-5);
    assert_close(&out[1], &[-0.158_655_3, 0.0, 0.841_344_7], 1e-6);
}

#[test]
fn unary_reads_a_transposed_view() {
    let mut c = Case::new();
    let a = c.input(DType::F32, &[3, 2], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    let t = c.g.transpose(a).unwrap();
    let y = c.g.unary(t, UnaryOp::Neg).unwrap();
    assert_eq!(
        c.run(&[y]).unwrap()[0],
        vec![-1.0, -4.0, -2.0, -5.0, -3.0, -6.0]
    );
}

#[test]
fn scale_bias_and_clamp() {
    let mut c = Case::new();
    let a = c.input(DType::F16, &[4], &[-2.0, -0.5, 0.5, 2.0]);
    let s = c.g.scale_bias(a, 2.0, 1.0).unwrap();
    let k = c.g.clamp(a, -1.0, 1.0).unwrap();
    let out = c.run(&[s, k]).unwrap();
    assert_eq!(out[0], vec![-3.0, 0.0, 2.0, 5.0]);
    assert_eq!(out[1], vec![-1.0, -0.5, 0.5, 1.0]);
}

#[test]
fn glu_with_one_or_two_sources() {
    let silu = |x: f32| x / (1.0 + (-x).exp());
    let mut c = Case::new();
    let a = c.input(DType::F32, &[4, 1], &[1.0, -1.0, 2.0, 3.0]);
    let y = c.g.glu(a, GluOp::Swiglu, false).unwrap();
    let ys = c.g.glu(a, GluOp::Swiglu, true).unwrap();
    let gate = c.input(DType::F32, &[2], &[1.0, -1.0]);
    let up = c.input(DType::F32, &[2], &[2.0, 3.0]);
    let y2 = c.g.swiglu_split(gate, up).unwrap();
    let out = c.run(&[y, ys, y2]).unwrap();
    let want = [silu(1.0) * 2.0, silu(-1.0) * 3.0];
    assert_close(&out[0], &want, 1e-6);
    assert_close(&out[1], &[silu(2.0), -silu(3.0)], 1e-6);
    assert_close(&out[2], &want, 1e-6);
}

// ---- normalisation and softmax ----

#[test]
fn rms_norm_and_norm_by_hand() {
    let mut c = Case::new();
    let a = c.input(
        DType::F32,
        &[4, 2],
        &[1.0, 2.0, 3.0, 4.0, 2.0, 2.0, 2.0, 2.0],
    );
    let r = c.g.rms_norm(a, 1e-12).unwrap();
    let n = c.g.norm(a, 1e-12).unwrap();
    let out = c.run(&[r, n]).unwrap();
    let s = (30.0f32 / 4.0).sqrt();
    assert_close(&out[0][..4], &[1.0 / s, 2.0 / s, 3.0 / s, 4.0 / s], 1e-6);
    assert_close(&out[0][4..], &[1.0; 4], 1e-6);
    let sd = 1.25f32.sqrt();
    assert_close(
        &out[1][..4],
        &[-1.5 / sd, -0.5 / sd, 0.5 / sd, 1.5 / sd],
        1e-6,
    );
    assert_close(&out[1][4..], &[0.0; 4], 1e-6);
}

#[test]
fn softmax_rows_sum_to_one_and_masked_entries_vanish() {
    let x = rand_vec(8 * 3 * 2, 1);
    let mut c = Case::new();
    let a = c.input(DType::F32, &[8, 3, 2], &x);
    let mut mask = vec![0f32; 8 * 4];
    for (i, m) in mask.iter_mut().enumerate() {
        if i % 8 > i / 8 + 4 {
            *m = f32::NEG_INFINITY;
        }
    }
    let m = c.input(DType::F16, &[8, 4], &mask);
    let y = c.g.soft_max_ext(a, Some(m), 0.5, 0.0).unwrap();
    let plain = c.g.soft_max_ext(a, None, 1.0, 0.0).unwrap();
    let out = c.run(&[y, plain]).unwrap();
    for (r, row) in out[0].chunks(8).enumerate() {
        assert!((row.iter().sum::<f32>() - 1.0).abs() < 1e-6);
        for (i, &v) in row.iter().enumerate() {
            if i > r % 3 + 4 {
                assert_eq!(v, 0.0);
            }
        }
        // Unmasked entries follow exp(0.5 x).
        let xr = &x[r * 8..];
        assert!((row[1] / row[0] - (0.5 * (xr[1] - xr[0])).exp()).abs() < 1e-5);
    }
    for row in out[1].chunks(8) {
        assert!((row.iter().sum::<f32>() - 1.0).abs() < 1e-6);
    }
}

#[test]
fn softmax_alibi_adds_head_slopes_times_the_mask() {
    // Two heads, max_bias 8: slopes 2^-4 and 2^-8; the mask is a ramp.
    let mut c = Case::new();
    let a = c.input(DType::F32, &[3, 1, 2], &[0.0; 6]);
    let m = c.input(DType::F32, &[3, 1], &[0.0, 1.0, 2.0]);
    let y = c.g.soft_max_ext(a, Some(m), 1.0, 8.0).unwrap();
    let out = c.run(&[y]).unwrap();
    for (h, slope) in [(0usize, 2f32.powi(-4)), (1, 2f32.powi(-8))] {
        let e: Vec<f32> = (0..3).map(|i| (slope * i as f32).exp()).collect();
        let s: f32 = e.iter().sum();
        assert_close(
            &out[0][h * 3..h * 3 + 3],
            &e.iter().map(|v| v / s).collect::<Vec<_>>(),
            1e-6,
        );
    }
}

#[test]
fn diag_mask_inf_hides_the_future() {
    let mut c = Case::new();
    let a = c.input(DType::F32, &[3, 2], &[1.0; 6]);
    let y = c.g.diag_mask_inf(a, 1).unwrap();
    let inf = f32::NEG_INFINITY;
    assert_eq!(c.run(&[y]).unwrap()[0], vec![1.0, 1.0, inf, 1.0, 1.0, 1.0]);
}

// ---- rope ----

fn rope_params(n_dims: usize, mode: RopeMode) -> RopeParams {
    RopeParams::new(n_dims, mode, 10000.0, 1.0)
}

#[test]
fn rope_at_position_zero_is_the_identity() {
    let x = rand_vec(8 * 2 * 3, 2);
    for mode in [RopeMode::Normal, RopeMode::Neox] {
        let mut c = Case::new();
        let a = c.input(DType::F32, &[8, 2, 3], &x);
        let p = c.ints(&[3], &[0, 0, 0]);
        let y = c.g.rope(a, p, rope_params(8, mode)).unwrap();
        assert_close(&c.run(&[y]).unwrap()[0], &x, 0.0);
    }
}

#[test]
fn rope_turns_pairs_by_position_times_frequency() {
    let x = [1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0];
    let pos = 3.0f32;
    // n_dims 4 of 6: pairs k = 0, 1 with theta_k = pos * 10000^(-k/2); dims 4, 5 untouched.
    let th = [pos, pos * 10000f32.powf(-0.5)];
    let rot = |a: f32, b: f32, t: f32| (a * t.cos() - b * t.sin(), a * t.sin() + b * t.cos());
    for (mode, pairs) in [
        (RopeMode::Normal, [(0, 1), (2, 3)]),
        (RopeMode::Neox, [(0, 2), (1, 3)]),
    ] {
        let mut c = Case::new();
        let a = c.input(DType::F32, &[6, 1, 1], &x);
        let p = c.ints(&[1], &[3]);
        let y = c.g.rope(a, p, rope_params(4, mode)).unwrap();
        let out = c.run(&[y]).unwrap().remove(0);
        let mut want = x;
        for (k, &(i, j)) in pairs.iter().enumerate() {
            (want[i], want[j]) = rot(x[i], x[j], th[k]);
        }
        assert_close(&out, &want, 1e-5);
    }
}

#[test]
fn rope_in_f16() {
    let x = rand_vec(4 * 2, 3);
    let mut c = Case::new();
    let a = c.input(DType::F16, &[4, 1, 2], &x);
    let p = c.ints(&[2], &[0, 5]);
    let y = c.g.rope(a, p, rope_params(4, RopeMode::Normal)).unwrap();
    let out = c.run(&[y]).unwrap().remove(0);
    assert_close(&out[..4], &round_trip(DType::F16, &x[..4]), 0.0);
    let n0 = (x[4] * x[4] + x[5] * x[5]).sqrt();
    assert!(((out[4] * out[4] + out[5] * out[5]).sqrt() - n0).abs() < 2e-3);
}

// ---- attention ----

/// softmax(q k^T * scale + mask) v for one query row, in f64.
#[allow(clippy::too_many_arguments)]
fn naive_attention(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    mask: &[f32],
    d: usize,
    dv: usize,
    scale: f32,
    cap: f32,
) -> Vec<f32> {
    let n_kv = k.len() / d;
    let s: Vec<f64> = (0..n_kv)
        .map(|j| {
            let mut s: f64 = (0..d)
                .map(|i| f64::from(q[i]) * f64::from(k[j * d + i]))
                .sum::<f64>()
                * f64::from(scale);
            if cap != 0.0 {
                s = f64::from(cap) * (s / f64::from(cap)).tanh();
            }
            s + f64::from(mask[j])
        })
        .collect();
    let max = s.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let e: Vec<f64> = s.iter().map(|x| (x - max).exp()).collect();
    let sum: f64 = e.iter().sum();
    (0..dv)
        .map(|i| {
            (0..n_kv)
                .map(|j| e[j] * f64::from(v[j * dv + i]))
                .sum::<f64>()
                / sum
        })
        .map(|x| x as f32)
        .collect()
}

#[test]
fn flash_attention_matches_a_naive_softmax() {
    let (d, dv, n_q, n_kv, h, h_kv) = (16, 8, 3, 11, 4, 2);
    for (kv_type, cap) in [(DType::F32, 0.0f32), (DType::F16, 0.0), (DType::F16, 2.0)] {
        let q = rand_vec(d * n_q * h, 10);
        let k = round_trip(kv_type, &rand_vec(d * n_kv * h_kv, 11));
        let v = round_trip(kv_type, &rand_vec(dv * n_kv * h_kv, 12));
        let mut mask = vec![0f32; n_kv * 4];
        for (i, m) in mask.iter_mut().enumerate() {
            if i % n_kv > 7 + i / n_kv {
                *m = f32::NEG_INFINITY;
            }
        }
        let mask = round_trip(DType::F16, &mask);
        let mut c = Case::new();
        let tq = c.input(DType::F32, &[d, n_q, h], &q);
        let tk = c.input(kv_type, &[d, n_kv, h_kv], &k);
        let tv = c.input(kv_type, &[dv, n_kv, h_kv], &v);
        let tm = c.input(DType::F16, &[n_kv, 4], &mask);
        let y =
            c.g.flash_attn_ext(tq, tk, tv, Some(tm), 0.3, 0.0, cap)
                .unwrap();
        let out = c.run(&[y]).unwrap().remove(0);
        let mut want = vec![0f32; dv * h * n_q];
        for iq in 0..n_q {
            for hh in 0..h {
                let kh = hh / (h / h_kv);
                let r = naive_attention(
                    &q[(hh * n_q + iq) * d..][..d],
                    &k[kh * n_kv * d..][..n_kv * d],
                    &v[kh * n_kv * dv..][..n_kv * dv],
                    &mask[iq * n_kv..][..n_kv],
                    d,
                    dv,
                    0.3,
                    cap,
                );
                want[(iq * h + hh) * dv..][..dv].copy_from_slice(&r);
            }
        }
        let e = nmse(&out, &want);
        assert!(e < 1e-10, "{kv_type} cap {cap}: nmse {e}");
    }
}

// ---- rows ----

#[test]
fn get_rows_of_q8_0_equals_dequantize() {
    let x = rand_vec(64 * 4, 4);
    let mut c = Case::new();
    let a = c.input(DType::Q8_0, &[64, 4], &x);
    let i = c.ints(&[3], &[2, 0, 2]);
    let y = c.g.get_rows(a, i).unwrap();
    let out = c.run(&[y]).unwrap().remove(0);
    let dq = round_trip(DType::Q8_0, &x);
    assert_eq!(&out[..64], &dq[128..192]);
    assert_eq!(&out[64..128], &dq[..64]);
    assert_eq!(&out[128..], &dq[128..192]);
}

#[test]
fn get_rows_of_i32_and_f16() {
    let mut c = Case::new();
    let a = c.ints(&[2, 3], &[1, 2, 3, 4, 16_777_217, 6]);
    let h = c.input(DType::F16, &[2, 3], &[0.5, 1.5, 2.5, 3.5, 4.5, 5.5]);
    let i = c.ints(&[2], &[2, 1]);
    let y = c.g.get_rows(a, i).unwrap();
    let yh = c.g.get_rows(h, i).unwrap();
    let outs = c
        .run_on(
            &mut tessera_cpu::CpuBackend::new(1, false).unwrap(),
            &[y, yh],
        )
        .unwrap();
    let ints: Vec<i32> = outs[0]
        .chunks(4)
        .map(|b| i32::from_le_bytes(b.try_into().unwrap()))
        .collect();
    assert_eq!(ints, vec![16_777_217, 6, 3, 4]);
    let f: Vec<f32> = outs[1]
        .chunks(4)
        .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
        .collect();
    assert_eq!(f, vec![4.5, 5.5, 2.5, 3.5]);
}

#[test]
fn set_rows_writes_converted_rows_at_i32_and_i64_indices() {
    let mut c = Case::new();
    let dst = c.input(DType::F16, &[2, 4], &[0.0; 8]);
    let src = c.input(DType::F32, &[2, 2], &[1.0, 2.0, 3.0, 4.0]);
    let idx = c.longs(&[2], &[3, 1]);
    let y = c.g.set_rows(dst, src, idx).unwrap();
    assert_eq!(
        c.run(&[y]).unwrap()[0],
        vec![0.0, 0.0, 3.0, 4.0, 0.0, 0.0, 1.0, 2.0]
    );

    let x = rand_vec(32 * 2, 5);
    let mut c = Case::new();
    let dst = c.input(DType::Q4_0, &[32, 3], &[0.0; 96]);
    let src = c.input(DType::F32, &[32, 2], &x);
    let idx = c.ints(&[2], &[2, 0]);
    let y = c.g.set_rows(dst, src, idx).unwrap();
    let out = c.run(&[y]).unwrap().remove(0);
    assert_eq!(&out[64..], &round_trip(DType::Q4_0, &x[..32])[..]);
    assert_eq!(&out[..32], &round_trip(DType::Q4_0, &x[32..])[..]);
    assert_eq!(&out[32..64], &[0.0; 32]);
}

// ---- copies ----

#[test]
fn copies_convert_types_and_follow_strides() {
    let x = rand_vec(64, 6);
    let mut c = Case::new();
    let a = c.input(DType::F32, &[8, 8], &x);
    let h = c.g.cast(a, DType::F16).unwrap();
    let a32 = c.g.reshape(a, &[32, 2]).unwrap();
    let q = c.g.cast(a32, DType::Q8_0).unwrap();
    let t = c.g.transpose(a).unwrap();
    let tc = c.g.cont(t).unwrap();
    let d = c.g.dup(a).unwrap();
    let out = c.run(&[h, q, tc, d]).unwrap();
    assert_eq!(out[0], round_trip(DType::F16, &x));
    assert_eq!(out[1], round_trip(DType::Q8_0, &x));
    for i in 0..8 {
        for j in 0..8 {
            assert_eq!(out[2][i * 8 + j], x[j * 8 + i]);
        }
    }
    assert_eq!(out[3], x);
}

#[test]
fn quantized_copies_dequantize_and_copy_blocks_exactly() {
    let x = rand_vec(64, 7);
    let mut c = Case::new();
    let a = c.input(DType::Q4_0, &[32, 2], &x);
    let f = c.g.cast(a, DType::F32).unwrap();
    let same = c.g.cont(a).unwrap();
    // Into a reshaped destination: elements keep their flat order.
    let b = c.g.new_tensor(DType::Q4_0, &[64]).unwrap();
    let r = c.g.cpy(a, b).unwrap();
    let out = c
        .run_on(
            &mut tessera_cpu::CpuBackend::new(2, false).unwrap(),
            &[a, f, same, r],
        )
        .unwrap();
    let dq = round_trip(DType::Q4_0, &x);
    let f: Vec<f32> = out[1]
        .chunks(4)
        .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
        .collect();
    assert_eq!(f, dq);
    assert_eq!(out[2], out[0]);
    assert_eq!(out[3], out[0]);
}

#[test]
fn a_copy_into_a_strided_view() {
    let mut c = Case::new();
    let src = c.input(DType::F32, &[2, 2], &[1.0, 2.0, 3.0, 4.0]);
    let dst = c.input(DType::F16, &[3, 2], &[0.0; 6]);
    let v = c.g.view(dst, &[2, 2], &[6], 2).unwrap();
    let y = c.g.cpy(src, v).unwrap();
    let _ = y;
    let out = c.run(&[dst]).unwrap();
    assert_eq!(out[0], vec![0.0, 1.0, 2.0, 0.0, 3.0, 4.0]);
}

// ---- shape ops ----

#[test]
fn concat_repeat_pad_and_arange() {
    let mut c = Case::new();
    let a = c.input(DType::F32, &[2, 2], &[1.0, 2.0, 3.0, 4.0]);
    let b = c.input(DType::F32, &[1, 2], &[5.0, 6.0]);
    let b1 = c.input(DType::F32, &[2, 1], &[7.0, 8.0]);
    let c0 = c.g.concat(a, b, 0).unwrap();
    let c1 = c.g.concat(a, b1, 1).unwrap();
    let rep = c.g.repeat(b, &[2, 4]).unwrap();
    let pad = c.g.pad(a, [1, 1, 0, 0]).unwrap();
    let ar = c.g.arange(1.0, 2.0, 0.25).unwrap();
    let out = c.run(&[c0, c1, rep, pad, ar]).unwrap();
    assert_eq!(out[0], vec![1.0, 2.0, 5.0, 3.0, 4.0, 6.0]);
    assert_eq!(out[1], vec![1.0, 2.0, 3.0, 4.0, 7.0, 8.0]);
    assert_eq!(out[2], vec![5.0, 5.0, 6.0, 6.0, 5.0, 5.0, 6.0, 6.0]);
    assert_eq!(out[3], vec![1.0, 2.0, 0.0, 3.0, 4.0, 0.0, 0.0, 0.0, 0.0]);
    assert_eq!(out[4], vec![1.0, 1.25, 1.5, 1.75]);
}

// ---- reductions ----

#[test]
fn sums_means_and_argmax() {
    let mut c = Case::new();
    let a = c.input(DType::F32, &[3, 2], &[1.0, 5.0, 5.0, -1.0, -2.0, -0.5]);
    let s = c.g.sum(a).unwrap();
    let sr = c.g.sum_rows(a).unwrap();
    let m = c.g.mean(a).unwrap();
    let am = c.g.argmax(a).unwrap();
    let h = c.input(DType::F16, &[2], &[1.5, 2.5]);
    let sh = c.g.sum(h).unwrap();
    let raw = c
        .run_on(
            &mut tessera_cpu::CpuBackend::new(1, false).unwrap(),
            &[s, sr, m, sh, am],
        )
        .unwrap();
    let out: Vec<Vec<f32>> = raw[..4]
        .iter()
        .map(|b| {
            b.chunks(4)
                .map(|x| f32::from_le_bytes(x.try_into().unwrap()))
                .collect()
        })
        .collect();
    assert_eq!(out[0], vec![7.5]);
    assert_eq!(out[1], vec![11.0, -3.5]);
    assert_close(&out[2], &[11.0 / 3.0, -3.5 / 3.0], 1e-6);
    assert_eq!(out[3], vec![4.0]);
    assert_eq!(
        raw[4],
        [1i32, 2]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect::<Vec<u8>>()
    );
}
