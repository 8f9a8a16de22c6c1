//! From graph nodes to shader launches: which ops and types the backend runs
//! ([`supported`]), and for each node the pipeline variant, the tensors to bind, the
//! parameters and the workgroup counts ([`launches`]).
//!
//! [`supported`] and [`launches`] share one decision per op ([`plan`]), which hands each op
//! family to its file (one per family of shaders), so that `Device::supports_op` says true
//! exactly when a launch can be built. Each family's file also lists the variants its plan
//! can ask for (`variants`, test builds), which the naga test validates.

mod attention;
mod elementwise;
mod matmul;
mod misc;
mod moe;
mod norm;
mod rope;
mod rows;

use bytemuck::{Pod, Zeroable};
use tessera_core::{DType, Error, Graph, Op, Result, Tensor, TensorId};

use crate::context::Gpu;
use crate::keys::Key;
use crate::shader::Variant;

pub(crate) use matmul::{
    mat_vec_q_norm, mat_vec_q_reshaped, quant_cols_plan, read_quantized, reads_quantized,
    NORM_W_BINDING,
};
pub(crate) use moe::{mul_mat_id_glu, router_plan, weighted_sum_plan};
pub(crate) use rope::rope_kv_key;

/// One op's parameter block, laid out as `Params` in `shaders/common.wgsl`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
pub(crate) struct Params {
    /// ne then nb of dst, src0, src1, src2, src3.
    pub desc: [[u32; 8]; 5],
    /// Byte offsets of dst, src0, src1, src2 (filled when the bindings are resolved).
    pub off: [u32; 4],
    /// src3's byte offset, then op integers (or, for a sixth binding, its byte offset).
    pub off4: [u32; 4],
    /// Op floats.
    pub f: [f32; 4],
    /// More op floats.
    pub g: [f32; 4],
    /// Op integers.
    pub u: [u32; 4],
    /// More op integers (to 256 bytes).
    pub h: [u32; 4],
}

impl Params {
    /// Sets the byte offset of storage binding `k` (0 = dst; 4 to 7 in off4; 8 and 9, which
    /// only the mat-vec with the fused rope has, in h.x and h.y).
    pub fn set_offset(&mut self, k: usize, off: u32) {
        if k < 4 {
            self.off[k] = off;
        } else if k < 8 {
            self.off4[k - 4] = off;
        } else {
            self.h[k - 8] = off;
        }
    }
}

/// One storage binding of a launch: a tensor, or a part of it, or the device's scratch buffer.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Bind {
    /// The tensor (for the scratch: the node whose launches use it).
    pub id: TensorId,
    /// Bytes from the tensor's first byte to the part bound.
    pub skip: usize,
    /// Bytes of the part (`None`: to the tensor's end).
    pub span: Option<usize>,
    /// Whether this binds the device's scratch buffer ([`crate::context::Gpu::scratch`], at
    /// least `span` bytes from its start) instead of the tensor: where one launch of a node
    /// leaves partial results for a later launch of the same node to read (the split
    /// flash-attention decode). Nothing else uses the scratch between those launches, since a
    /// graph's dispatches run in order.
    pub scratch: bool,
}

impl Bind {
    /// The whole of tensor `id`.
    pub fn whole(id: TensorId) -> Bind {
        Bind {
            id,
            skip: 0,
            span: None,
            scratch: false,
        }
    }

    /// `bytes` of the device's scratch buffer, for node `id`.
    pub fn scratch(id: TensorId, bytes: usize) -> Bind {
        Bind {
            id,
            skip: 0,
            span: Some(bytes),
            scratch: true,
        }
    }
}

/// One dispatch.
pub(crate) struct Launch {
    /// The pipeline.
    pub variant: Variant,
    /// Tensors bound in order: dst, then the sources (unused slots repeat dst).
    pub bind: Vec<Bind>,
    /// Parameters (offsets filled later).
    pub params: Params,
    /// Workgroup counts.
    pub groups: [u32; 3],
}

/// Float types the element-wise shaders read and write.
const FLOATS: [DType; 3] = [DType::F32, DType::F16, DType::BF16];

/// The newer quantized types the shaders read (dequantize, mat-vec, mat-mat) but do not write:
/// the table types, the ternary types and the lattice i-quants (whose shaders bind the grids:
/// [`crate::grids`]).
const READ_ONLY_QUANTS: [DType; 12] = [
    DType::IQ4_NL,
    DType::IQ4_XS,
    DType::MXFP4,
    DType::TQ1_0,
    DType::TQ2_0,
    DType::IQ1_S,
    DType::IQ1_M,
    DType::IQ2_XXS,
    DType::IQ2_XS,
    DType::IQ2_S,
    DType::IQ3_XXS,
    DType::IQ3_S,
];

/// Whether the shaders read quantized type `t`: every classic type and [`READ_ONLY_QUANTS`].
fn readable_quant(t: DType) -> bool {
    DType::QUANTIZED.contains(&t) || READ_ONLY_QUANTS.contains(&t)
}

