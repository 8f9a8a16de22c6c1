//! Op sequences that backends fuse into one kernel, as a model's graph holds them, so that each
//! fused kernel is checked against the CPU's unfused ops: rms_norm times a weight (alone, and
//! feeding quantized mat-vec products, which then take the norm's output already quantized or
//! compute the norm themselves: one product, Q, K and V, or gate and up),
//! a Llama block's rope of Q and K with the stores of K and V into their caches, read back by
//! attention (also straight after one token's Q, K and V products, which a backend may compute,
//! rotate and store in one kernel), and several products of one activation (Q, K and V, or gate
//! and up, of a prompt, which a backend may convert once for all of them or run two of as one
//! kernel, or of one token, which it may compute in one kernel), and a feed-forward block for
//! one token (gate, up, swiglu
//! and down: the swiglu result quantized by the kernel that makes it), and attention followed
//! by the o projection (the attention result quantized by the attention kernels), and a
//! product with its residual add followed by the next rms_norm * w and product (the norm
//! computed by the first product's kernel).

use tessera_core::{DType, GluOp, Result, RopeMode, RopeParams, TensorId};

use super::ne_str;
use crate::case::{Case, CaseGraph, Tolerance};
use crate::init::Init;

/// Every fused-sequence case.
pub(super) fn cases(v: &mut Vec<Case>) {
    rms_norm_mul(v);
    rope_kv(v);
    qkv_rope_kv(v);
    qk_norm_rope_kv(v);
    shared_activation(v);
    prompt_gate_up(v);
    gate_up_down(v);
    attn_out_proj(v);
    add_norm(v);
    post_norm(v);
}

/// `x + rms_norm(y) * w` (Gemma's post-attention and post-feed-forward norms joining the
/// residual), one token and several, the sum on either side, and a width that is not whole
/// float4s (which a backend may leave unfused).
fn post_norm(v: &mut Vec<Case>) {
    for (k, n, first) in [
        (640, 1, false),
        (640, 7, true),
        (2304, 1, true),
        (3584, 3, false),
        (90, 2, false),
    ] {
        let params = format!("k={k},n={n},norm_first={first}");
        v.push(Case::new(
            "RMS_NORM_MUL_ADD",
            params,
            &[DType::F32],
            Tolerance::DEFAULT,
            move |g| {
                let y = normed(g, &[k, n])?;
                let x = g.leaf(DType::F32, &[k, n])?;
                if first {
                    g.add(y, x)
                } else {
                    g.add(x, y)
                }
            },
        ));
    }
}

/// One token's product with quantized weights plus a residual, then rms_norm times a weight and
/// the next quantized product (a Llama block's o or down projection, its residual add, and the
/// next norm feeding Q/K/V or gate/up): a backend may compute the norm, quantized for the next
/// product, in the first product's kernel. Includes a short vector (3 blocks of 32) and two
/// tokens, which such a backend leaves unfused.
fn add_norm(v: &mut Vec<Case>) {
    // (type, k, m, next rows, tokens, product first in the add)
    let shapes = [
        (DType::Q4_1, 576, 576, 1536, 1, true),
        (DType::Q4_1, 1536, 576, 576, 1, false),
        (DType::Q8_0, 4096, 4096, 1024, 1, true),
        (DType::Q4_K, 512, 1024, 256, 1, false),
        (DType::Q4_0, 256, 96, 64, 1, true),
        (DType::Q8_0, 576, 576, 64, 2, true),
        // Several sequences decoded together: products of several columns with their
        // residuals, then each column's norm computed by the next product.
        (DType::Q4_K, 512, 256, 128, 5, false),
        (DType::Q6_K, 256, 256, 64, 16, true),
    ];
    for (t, k, m, m2, n, first) in shapes {
        let params = format!("type={t},k={k},m={m},m2={m2},tokens={n},first={first}");
        v.push(Case::new(
            "MUL_MAT_ADD_NORM",
            params,
            &[t, DType::F32],
            Tolerance::MATMUL,
            move |g| {
                let x = g.leaf(DType::F32, &[k, n])?;
                let r = g.leaf(DType::F32, &[m, n])?;
                let a = g.input(t, &[k, m], Init::Uniform(-0.1, 0.1))?;
                let w = g.input(DType::F32, &[m], Init::Uniform(0.5, 1.5))?;
                let b = g.input(t, &[m, m2], Init::Uniform(-0.1, 0.1))?;
                let o = g.mul_mat(a, x)?;
                let s = if first { g.add(o, r)? } else { g.add(r, o)? };
                let h = g.rms_norm(s, 1e-5)?;
                let h = g.mul(h, w)?;
                g.mul_mat(b, h)
            },
        ));
    }
}

