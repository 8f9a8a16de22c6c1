//! Every op of `tessera_core::op`, one family per module, and the dispatcher that checks a
//! node's types ([`check`], also behind `Device::supports_op`) and runs it ([`run`]).

mod act;
mod attention;
mod binary;
mod copy;
mod dot;
mod glu;
mod moe;
mod mul_mat;
mod norm;
mod reduce;
mod rope;
mod rows;
mod shape;
mod softmax;
mod sort;
mod unary;

use tessera_core::graph::Graph;
use tessera_core::{DType, Error, Op, Result, Tensor, TensorId};

use crate::parallel::for_ranges;
use crate::view::TView;

/// Settings of one compute call.
pub(crate) struct Ctx {
    /// `mul_mat` keeps quantized weights' activations in f32.
    pub precise: bool,
}

/// Whether `t` is a float type (F32, F16, BF16).
fn float(t: DType) -> bool {
    t.is_float()
}

/// Whether `t` is a float or block-quantized type (anything rows convert to and from f32).
fn float_or_quant(t: DType) -> bool {
    t.is_float() || t.is_quantized()
}

/// Whether rows can be written in type `t`: a float type or a quantized type tessera
/// quantizes to (not the lattice i-quants, which are only read).
fn writable(t: DType) -> bool {
    t.is_float() || (t.is_quantized() && tessera_core::quant::can_quantize(t))
}

/// The type of source `i` of `t`, or an error when the node lacks it.
fn src_type(graph: &Graph, t: &Tensor, i: usize) -> Result<DType> {
    let id = *t
        .src
        .get(i)
        .ok_or_else(|| Error::Invalid(format!("{} node lacks source {i}", t.op.name())))?;
    if id.index() >= graph.len() {
        return Err(Error::Invalid(format!(
            "{} node has source #{} outside its graph",
            t.op.name(),
            id.0
        )));
    }
    Ok(graph.get(id).dtype)
}

