//! flash_attn_ext: for each query row, softmax(s) v with s_j = softcap(scale * q.k_j) +
//! slope * mask_j, where softcap(x) = c * tanh(x / c) when c != 0. Query head h uses kv head
//! h / (heads / kv_heads). The result is [dv, heads, n_q, batch]. With sinks, head h's sink is
//! one more logit in the soft-max whose weight multiplies no value.

use tessera_core::{Graph, Result, TensorId};

use super::io::{self, Vals};
use super::softmax::{alibi_slope, softmax_row};

/// Attention parameters.
struct Params {
    scale: f64,
    max_bias: f64,
    softcap: f64,
}

/// Computes node `id`.
pub(super) fn flash_attn_ext(
    g: &Graph,
    id: TensorId,
    scale: f64,
    max_bias: f64,
    softcap: f64,
    sinks: bool,
) -> Result<()> {
    let (q, k, v) = (io::src(g, id, 0)?, io::src(g, id, 1)?, io::src(g, id, 2)?);
    let n_src = g.get(id).src.len() - usize::from(sinks);
    let mask = if n_src > 3 {
        Some(io::src(g, id, 3)?)
    } else {
        None
    };
    let sinks = if sinks {
        Some(io::src(g, id, n_src)?)
    } else {
        None
    };
    let p = Params {
        scale,
        max_bias,
        softcap,
    };
    let ne = g.get(id).ne; // [dv, heads, n_q, batch]
    let mut out = vec![0.0; ne.iter().product()];
    for b in 0..q.ne[3] {
        for h in 0..q.ne[2] {
            for i in 0..q.ne[1] {
                let sink = sinks.as_ref().map(|s| s.v[h]);
                let o = attend(&q, &k, &v, mask.as_ref(), sink, &p, [i, h, b]);
                let s = crate::tensor_io::flat(ne, 0, h, i, b);
                out[s..s + ne[0]].copy_from_slice(&o);
            }
        }
    }
    io::write(g, id, &out)
}

/// The output row of query `i` of head `h` in batch `b`.
fn attend(
    q: &Vals,
    k: &Vals,
    v: &Vals,
    mask: Option<&Vals>,
    sink: Option<f64>,
    p: &Params,
    [i, h, b]: [usize; 3],
) -> Vec<f64> {
    let n_kv = k.ne[1];
    let kh = h / (q.ne[2] / k.ne[2]).max(1);
    let kb = b / (q.ne[3] / k.ne[3]).max(1);
    let slope = alibi_slope(p.max_bias, q.ne[2], h);
    let qrow = q.row(i, h, b);
    let logits: Vec<f64> = (0..n_kv)
        .map(|j| {
            let dot: f64 = qrow.iter().zip(k.row(j, kh, kb)).map(|(x, y)| x * y).sum();
            let mut s = dot * p.scale;
            if p.softcap != 0.0 {
                s = p.softcap * (s / p.softcap).tanh();
            }
            s + mask.map_or(0.0, |m| slope * m.at(j, i, h % m.ne[2], b % m.ne[3]))
        })
        .collect();
    let mut logits = logits;
    logits.extend(sink);
    let mut w = Vec::with_capacity(logits.len());
    softmax_row(&logits, &mut w);
    w.truncate(n_kv);
    let mut o = vec![0.0; v.ne[0]];
    for (j, wj) in w.iter().enumerate() {
        for (acc, x) in o.iter_mut().zip(v.row(j, kh, kb)) {
            *acc += wj * x;
        }
    }
    o
}