/// Attention of a token (or two) over F16 caches, its heads' outputs (reshaped into one vector a
/// token) times quantized weights (a Llama block's o projection), with or without the residual
/// add after it: a backend may have the attention kernel quantize its result for the mat-vec.
fn attn_out_proj(v: &mut Vec<Case>) {
    // (type, head dim, query heads, kv heads, cache rows, tokens, residual add): short caches
    // that decoding kernels take in one split and long ones they split.
    let shapes = [
        (DType::Q8_0, 64, 9, 3, 32, 1, true),
        (DType::Q4_0, 64, 9, 3, 600, 1, true),
        (DType::Q4_K, 128, 32, 8, 1100, 1, true),
        (DType::Q8_0, 128, 4, 1, 2048, 1, false),
        (DType::Q4_0, 64, 4, 4, 20, 1, false),
        (DType::Q8_0, 64, 9, 3, 300, 2, true),
    ];
    for (t, hd, nh, nkv, rows, n, add) in shapes {
        let params = format!("type={t},hd={hd},nh={nh},nkv={nkv},rows={rows},tokens={n},add={add}");
        v.push(Case::new(
            "ATTN_MUL_MAT",
            params,
            &[t, DType::F32, DType::F16],
            Tolerance::MATMUL,
            move |g| {
                let q = g.leaf(DType::F32, &[hd, nh, n])?;
                let k = g.leaf(DType::F16, &[hd, rows, nkv])?;
                let val = g.leaf(DType::F16, &[hd, rows, nkv])?;
                let mask = g.input(DType::F16, &[rows, n], Init::Mask(0.2))?;
                let wo = g.input(t, &[hd * nh, 256], Init::Uniform(-0.1, 0.1))?;
                let q = g.permute(q, [0, 2, 1, 3])?;
                let scale = 1.0 / (hd as f32).sqrt();
                let att = g.flash_attn_ext(q, k, val, Some(mask), scale, 0.0, 0.0)?;
                let att = g.reshape(att, &[hd * nh, n])?;
                let o = g.mul_mat(wo, att)?;
                if add {
                    let r = g.leaf(DType::F32, &[256, n])?;
                    g.add(r, o)
                } else {
                    Ok(o)
                }
            },
        ));
    }
}

/// A Llama feed-forward block for one token: down(swiglu(gate x, up x)), quantized weights.
fn gate_up_down(v: &mut Vec<Case>) {
    for (t, k, ff) in [
        (DType::Q4_0, 256, 512),
        (DType::Q4_1, 576, 1536),
        (DType::Q8_0, 128, 96),
        (DType::Q4_K, 14336, 256),
    ] {
        let params = format!("type={t},k={k},ff={ff}");
        v.push(Case::new(
            "SWIGLU_MUL_MAT",
            params,
            &[t, DType::F32],
            Tolerance::MATMUL,
            move |g| {
                let x = g.leaf(DType::F32, &[k, 1])?;
                let wd = g.input(t, &[ff, k], Init::Uniform(-0.1, 0.1))?;
                let act = gate_up(g, t, ff, x)?;
                g.mul_mat(wd, act)
            },
        ));
    }
    // Gemma's: GELU-gated, the gate and up in Q5_0 or Q4_K.
    for (t, k, ff) in [(DType::Q5_0, 640, 2048), (DType::Q4_K, 256, 512)] {
        let params = format!("type={t},k={k},ff={ff}");
        v.push(Case::new(
            "GEGLU_MUL_MAT",
            params,
            &[t, DType::F32],
            Tolerance::MATMUL,
            move |g| {
                let x = g.leaf(DType::F32, &[k, 1])?;
                let wd = g.input(DType::Q6_K, &[ff, k], Init::Uniform(-0.1, 0.1))?;
                let act = gated(g, t, ff, x, GluOp::Geglu)?;
                g.mul_mat(wd, act)
            },
        ));
    }
}