/// Why a node cannot run here.
fn unsupported(gpu: &Gpu, graph: &Graph, id: TensorId, why: impl std::fmt::Display) -> Error {
    let t = graph.get(id);
    Error::Unsupported {
        backend: gpu.name.clone(),
        what: format!("{} of '{}' ({})", t.op.name(), graph.label(id), why),
    }
}

/// The shape and strides of a tensor as the shaders see them.
pub(crate) fn desc(t: &Tensor) -> [u32; 8] {
    let mut d = [0u32; 8];
    for i in 0..4 {
        d[i] = t.ne[i] as u32;
        d[4 + i] = t.nb[i] as u32;
    }
    d
}

/// Whether every count and byte offset of a tensor fits the shaders' u32 arithmetic.
fn fits_u32(t: &Tensor) -> bool {
    t.nbytes() < u32::MAX as usize / 2
        && t.nelements() < u32::MAX as usize / 2
        && t.nb.iter().all(|&b| b < u32::MAX as usize / 2)
}

/// Whether tensor `id`, bound from `skip` bytes on, starts at an `n`-byte aligned offset in its
/// binding and has `n`-byte aligned row, plane and batch strides, so that a shader may read its
/// rows with `n`-byte loads (false when it has no memory yet).
pub(crate) fn aligned(gpu: &Gpu, graph: &Graph, id: TensorId, skip: usize, n: usize) -> bool {
    (gpu.limits.min_storage_buffer_offset_alignment as usize).is_multiple_of(n)
        && graph
            .data(id)
            .is_some_and(|d| (d.offset + skip).is_multiple_of(n))
        && graph.get(id).nb[1..].iter().all(|&b| b.is_multiple_of(n))
}

/// Workgroup counts for `n` workgroups laid out over x then y.
fn grid(n: usize) -> Option<[u32; 3]> {
    let n = n.max(1);
    let x = n.min(65535);
    let y = n.div_ceil(x);
    (y <= 65535).then_some([x as u32, y as u32, 1])
}

/// The decision for one node: a variant, the tensors to bind, parameters, workgroups.
pub(crate) struct PlanOut {
    /// The pipeline.
    pub variant: Variant,
    /// Tensors bound in order (as [`Launch::bind`]).
    pub bind: Vec<Bind>,
    /// Parameters.
    pub params: Params,
    /// Workgroups, laid out by [`grid`] (unless `groups_3d`).
    pub groups: usize,
    /// Workgroup counts as they are.
    pub groups_3d: Option<[u32; 3]>,
}

/// What a family's plan is given: the device, the graph, the node and its sources, and the
/// largest tensor a storage binding takes.
pub(crate) struct Node<'a> {
    pub gpu: &'a Gpu,
    pub graph: &'a Graph,
    pub id: TensorId,
    pub t: &'a Tensor,
    pub srcs: Vec<&'a Tensor>,
    /// Bytes a tensor may have to be bound whole.
    pub usable: usize,
}

/// Decides how node `id` runs (one launch, or several: a mul_mat whose weights are split
/// across bindings, a flash attention decode split over the keys and its merge), or why it
/// cannot.
pub(crate) fn plan(
    gpu: &Gpu,
    graph: &Graph,
    id: TensorId,
) -> std::result::Result<Vec<PlanOut>, String> {
    let t = graph.get(id);
    let srcs: Vec<&Tensor> = t.src.iter().map(|&s| graph.get(s)).collect();
    // A mul_mat's weights may be larger: they are bound in row ranges (`matmul`).
    let whole = srcs
        .iter()
        .enumerate()
        .filter(|&(k, _)| !(k == 0 && t.op == Op::MulMat))
        .map(|(_, s)| *s);
    if srcs
        .first()
        .is_some_and(|a| a.nb.iter().any(|&b| b >= u32::MAX as usize / 2))
    {
        return Err("strides too large for 32-bit indexing".into());
    }
    let usable = (gpu.max_binding() as usize)
        .saturating_sub(gpu.limits.min_storage_buffer_offset_alignment as usize + 16);
    for x in std::iter::once(t).chain(whole) {
        if !fits_u32(x) {
            return Err(format!(
                "a tensor of {:?} is too large for 32-bit indexing",
                x.ne
            ));
        }
        if x.nbytes() > usable {
            return Err(format!(
                "a tensor of {} bytes exceeds the largest storage binding ({usable} bytes)",
                x.nbytes()
            ));
        }
    }
    let mut p = Params::default();
    p.desc[0] = desc(t);
    for (k, s) in srcs.iter().enumerate().take(4) {
        p.desc[k + 1] = desc(s);
    }
    let n = Node {
        gpu,
        graph,
        id,
        t,
        srcs,
        usable,
    };
    match &t.op {
        Op::Unary(_) | Op::Scale { .. } | Op::Clamp { .. } => elementwise::unary(&n, p),
        Op::Cpy | Op::Cont | Op::Dup => elementwise::copy(&n, p),
        Op::Binary(b) => elementwise::binary(&n, p, *b),
        Op::Glu { op, swapped } => elementwise::glu(&n, p, *op, *swapped),
        Op::SwigluOai { alpha, limit } => elementwise::swiglu_oai(&n, p, *alpha, *limit),
        Op::RmsNorm { eps } | Op::Norm { eps } => Ok(norm::norm(&n, p, *eps)),
        Op::SoftMax { scale, max_bias } => attention::soft_max(&n, p, *scale, *max_bias),
        Op::Rope(r) => rope::rope(&n, p, r),
        Op::GetRows => rows::get_rows(&n, p),
        Op::SetRows => rows::set_rows(&n, p),
        Op::MulMat => matmul::mul_mat(&n, p),
        Op::FlashAttnExt {
            scale,
            max_bias,
            logit_softcap,
            sinks,
        } => attention::flash_attn(&n, p, [*scale, *max_bias, *logit_softcap], *sinks),
        Op::SumRows | Op::Mean | Op::Argmax | Op::Sum => misc::reduce(&n, p),
        Op::MulMatId { first } => moe::mul_mat_id(&n, p, *first),
        Op::AddId => moe::add_id(&n, p),
        Op::Argsort { .. } | Op::TopK(_) => moe::sort(&n, p),
        Op::Concat(_) | Op::Repeat | Op::Pad(_) | Op::DiagMaskInf(_) | Op::Arange { .. } => {
            misc::shape(&n, p)
        }
        op => Err(format!("op {}", op.name())),
    }
}