/// Checks that this backend runs node `id`: its op, with its source and result types.
pub(crate) fn check(graph: &Graph, id: TensorId) -> Result<()> {
    if id.index() >= graph.len() {
        return Err(Error::Invalid(format!(
            "node #{} is not in the graph",
            id.0
        )));
    }
    let t = graph.get(id);
    let s = |i| src_type(graph, t, i);
    // Quantized rows are converted whole, so their blocks must be adjacent.
    let quant_rows_ok = |i: usize| {
        t.src.get(i).is_some_and(|&x| {
            let st = graph.get(x);
            !st.dtype.is_quantized() || st.rows_contiguous()
        })
    };
    let ok = match &t.op {
        Op::None | Op::View | Op::Reshape | Op::Permute(_) | Op::Transpose => true,
        Op::Cpy | Op::Cont | Op::Dup => {
            let from = s(0)?;
            let to = t.dtype;
            let convertible = from == to || (float_or_quant(from) && writable(to));
            convertible && quant_rows_ok(0) && (!to.is_quantized() || t.nb[0] == to.type_size())
        }
        Op::GetRows => {
            let a = s(0)?;
            (float_or_quant(a) || a == DType::I32) && s(1)? == DType::I32 && quant_rows_ok(0)
        }
        Op::SetRows => {
            writable(t.dtype)
                && t.nb[0] == t.dtype.type_size()
                && float(s(1)?)
                && matches!(s(2)?, DType::I32 | DType::I64)
        }
        Op::MulMat => {
            let (a, b) = (s(0)?, s(1)?);
            float_or_quant(a) && float(b) && quant_rows_ok(0) && t.dtype == DType::F32
        }
        Op::MulMatId { .. } => {
            let (a, b) = (s(0)?, s(1)?);
            float_or_quant(a)
                && float(b)
                && s(2)? == DType::I32
                && quant_rows_ok(0)
                && t.dtype == DType::F32
        }
        Op::AddId => {
            s(0)? == DType::F32
                && s(1)? == DType::F32
                && s(2)? == DType::I32
                && t.dtype == DType::F32
        }
        Op::Binary(_) => float(s(0)?) && float(s(1)?) && float(t.dtype),
        Op::Scale { .. } | Op::Unary(_) | Op::Clamp { .. } => float(s(0)?) && float(t.dtype),
        Op::Glu { .. } => float(s(0)?) && float(t.dtype) && (t.src.len() == 1 || float(s(1)?)),
        Op::SwigluOai { .. } => s(0)? == DType::F32 && s(1)? == DType::F32 && t.dtype == DType::F32,
        Op::RmsNorm { .. } | Op::Norm { .. } | Op::DiagMaskInf(_) => float(s(0)?) && float(t.dtype),
        Op::SoftMax { .. } => float(s(0)?) && float(t.dtype) && (t.src.len() < 2 || float(s(1)?)),
        Op::Rope(_) => {
            float(s(0)?)
                && float(t.dtype)
                && s(1)? == DType::I32
                && (t.src.len() < 3 || s(2)? == DType::F32)
        }
        Op::FlashAttnExt { sinks, .. } => {
            let n_src = t.src.len() - usize::from(*sinks);
            float(s(0)?)
                && float(s(1)?)
                && float(s(2)?)
                && (n_src < 4 || float(s(3)?))
                && (!sinks || s(n_src)? == DType::F32)
                && t.dtype == DType::F32
        }
        Op::Concat(dim) => *dim < 4 && !s(0)?.is_quantized() && s(1)? == s(0)? && t.dtype == s(0)?,
        Op::Repeat => !s(0)?.is_quantized() && t.dtype == s(0)?,
        Op::Pad(_) => float(s(0)?) && float(t.dtype),
        Op::Sum | Op::SumRows | Op::Mean => float(s(0)?) && t.dtype == DType::F32,
        Op::Argmax => float(s(0)?) && t.dtype == DType::I32,
        Op::Argsort { .. } | Op::TopK(_) => s(0)? == DType::F32 && t.dtype == DType::I32,
        Op::Arange { .. } => float(t.dtype),
        // Sums over the ranks of a device group; the CPU backend joins none.
        Op::AllReduce => false,
    };
    if ok {
        Ok(())
    } else {
        let types: Vec<&str> = t
            .src
            .iter()
            .map(|&x| {
                if x.index() < graph.len() {
                    graph.get(x).dtype.name()
                } else {
                    "?"
                }
            })
            .collect();
        Err(Error::Unsupported {
            backend: "cpu".into(),
            what: format!(
                "{} of ({}) -> {} (tensor '{}')",
                t.op.name(),
                types.join(", "),
                t.dtype,
                t.label(id)
            ),
        })
    }
}