/// Three mul_mats of one prompt-sized activation by weights of different types, summed; and
/// Q, K and V of one token's vector and of a prompt.
fn shared_activation(v: &mut Vec<Case>) {
    let types = [DType::Q4_0, DType::Q8_0, DType::F16];
    v.push(Case::new(
        "MUL_MAT_SHARED_B",
        "types=[q4_0,q8_0,f16],k=256,m=64,n=16".to_string(),
        &types,
        Tolerance::MATMUL,
        move |g| {
            let x = g.leaf(DType::F32, &[256, 16])?;
            let mut products = Vec::new();
            for t in types {
                let w = g.input(t, &[256, 64], Init::Uniform(-0.1, 0.1))?;
                products.push(g.mul_mat(w, x)?);
            }
            let s = g.add(products[0], products[1])?;
            g.add(s, products[2])
        },
    ));
    // Q, K and V of one token's plain vector (no norm), K and V of one shape and Q taller: a
    // backend may run the three as one mat-vec; and Q of another type than K and V. Then of a
    // prompt, K and V with a partial tile of rows: a backend may run K and V as one dispatch.
    for (tq, tkv, k, mq, mkv, n) in [
        (DType::Q4_0, DType::Q4_0, 512, 512, 128, 1),
        (DType::Q8_0, DType::Q8_0, 1024, 768, 200, 1),
        (DType::Q8_0, DType::Q4_0, 512, 512, 128, 1),
        (DType::Q4_0, DType::Q4_0, 256, 256, 200, 160),
        (DType::F16, DType::F16, 512, 384, 128, 72),
        (DType::Q8_0, DType::Q8_0, 256, 128, 136, 130),
    ] {
        let params = format!("types=[{tq},{tkv},{tkv}],k={k},m=[{mq},{mkv},{mkv}],n={n}");
        v.push(Case::new(
            "MUL_MAT_SHARED_B",
            params,
            &[tq, tkv, DType::F32],
            Tolerance::MATMUL,
            move |g| {
                let x = g.leaf(DType::F32, &[k, n])?;
                let wq = g.input(tq, &[k, mq], Init::Uniform(-0.1, 0.1))?;
                let wk = g.input(tkv, &[k, mkv], Init::Uniform(-0.1, 0.1))?;
                let wv = g.input(tkv, &[k, mkv], Init::Uniform(-0.1, 0.1))?;
                let q = g.mul_mat(wq, x)?;
                let kk = g.mul_mat(wk, x)?;
                let vv = g.mul_mat(wv, x)?;
                let kv = g.concat(kk, vv, 0)?;
                g.concat(q, kv, 0)
            },
        ));
    }
}

/// A prompt's gate and up with their swiglu, of one activation: a backend may run the two
/// products as one dispatch.
fn prompt_gate_up(v: &mut Vec<Case>) {
    for (t, k, ff, n) in [(DType::Q4_K, 256, 300, 130), (DType::Q4_0, 128, 256, 512)] {
        let params = format!("type={t},k={k},ff={ff},n={n}");
        v.push(Case::new(
            "SWIGLU_MUL_MAT",
            params,
            &[t, DType::F32],
            Tolerance::MATMUL,
            move |g| {
                let x = g.leaf(DType::F32, &[k, n])?;
                gate_up(g, t, ff, x)
            },
        ));
    }
}

