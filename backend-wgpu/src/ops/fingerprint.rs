//! The fingerprint of a graph's nodes: everything that decides their launches, so that a
//! recording made for it is replayed only while they stay the same.

use tessera_core::{Graph, Op, RopeMode, TensorId};

use crate::buffer::WgpuBuffer;

/// Appends to `out` everything about `nodes` that decides their launches: each node's and
/// source's op and op parameters, type, shape, strides and memory (buffer id and offset).
pub(crate) fn fingerprint(graph: &Graph, nodes: &[TensorId], out: &mut Vec<u64>) {
    for &id in nodes {
        let t = graph.get(id);
        out.push(u64::from(id.0));
        op_words(&t.op, out);
        tensor_words(graph, id, out);
        for &s in &t.src {
            tensor_words(graph, s, out);
        }
    }
}

/// A tensor's type, shape, strides and memory, as words.
fn tensor_words(graph: &Graph, id: TensorId, out: &mut Vec<u64>) {
    let t = graph.get(id);
    out.push(u64::from(t.dtype.gguf_id()));
    out.extend(t.ne.iter().chain(&t.nb).map(|&x| x as u64));
    match graph.data(id) {
        Some(d) => {
            let buffer = d
                .buffer
                .as_any()
                .downcast_ref::<WgpuBuffer>()
                .map_or(u64::MAX, |b| b.id);
            out.extend([buffer, d.offset as u64]);
        }
        None => out.extend([u64::MAX, u64::MAX]),
    }
}

/// An op and its parameters, as words.
fn op_words(op: &Op, out: &mut Vec<u64>) {
    let f = |x: f32| u64::from(x.to_bits());
    let name = op
        .name()
        .bytes()
        .fold(0u64, |h, b| h.wrapping_mul(31).wrapping_add(u64::from(b)));
    out.push(name);
    match op {
        Op::Permute(a) | Op::Pad(a) => out.extend(a.iter().map(|&x| x as u64)),
        Op::Scale { scale: a, bias: b }
        | Op::Clamp { min: a, max: b }
        | Op::SoftMax {
            scale: a,
            max_bias: b,
        } => out.extend([f(*a), f(*b)]),
        Op::Glu { swapped, .. } => out.push(u64::from(*swapped)),
        Op::RmsNorm { eps } | Op::Norm { eps } => out.push(f(*eps)),
        Op::Rope(p) => out.extend([
            p.n_dims as u64,
            u64::from(p.mode == RopeMode::Neox),
            f(p.freq_base),
            f(p.freq_scale),
        ]),
        Op::FlashAttnExt {
            scale,
            max_bias,
            logit_softcap,
        } => out.extend([f(*scale), f(*max_bias), f(*logit_softcap)]),
        Op::Concat(x) | Op::DiagMaskInf(x) => out.push(*x as u64),
        Op::Arange { start, stop, step } => out.extend([f(*start), f(*stop), f(*step)]),
        _ => {}
    }
}
