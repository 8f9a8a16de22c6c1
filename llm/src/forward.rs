//! The Llama forward pass as a tessera graph: one graph per step shape (tokens in the batch,
//! KV cells attended, which logits are wanted), reused while the shape stays the same.

use tessera_core::{DType, Graph, Result, RopeParams, TensorId};

use crate::config::LlamaConfig;
use crate::kv_cache::KvCache;
use crate::weights::Weights;

/// The shape of one step.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct StepShape {
    /// Tokens in the batch.
    pub n_tokens: usize,
    /// KV cells attended (a multiple of the padding, at most the cache size).
    pub n_kv: usize,
    /// Logits for every token (true) or only the last.
    pub all_logits: bool,
}

/// The graph's inputs and output.
#[derive(Clone, Copy, Debug)]
pub struct StepIo {
    /// I32 `[n_tokens]`: token ids.
    pub tokens: TensorId,
    /// I32 `[n_tokens]`: positions.
    pub pos: TensorId,
    /// I64 `[n_tokens]`: KV cache rows written.
    pub kv_rows: TensorId,
    /// F16 `[n_kv, n_tokens]`: 0 where a token may attend a cell, -inf elsewhere.
    pub mask: TensorId,
    /// F32 `[n_vocab, n_out]`: the logits.
    pub logits: TensorId,
}

fn w(g: &mut Graph, weights: &Weights, name: &str, ne: &[usize]) -> Result<TensorId> {
    let t = weights.expect(name, ne)?;
    g.weight(name, t.dtype, &t.ne, t.buffer.clone(), t.offset)
}

/// Builds the forward graph for one step.
pub fn build(
    cfg: &LlamaConfig,
    weights: &Weights,
    kv: &KvCache,
    shape: StepShape,
) -> Result<(Graph, StepIo)> {
    let mut g = Graph::new();
    let n = shape.n_tokens;
    let (d, hd) = (cfg.n_embd, cfg.head_dim);
    let (nh, nkv) = (cfg.n_head, cfg.n_head_kv);
    let n_embd_q = hd * nh;
    let n_embd_kv = cfg.n_embd_kv();

    let tokens = g.input("tokens", DType::I32, &[n])?;
    let pos = g.input("pos", DType::I32, &[n])?;
    let kv_rows = g.input("kv_rows", DType::I64, &[n])?;
    let mask = g.input("kq_mask", DType::F16, &[shape.n_kv, n])?;

    let tok_embd = w(&mut g, weights, "token_embd.weight", &[d, cfg.n_vocab])?;
    let mut x = g.get_rows(tok_embd, tokens)?;
    let rope = RopeParams::new(cfg.n_rot, cfg.rope_mode, cfg.rope_base, cfg.rope_freq_scale);
    let kq_scale = 1.0 / (hd as f32).sqrt();
    let ts = kv.dtype().type_size();

    for l in 0..cfg.n_layer {
        let p = |s: &str| format!("blk.{l}.{s}.weight");
        // attention
        let norm = w(&mut g, weights, &p("attn_norm"), &[d])?;
        let cur = g.rms_norm(x, cfg.rms_eps)?;
        let cur = g.mul(cur, norm)?;
        let wq = w(&mut g, weights, &p("attn_q"), &[d, n_embd_q])?;
        let wk = w(&mut g, weights, &p("attn_k"), &[d, n_embd_kv])?;
        let wv = w(&mut g, weights, &p("attn_v"), &[d, n_embd_kv])?;
        let q = g.mul_mat(wq, cur)?;
        let k = g.mul_mat(wk, cur)?;
        let v = g.mul_mat(wv, cur)?;
        let q = g.reshape(q, &[hd, nh, n])?;
        let k = g.reshape(k, &[hd, nkv, n])?;
        let q = g.rope(q, pos, rope)?;
        let k = g.rope(k, pos, rope)?;
        let k = g.reshape(k, &[n_embd_kv, n])?;

        let kc = kv.tensor(&mut g, l, false, n_embd_kv)?;
        let vc = kv.tensor(&mut g, l, true, n_embd_kv)?;
        let kc = g.set_rows(kc, k, kv_rows)?;
        let vc = g.set_rows(vc, v, kv_rows)?;
        let kview = g.view(kc, &[hd, nkv, shape.n_kv], &[hd * ts, n_embd_kv * ts], 0)?;
        let vview = g.view(vc, &[hd, nkv, shape.n_kv], &[hd * ts, n_embd_kv * ts], 0)?;
        let kview = g.permute(kview, [0, 2, 1, 3])?;
        let vview = g.permute(vview, [0, 2, 1, 3])?;
        let q = g.permute(q, [0, 2, 1, 3])?;
        let att = g.flash_attn_ext(q, kview, vview, Some(mask), kq_scale, 0.0, 0.0)?;
        let att = g.reshape(att, &[n_embd_q, n])?;
        let wo = w(&mut g, weights, &p("attn_output"), &[n_embd_q, d])?;
        let o = g.mul_mat(wo, att)?;
        x = g.add(x, o)?;

        // feed-forward
        let norm = w(&mut g, weights, &p("ffn_norm"), &[d])?;
        let cur = g.rms_norm(x, cfg.rms_eps)?;
        let cur = g.mul(cur, norm)?;
        let wg = w(&mut g, weights, &p("ffn_gate"), &[d, cfg.n_ff])?;
        let wu = w(&mut g, weights, &p("ffn_up"), &[d, cfg.n_ff])?;
        let wd = w(&mut g, weights, &p("ffn_down"), &[cfg.n_ff, d])?;
        let gate = g.mul_mat(wg, cur)?;
        let up = g.mul_mat(wu, cur)?;
        let act = g.swiglu_split(gate, up)?;
        let down = g.mul_mat(wd, act)?;
        x = g.add(x, down)?;
        g.set_name(x, format!("l_out-{l}"));
    }

    if !shape.all_logits && n > 1 {
        let row = g.get(x).nb[1];
        x = g.view(x, &[d, 1], &[row], (n - 1) * row)?;
    }
    let norm = w(&mut g, weights, "output_norm.weight", &[d])?;
    let cur = g.rms_norm(x, cfg.rms_eps)?;
    let cur = g.mul(cur, norm)?;
    let out_name = if weights.find("output.weight").is_some() {
        "output.weight"
    } else {
        "token_embd.weight"
    };
    let out_w = if out_name == "token_embd.weight" {
        tok_embd
    } else {
        w(&mut g, weights, out_name, &[d, cfg.n_vocab])?
    };
    let logits = g.mul_mat(out_w, cur)?;
    g.set_name(logits, "logits");
    g.set_output(logits);
    Ok((
        g,
        StepIo {
            tokens,
            pos,
            kv_rows,
            mask,
            logits,
        },
    ))
}