/// rms_norm(x) * w, w one row broadcast over x's rows; with `mat` rows of quantized weights
/// after it, their product with the result.
fn rms_norm_mul(v: &mut Vec<Case>) {
    // Row lengths: a model's 576 and 4096, the longest row a thread block holds in registers
    // (16384) and past it, one that is not a multiple of 4; then a non-contiguous x.
    for ne in [[576, 1], [4096, 3], [16384, 2], [20000, 1], [33, 7]] {
        let params = format!("ne={}", ne_str(&ne));
        v.push(Case::new(
            "RMS_NORM_MUL",
            params,
            &[DType::F32],
            Tolerance::DEFAULT,
            move |g| {
                let x = g.leaf(DType::F32, &ne)?;
                let w = g.input(DType::F32, &[ne[0]], Init::Uniform(0.5, 1.5))?;
                let h = g.rms_norm(x, 1e-5)?;
                g.mul(h, w)
            },
        ));
    }
    v.push(Case::new(
        "RMS_NORM_MUL",
        "ne=[256,3,2],per=[0,2,1,3]".to_string(),
        &[DType::F32],
        Tolerance::DEFAULT,
        |g| {
            let x = g.leaf(DType::F32, &[256, 2, 3])?;
            let x = g.permute(x, [0, 2, 1, 3])?;
            let w = g.input(DType::F32, &[256], Init::Uniform(0.5, 1.5))?;
            let h = g.rms_norm(x, 1e-6)?;
            g.mul(h, w)
        },
    ));
    // Q/K norm (Qwen 3, Gemma 3): every head of every token normed over its head_dim and
    // times one head_dim weight.
    for ne in [[128, 8, 5], [256, 4, 1], [64, 9, 3]] {
        v.push(Case::new(
            "RMS_NORM_MUL",
            format!("ne={},heads", ne_str(&ne)),
            &[DType::F32],
            Tolerance::DEFAULT,
            move |g| {
                let x = g.leaf(DType::F32, &ne)?;
                let w = g.input(DType::F32, &[ne[0]], Init::Uniform(0.5, 1.5))?;
                let h = g.rms_norm(x, 1e-6)?;
                g.mul(h, w)
            },
        ));
    }
    for (t, k, n) in [
        (DType::Q4_0, 4096, 1),
        (DType::Q4_1, 576, 1),
        (DType::Q8_0, 4096, 3),
    ] {
        let params = format!("type_a={t},k={k},n={n},m=256");
        v.push(Case::new(
            "RMS_NORM_MUL_MAT",
            params,
            &[t, DType::F32],
            Tolerance::MATMUL,
            move |g| {
                let a = g.input(t, &[k, 256], Init::Uniform(-0.1, 0.1))?;
                let h = normed(g, &[k, n])?;
                g.mul_mat(a, h)
            },
        ));
    }
    norm_readers(v);
}