/// An element-wise plan: `count` invocations, in workgroups of the key's size.
fn ew(key: Key, bind: Vec<TensorId>, mut p: Params, count: usize) -> Vec<PlanOut> {
    p.u[0] = count as u32;
    let wg = key.workgroup_size() as usize;
    vec![PlanOut {
        variant: Variant::new(key),
        bind: bind.into_iter().map(Bind::whole).collect(),
        params: p,
        groups: count.div_ceil(wg),
        groups_3d: None,
    }]
}

/// A row family's plan: one workgroup per row.
fn per_row(key: Key, bind: Vec<TensorId>, params: Params, n_rows: usize) -> Vec<PlanOut> {
    vec![PlanOut {
        variant: Variant::new(key),
        bind: bind.into_iter().map(Bind::whole).collect(),
        params,
        groups: n_rows,
        groups_3d: None,
    }]
}

/// Checks that node `id` can run on this device.
pub(crate) fn supported(gpu: &Gpu, graph: &Graph, id: TensorId) -> Result<()> {
    let t = graph.get(id);
    if t.op.is_view() || t.op == Op::None {
        return Ok(());
    }
    plan(gpu, graph, id)
        .map(|_| ())
        .map_err(|why| unsupported(gpu, graph, id, why))
}

/// The launches of node `id` (none for views and leaves).
pub(crate) fn launches(gpu: &Gpu, graph: &Graph, id: TensorId) -> Result<Vec<Launch>> {
    let t = graph.get(id);
    if t.op.is_view() || t.op == Op::None || t.nelements() == 0 {
        return Ok(Vec::new());
    }
    let plans = plan(gpu, graph, id).map_err(|why| unsupported(gpu, graph, id, why))?;
    let mut out = Vec::with_capacity(plans.len() + 1);
    // Mat-vecs that read their columns pre-quantized: one dispatch quantizes them first, for
    // every row range.
    if let Some(first) = plans.iter().find(|p| reads_quantized(p)) {
        let q = quant_cols_plan(gpu, graph, id, first.bind[2].id, None);
        out.push(to_launch(gpu, graph, id, q)?);
    }
    for p in plans {
        let p = if reads_quantized(&p) {
            read_quantized(graph, id, p)
        } else {
            p
        };
        out.push(to_launch(gpu, graph, id, p)?);
    }
    Ok(out)
}

/// The launch of a plan made for node `id`: its workgroup counts, and its bindings padded to
/// the family's count with the destination.
pub(crate) fn to_launch(gpu: &Gpu, graph: &Graph, id: TensorId, out: PlanOut) -> Result<Launch> {
    let groups = match out.groups_3d {
        Some(g) => g,
        None => {
            grid(out.groups).ok_or_else(|| unsupported(gpu, graph, id, "too many workgroups"))?
        }
    };
    let mut bind = out.bind;
    let n = out.variant.storage_bindings();
    while bind.len() < n {
        bind.push(bind[0]);
    }
    Ok(Launch {
        variant: out.variant,
        bind,
        params: out.params,
        groups,
    })
}

/// Every variant [`plan`] can ask for in `family` (with subgroups on or off), for the naga test.
#[cfg(test)]
pub(crate) fn variants(family: crate::shader::Family, subgroups: bool) -> Vec<Variant> {
    let keys = [
        elementwise::unary_variants(),
        elementwise::binary_variants(),
        elementwise::glu_variants(),
        norm::variants(),
        attention::soft_max_variants(),
        rope::variants(),
        rows::variants(),
        matmul::variants(subgroups),
        attention::variants(subgroups),
        misc::reduce_variants(),
        misc::shape_variants(),
        moe::variants(subgroups),
    ];
    keys.into_iter()
        .flatten()
        .filter(|k| k.entry().0 == family)
        .map(Variant::new)
        .collect()
}