/// Runs node `id` of `graph` (leaves and views do nothing).
pub(crate) fn run(ctx: &Ctx, graph: &Graph, id: TensorId) -> Result<()> {
    check(graph, id)?;
    let t = graph.get(id);
    if matches!(t.op, Op::None) || t.op.is_view() || t.nelements() == 0 {
        return Ok(());
    }
    let dst = TView::new(graph, id, true)?;
    let src = |i: usize| {
        let id = t
            .src
            .get(i)
            .ok_or_else(|| Error::Invalid(format!("{} node lacks source {i}", t.op.name())))?;
        TView::new(graph, *id, false)
    };
    let opt = |i: usize| {
        t.src
            .get(i)
            .map(|&x| TView::new(graph, x, false))
            .transpose()
    };
    match &t.op {
        Op::None | Op::View | Op::Reshape | Op::Permute(_) | Op::Transpose => Ok(()),
        Op::Cpy | Op::Cont | Op::Dup => copy::run(&dst, &src(0)?),
        Op::GetRows => rows::get_rows(&dst, &src(0)?, &src(1)?),
        Op::SetRows => rows::set_rows(&dst, &src(1)?, &src(2)?),
        Op::MulMat => mul_mat::run(ctx, &dst, &src(0)?, &src(1)?),
        Op::MulMatId { first } => moe::mul_mat_id(ctx, &dst, &src(0)?, &src(1)?, &src(2)?, *first),
        Op::AddId => moe::add_id(&dst, &src(0)?, &src(1)?, &src(2)?),
        Op::Binary(op) => binary::run(*op, &dst, &src(0)?, &src(1)?),
        Op::Scale { scale, bias } => {
            let (s, b) = (*scale, *bias);
            unary::map(&dst, &src(0)?, move |x| x * s + b)
        }
        Op::Unary(op) => unary::map(&dst, &src(0)?, act::unary_fn(*op)),
        Op::Clamp { min, max } => {
            let (lo, hi) = (*min, *max);
            unary::map(&dst, &src(0)?, move |x| x.max(lo).min(hi))
        }
        Op::Glu { op, swapped } => glu::run(*op, *swapped, &dst, &src(0)?, opt(1)?.as_ref()),
        Op::SwigluOai { alpha, limit } => glu::swiglu_oai(&dst, &src(0)?, &src(1)?, *alpha, *limit),
        Op::RmsNorm { eps } => norm::rms_norm(&dst, &src(0)?, *eps),
        Op::Norm { eps } => norm::norm(&dst, &src(0)?, *eps),
        Op::SoftMax { scale, max_bias } => {
            softmax::soft_max(&dst, &src(0)?, opt(1)?.as_ref(), *scale, *max_bias)
        }
        Op::DiagMaskInf(n_past) => softmax::diag_mask_inf(&dst, &src(0)?, *n_past),
        Op::Rope(p) => rope::run(p, &dst, &src(0)?, &src(1)?, opt(2)?.as_ref()),
        Op::FlashAttnExt {
            scale,
            max_bias,
            logit_softcap,
            sinks,
        } => {
            // The sinks are the last source, after the optional mask.
            let n_src = t.src.len() - usize::from(*sinks);
            let mask = if n_src > 3 { Some(src(3)?) } else { None };
            let sinks = if *sinks { Some(src(n_src)?) } else { None };
            attention::run(
                &attention::Params {
                    scale: *scale,
                    max_bias: *max_bias,
                    softcap: *logit_softcap,
                },
                &dst,
                [&src(0)?, &src(1)?, &src(2)?],
                mask.as_ref(),
                sinks.as_ref(),
            )
        }
        Op::Concat(dim) => shape::concat(&dst, &src(0)?, &src(1)?, *dim),
        Op::Repeat => shape::repeat(&dst, &src(0)?),
        Op::Pad(_) => shape::pad(&dst, &src(0)?),
        Op::Arange { start, step, .. } => shape::arange(&dst, *start, *step),
        Op::Sum => reduce::sum(&dst, &src(0)?),
        Op::SumRows => reduce::sum_rows(&dst, &src(0)?, false),
        Op::Mean => reduce::sum_rows(&dst, &src(0)?, true),
        Op::Argmax => reduce::argmax(&dst, &src(0)?),
        Op::Argsort { descending } => sort::sorted_indices(&dst, &src(0)?, *descending),
        Op::TopK(_) => sort::sorted_indices(&dst, &src(0)?, true),
        Op::AllReduce => Err(Error::Unsupported {
            backend: "cpu".into(),
            what: "ALL_REDUCE (the CPU backend joins no device group)".into(),
        }),
    }
}

/// Runs `f(row index, src row, dst row)` for every row of `dst`, reading the same row of `src`
/// into f32 first and storing the result after (so `dst` may share `src`'s memory). `cost` is
/// the work per element, for the parallel split.
fn map_rows<F>(dst: &TView, src: &TView, cost: usize, f: F) -> Result<()>
where
    F: Fn([usize; 3], &[f32], &mut [f32]) + Sync,
{
    let (n_in, n_out) = (src.ne[0], dst.ne[0]);
    for_ranges(dst.nrows(), n_out * cost, |rows| {
        let mut a = vec![0f32; n_in];
        let mut out = vec![0f32; n_out];
        for r in rows {
            let i = dst.row_index(r);
            src.load_row(i, &mut a)?;
            f(i, &a, &mut out);
            dst.store_row(i, &out)?;
        }
        Ok(())
    })
}

/// Each dim's index modulo `ne` (broadcasting a smaller tensor).
fn wrap(i: [usize; 3], ne: [usize; 4]) -> [usize; 3] {
    [i[0] % ne[1], i[1] % ne[2], i[2] % ne[3]]
}