/// One token's rms_norm(x) * w read by several products with quantized weights, as in a Llama
/// block: Q, K and V (K and V of one shape), or gate and up with their swiglu; and read by a
/// product and by an add of it. A backend may leave the norm to the mat-vecs that read its
/// result (each normalizing its column itself), where nothing else reads it. Q, K and V of
/// several tokens too (sequences decoded together: each column normed on its own).
fn norm_readers(v: &mut Vec<Case>) {
    // (type, k, Q rows, K and V rows, tokens): K types with rows of whole words, and rows
    // longer than the 16384 values a mat-vec may quantize at once (and than the shorter chunks
    // of a mat-vec of several columns).
    let shapes = [
        (DType::Q4_0, 256, 256, 64, 1),
        (DType::Q8_0, 512, 512, 128, 1),
        (DType::Q4_K, 256, 256, 64, 1),
        (DType::Q6_K, 512, 256, 128, 1),
        (DType::Q8_0, 16896, 64, 32, 1),
        (DType::Q4_K, 512, 256, 64, 5),
        (DType::Q6_K, 256, 128, 64, 16),
        (DType::Q4_1, 1024, 64, 32, 8),
        (DType::Q4_0, 16896, 64, 32, 3),
    ];
    for (t, k, mq, mkv, n) in shapes {
        let params = format!("type_a={t},k={k},n={n},readers=q[{mq}]+k[{mkv}]+v[{mkv}]");
        v.push(Case::new(
            "RMS_NORM_MUL_MAT",
            params,
            &[t, DType::F32],
            Tolerance::MATMUL,
            move |g| {
                let wq = g.input(t, &[k, mq], Init::Uniform(-0.1, 0.1))?;
                let wk = g.input(t, &[k, mkv], Init::Uniform(-0.1, 0.1))?;
                let wv = g.input(t, &[k, mkv], Init::Uniform(-0.1, 0.1))?;
                let h = normed(g, &[k, n])?;
                let q = g.mul_mat(wq, h)?;
                let kk = g.mul_mat(wk, h)?;
                let vv = g.mul_mat(wv, h)?;
                let kv = g.concat(kk, vv, 0)?;
                g.concat(q, kv, 0)
            },
        ));
    }
    for (t, k, ff) in [
        (DType::Q4_0, 256, 512),
        (DType::Q8_0, 576, 96),
        (DType::Q4_K, 512, 256),
        (DType::Q6_K, 512, 512),
    ] {
        let params = format!("type_a={t},k={k},n=1,readers=gate[{ff}]+up[{ff}]+swiglu");
        v.push(Case::new(
            "RMS_NORM_MUL_MAT",
            params,
            &[t, DType::F32],
            Tolerance::MATMUL,
            move |g| {
                let h = normed(g, &[k, 1])?;
                gate_up(g, t, ff, h)
            },
        ));
    }
    // Several tokens: gate and up by one normed column each (a backend may quantize the
    // normed columns once for both), and Q and K with a product of other columns between them
    // (which must not disturb what was prepared for K).
    for (t, k, ff, n) in [(DType::Q4_0, 256, 512, 16), (DType::Q4_K, 512, 256, 7)] {
        let params = format!("type_a={t},k={k},n={n},readers=gate[{ff}]+up[{ff}]+swiglu");
        v.push(Case::new(
            "RMS_NORM_MUL_MAT",
            params,
            &[t, DType::F32],
            Tolerance::MATMUL,
            move |g| {
                let h = normed(g, &[k, n])?;
                gate_up(g, t, ff, h)
            },
        ));
    }
    v.push(Case::new(
        "RMS_NORM_MUL_MAT",
        "type_a=q4_0,k=512,n=9,readers=q[128]+other+k[64]",
        &[DType::Q4_0, DType::F32],
        Tolerance::MATMUL,
        |g| {
            let wq = g.input(DType::Q4_0, &[512, 128], Init::Uniform(-0.1, 0.1))?;
            let wo = g.input(DType::Q4_0, &[512, 96], Init::Uniform(-0.1, 0.1))?;
            let wk = g.input(DType::Q4_0, &[512, 64], Init::Uniform(-0.1, 0.1))?;
            let h = normed(g, &[512, 9])?;
            let y = g.leaf(DType::F32, &[512, 9])?;
            let q = g.mul_mat(wq, h)?;
            let o = g.mul_mat(wo, y)?;
            let kk = g.mul_mat(wk, h)?;
            let qo = g.concat(q, o, 0)?;
            g.concat(qo, kk, 0)
        },
    ));
    v.push(Case::new(
        "RMS_NORM_MUL_MAT",
        "type_a=q8_0,k=256,n=1,readers=a[256]+add",
        &[DType::Q8_0, DType::F32],
        Tolerance::MATMUL,
        |g| {
            let a = g.input(DType::Q8_0, &[256, 256], Init::Uniform(-0.1, 0.1))?;
            let h = normed(g, &[256, 1])?;
            let p = g.mul_mat(a, h)?;
            g.add(p, h)
        },
    ));
}

/// Q and K rotated, K and V stored into F16 caches at the rows of this step, then attention
/// over the caches (which reads what was stored).
fn rope_kv(v: &mut Vec<Case>) {
    // (head dim, query heads, kv heads, tokens, cache rows, rope mode, rotation)
    let shapes = [
        (64, 9, 3, 1, 32, RopeMode::Normal, Rotation::Plain),
        (128, 8, 2, 1, 48, RopeMode::Neox, Rotation::Plain),
        (64, 4, 2, 5, 16, RopeMode::Normal, Rotation::Plain),
        (64, 9, 3, 1, 32, RopeMode::Normal, Rotation::Factors),
        (128, 8, 2, 5, 48, RopeMode::Neox, Rotation::Yarn),
    ];
    for (hd, nh, nkv, n, rows, mode, rot) in shapes {
        let params = format!(
            "hd={hd},nh={nh},nkv={nkv},tokens={n},rows={rows},mode={mode:?}{}",
            rot.name()
        );
        v.push(Case::new(
            "ROPE_KV_ATTN",
            params,
            &[DType::F32, DType::F16],
            Tolerance::MATMUL,
            move |g| {
                let p = RopeParams::new(hd, mode, 10000.0, 1.0);
                let q = g.leaf(DType::F32, &[hd, nh, n])?;
                let k = g.leaf(DType::F32, &[hd, nkv, n])?;
                let val = g.leaf(DType::F32, &[hd * nkv, n])?;
                rope_store_attend(g, [q, k, val], [hd, nkv, n, rows], (p, rot), DType::I64)
            },
        ));
    }
}

/// One token's Q, K and V products with quantized weights, then the rope of Q and K and the
/// stores of K and V into F16 caches, read back by attention: a backend may run the products,
/// the rope and the stores as one kernel. Types of both mat-vec geometries; NEOX pairs (left
/// unfused by such a backend) and I32 cache rows too.
fn qkv_rope_kv(v: &mut Vec<Case>) {
    // (weight type, k, head dim, query heads, kv heads, rope mode, rotated dims, cache rows'
    // type, rotation)
    #[rustfmt::skip]
    let shapes = [
        (DType::Q4_0, 256, 64, 4, 2, RopeMode::Normal, 64, DType::I64, Rotation::Plain),
        (DType::Q8_0, 512, 128, 6, 2, RopeMode::Normal, 96, DType::I32, Rotation::Plain),
        (DType::Q4_K, 512, 64, 8, 4, RopeMode::Normal, 64, DType::I64, Rotation::Plain),
        (DType::Q6_K, 256, 128, 4, 1, RopeMode::Normal, 128, DType::I32, Rotation::Plain),
        (DType::Q4_0, 256, 64, 4, 2, RopeMode::Neox, 64, DType::I64, Rotation::Plain),
        (DType::Q6_K, 8192, 64, 4, 2, RopeMode::Normal, 64, DType::I64, Rotation::Plain),
        (DType::Q4_0, 256, 64, 4, 2, RopeMode::Normal, 64, DType::I64, Rotation::Factors),
        (DType::Q8_0, 512, 128, 6, 2, RopeMode::Normal, 96, DType::I32, Rotation::Yarn),
    ];
    for (t, k, hd, nh, nkv, mode, n_dims, it, rot) in shapes {
        let params = format!(
            "type={t},k={k},hd={hd},nh={nh},nkv={nkv},mode={mode:?},n_dims={n_dims},idx={it}{}",
            rot.name()
        );
        v.push(Case::new(
            "QKV_ROPE_KV_ATTN",
            params,
            &[t, DType::F16],
            Tolerance::MATMUL,
            move |g| {
                let p = RopeParams::new(n_dims, mode, 10000.0, 0.5);
                let x = g.leaf(DType::F32, &[k, 1])?;
                let wq = g.input(t, &[k, hd * nh], Init::Uniform(-0.1, 0.1))?;
                let wk = g.input(t, &[k, hd * nkv], Init::Uniform(-0.1, 0.1))?;
                let wv = g.input(t, &[k, hd * nkv], Init::Uniform(-0.1, 0.1))?;
                let q = g.mul_mat(wq, x)?;
                let kk = g.mul_mat(wk, x)?;
                let val = g.mul_mat(wv, x)?;
                let q = g.reshape(q, &[hd, nh, 1])?;
                let kk = g.reshape(kk, &[hd, nkv, 1])?;
                rope_store_attend(g, [q, kk, val], [hd, nkv, 1, 24], (p, rot), it)
            },
        ));
    }
}

/// Q, K and V products of some tokens, each head of Q and K RMS-normed and multiplied by its
/// weights, then the ropes, the cache stores and attention (Qwen 3's and Gemma 3's blocks): a
/// backend may run the norms, ropes and stores as one kernel. Head sizes of Qwen 3 (128, NEOX),
/// Gemma 3 (256) and a small one with adjacent pairs and a partial rotation; one and several
/// tokens.
fn qk_norm_rope_kv(v: &mut Vec<Case>) {
    // (weight type, k, head dim, query heads, kv heads, tokens, rope mode, rotated dims,
    // rotation)
    #[rustfmt::skip]
    let shapes = [
        (DType::Q4_K, 256, 128, 4, 2, 1, RopeMode::Neox, 128, Rotation::Plain),
        (DType::Q4_0, 256, 64, 6, 3, 1, RopeMode::Normal, 32, Rotation::Plain),
        (DType::Q8_0, 256, 256, 2, 1, 1, RopeMode::Neox, 256, Rotation::Plain),
        (DType::Q4_K, 256, 128, 4, 2, 5, RopeMode::Neox, 128, Rotation::Yarn),
        (DType::Q4_0, 256, 64, 4, 4, 3, RopeMode::Normal, 64, Rotation::Factors),
    ];
    for (t, k, hd, nh, nkv, n, mode, n_dims, rot) in shapes {
        let params = format!(
            "type={t},k={k},hd={hd},nh={nh},nkv={nkv},tokens={n},mode={mode:?},n_dims={n_dims}{}",
            rot.name()
        );
        v.push(Case::new(
            "QK_NORM_ROPE_KV_ATTN",
            params,
            &[t, DType::F16],
            Tolerance::MATMUL,
            move |g| {
                let p = RopeParams::new(n_dims, mode, 10000.0, 1.0);
                let x = g.leaf(DType::F32, &[k, n])?;
                let wq = g.input(t, &[k, hd * nh], Init::Uniform(-0.1, 0.1))?;
                let wk = g.input(t, &[k, hd * nkv], Init::Uniform(-0.1, 0.1))?;
                let wv = g.input(t, &[k, hd * nkv], Init::Uniform(-0.1, 0.1))?;
                let wqn = g.input(DType::F32, &[hd], Init::Uniform(0.5, 1.5))?;
                let wkn = g.input(DType::F32, &[hd], Init::Uniform(0.5, 1.5))?;
                let q = g.mul_mat(wq, x)?;
                let kk = g.mul_mat(wk, x)?;
                let val = g.mul_mat(wv, x)?;
                let q = g.reshape(q, &[hd, nh, n])?;
                let kk = g.reshape(kk, &[hd, nkv, n])?;
                let q = g.rms_norm(q, 1e-6)?;
                let q = g.mul(q, wqn)?;
                let kk = g.rms_norm(kk, 1e-6)?;
                let kk = g.mul(kk, wkn)?;
                rope_store_attend(g, [q, kk, val], [hd, nkv, n, 24], (p, rot), DType::I32)
            },
        ));
    }
}

/// What a fused rope case's rotation adds to its plain parameters.
#[derive(Clone, Copy)]
enum Rotation {
    Plain,
    /// Frequency factors (one tensor for Q and K, as Llama 3's) with a magnitude (as
    /// LongRoPE's).
    Factors,
    /// YaRN at a quarter scale over an original context of 4096 with a magnitude, no factors
    /// (Qwen's long-context scaling).
    Yarn,
}

impl Rotation {
    /// The case name's suffix.
    fn name(self) -> &'static str {
        match self {
            Rotation::Plain => "",
            Rotation::Factors => ",factors,attn_factor=1.19",
            Rotation::Yarn => ",freq_scale=0.25,ext_factor=1,attn_factor=0.9",
        }
    }

    /// `p` with this rotation's additions, and its frequency factors (a new input) if any.
    fn apply(self, g: &mut CaseGraph, mut p: RopeParams) -> Result<(RopeParams, Option<TensorId>)> {
        match self {
            Rotation::Plain => Ok((p, None)),
            Rotation::Factors => {
                p.attn_factor = 1.19;
                let f = g.input(DType::F32, &[p.n_dims / 2], Init::Uniform(1.0, 8.0))?;
                Ok((p, Some(f)))
            }
            Rotation::Yarn => {
                p.freq_scale = 0.25;
                p.ext_factor = 1.0;
                p.attn_factor = 0.9;
                p.n_ctx_orig = 4096;
                Ok((p, None))
            }
        }
    }
}

/// Q `[hd, heads, n]` and K `[hd, nkv, n]` rotated at random positions (parameters `p` with
/// rotation `rot`), the rotated K and V (`[hd * nkv, n]`) stored into F16 caches of `rows` rows
/// at distinct rows (indices of type `idx`), then attention of the rotated Q over the caches
/// (which reads what was stored); `dims` = [hd, nkv, n, rows].
fn rope_store_attend(
    g: &mut CaseGraph,
    [q, k, val]: [TensorId; 3],
    [hd, nkv, n, rows]: [usize; 4],
    (p, rot): (RopeParams, Rotation),
    idx: DType,
) -> Result<TensorId> {
    let (p, factors) = rot.apply(g, p)?;
    let pos = g.input(DType::I32, &[n], Init::Indices(4096))?;
    let idx = g.input(idx, &[n], Init::UniqueIndices(rows))?;
    let kc = g.leaf(DType::F16, &[hd * nkv, rows])?;
    let vc = g.leaf(DType::F16, &[hd * nkv, rows])?;
    let mask = g.input(DType::F16, &[rows, n], Init::Mask(0.2))?;
    let qr = g.rope_ext(q, pos, factors, p)?;
    let kr = g.rope_ext(k, pos, factors, p)?;
    let kr = g.reshape(kr, &[hd * nkv, n])?;
    let kc = g.set_rows(kc, kr, idx)?;
    let vc = g.set_rows(vc, val, idx)?;
    let es = 2;
    let kv = g.view(kc, &[hd, nkv, rows], &[hd * es, hd * nkv * es], 0)?;
    let vv = g.view(vc, &[hd, nkv, rows], &[hd * es, hd * nkv * es], 0)?;
    let kv = g.permute(kv, [0, 2, 1, 3])?;
    let vv = g.permute(vv, [0, 2, 1, 3])?;
    let qr = g.permute(qr, [0, 2, 1, 3])?;
    let scale = 1.0 / (hd as f32).sqrt();
    g.flash_attn_ext(qr, kv, vv, Some(mask), scale, 0.0, 0.0)
}

/// `rms_norm(x) * w` for a leaf x of shape `ne` and a weight row w (values in [0.5, 1.5)), as
/// a Llama block's norms make it.
fn normed(g: &mut CaseGraph, ne: &[usize]) -> Result<TensorId> {
    let x = g.leaf(DType::F32, ne)?;
    let w = g.input(DType::F32, &ne[..1], Init::Uniform(0.5, 1.5))?;
    let h = g.rms_norm(x, 1e-5)?;
    g.mul(h, w)
}

/// `swiglu(W_gate x, W_up x)` for activations x (one column or several), with random gate and up weights of type `t` and
/// `ff` rows.
fn gate_up(g: &mut CaseGraph, t: DType, ff: usize, x: TensorId) -> Result<TensorId> {
    gated(g, t, ff, x, GluOp::Swiglu)
}

/// `op(W_gate x, W_up x)` as [`gate_up`], for either gated activation.
fn gated(g: &mut CaseGraph, t: DType, ff: usize, x: TensorId, op: GluOp) -> Result<TensorId> {
    let k = g.get(x).ne[0];
    let wg = g.input(t, &[k, ff], Init::Uniform(-0.1, 0.1))?;
    let wu = g.input(t, &[k, ff], Init::Uniform(-0.1, 0.1))?;
    let gate = g.mul_mat(wg, x)?;
    let up = g.mul_mat(wu, x)?;
    g.glu_split(gate, up, op)
}
