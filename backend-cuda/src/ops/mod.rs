//! Encoding graph nodes into commands, and which nodes can be encoded.
//!
//! [`Encoder`] turns each node into kernel launches and GEMMs ([`crate::cmd`]). Nothing runs
//! while encoding: an unsupported node or a tensor outside this device's memory is an error
//! before any work is queued. Temporary memory an op needs (quantized activations, a converted
//! operand, dequantized weights) comes from the backend's scratch arena; nodes run in stream
//! order, so every node may use the arena from its start. The encoder records the largest
//! need; when the arena is too small the backend grows it and encodes again. Kernels that count
//! finished blocks use the backend's counters ([`Encoder::counters`]), which stay zeroed.

mod attention;
mod comm;
mod copy;
mod elementwise;
mod fused;
mod matmul;
mod misc;
mod moe;
mod norm;
mod rope;
mod rows;

use tessera_core::dtype::DType;
use tessera_core::fusion::Matcher;
use tessera_core::{Error, Graph, Op, Result, TensorId};

use crate::cmd::{Cmd, KParams, TArg};
use crate::driver::DeviceShared;
use crate::kernels::Build;
use crate::memory::{CudaBuffer, ALIGNMENT};

/// Builds the command list of a graph's nodes.
pub(crate) struct Encoder<'a> {
    pub dev: &'a DeviceShared,
    pub graph: &'a Graph,
    pub cmds: Vec<Cmd>,
    scratch_base: u64,
    scratch_cap: usize,
    node_scratch: usize,
    /// The most scratch memory one node asked for.
    pub scratch_need: usize,
    /// Whether F32 GEMMs may use TF32 tensor cores.
    pub tf32: bool,
    /// Whether fused kernels may replace op sequences.
    pub fuse: bool,
    /// The kernels launched.
    build: &'a Build,
    /// The last mat-vec activation quantized into scratch (the tensor and the (qs, ds)
    /// addresses): reused by the next mul_mat nodes that read the same tensor (Q, K and V of
    /// one token), as long as no other node runs and no scratch is taken in between.
    pub q8: Option<(TensorId, (u64, u64))>,
    /// The same for columns quantized in the tiled layout of the few-column kernel
    /// ([`matmul::quantize_q8_tiles`]).
    pub q8_tiles: Option<(TensorId, (u64, u64))>,
    /// Which kernels multiply quantized weights by 2 to 32 columns.
    pub few_columns: crate::FewColumns,
    /// The last activation converted to contiguous F16 for a GEMM (the source, the converted
    /// copy in scratch, and where that copy ends in the node's scratch): reused by the next
    /// mul_mat nodes that read the same source, as long as no other node runs in between.
    pub f16: Option<(TArg, TArg, usize)>,
    /// The peer all-reduce group the backend joined and its rank, for all-reduce nodes.
    pub group: Option<(std::sync::Arc<crate::comm::peer::PeerGroup>, usize)>,
    /// The mul_mat node being encoded when an all-reduce node of its result follows it and
    /// its mat-vec may send the result to the other ranks itself, with where to send it
    /// ([`Encoder::presend_target`]).
    presend_next: Option<(TensorId, matmul::Presend)>,
    /// The tensor whose values a mat-vec has sent to the other ranks: the all-reduce node that
    /// sums it next only receives.
    pub present: Option<TensorId>,
    /// The backend's block counters: [`COUNTER_BYTES`] of device memory, zeroed once when the
    /// backend is made, for kernels whose blocks count themselves finished (the last one then
    /// finishes the work, as fattn_dec merging its splits). Every kernel that uses them leaves
    /// them at zero, so its commands may run again (a CUDA graph replays them); kernels run in
    /// stream order, so each may use them from the start. 0 when there are none.
    pub counters: u64,
    /// [`Graph::read_only_leaves`]: the tensors a mat-vec kernel may start reading before the
    /// kernel ahead of it has finished.
    read_only: Vec<bool>,
}

/// Bytes of the block counters (see [`Encoder::counters`]): 16384 u32 counters.
pub(crate) const COUNTER_BYTES: usize = 64 << 10;

impl<'a> Encoder<'a> {
    pub(crate) fn new(
        dev: &'a DeviceShared,
        graph: &'a Graph,
        scratch_base: u64,
        scratch_cap: usize,
        tf32: bool,
        fuse: bool,
        build: &'a Build,
    ) -> Self {
        Encoder {
            dev,
            graph,
            cmds: Vec::new(),
            scratch_base,
            scratch_cap,
            node_scratch: 0,
            scratch_need: 0,
            tf32,
            fuse,
            build,
            q8: None,
            q8_tiles: None,
            few_columns: crate::FewColumns::default(),
            f16: None,
            group: None,
            presend_next: None,
            present: None,
            counters: 0,
            read_only: graph.read_only_leaves(),
        }
    }

    /// Whether tensor `id` lies in a weight or input that no node of the graph writes, so that
    /// a kernel may read it before the kernels ahead of it in the stream have finished.
    pub fn is_read_only_leaf(&self, id: TensorId) -> bool {
        self.read_only[self.graph.root(id).0.index()]
    }

    /// Encodes `nodes` in order (fusing where it can).
    pub(crate) fn encode(&mut self, nodes: &[TensorId]) -> Result<()> {
        let graph = self.graph;
        let matcher = self.fuse.then(|| Matcher::new(graph, nodes));
        let mut i = 0;
        while i < nodes.len() {
            self.node_scratch = 0;
            let t = self.graph.get(nodes[i]);
            if matches!(t.op, Op::None) || t.op.is_view() || t.nelements() == 0 {
                i += 1;
                continue;
            }
            if t.op != Op::MulMat {
                self.q8 = None;
                self.q8_tiles = None;
                self.f16 = None;
            }
            self.presend_next = self.presend_target(nodes, i);
            if let Some(m) = &matcher {
                if let Some(used) = m.fuse_at(i, |group| fused::take(self, nodes, group))? {
                    i += used;
                    continue;
                }
            }
            encode_node(self, nodes[i])?;
            i += 1;
        }
        Ok(())
    }

    /// `nodes[i]` where it is a mul_mat whose result the next node all-reduces through the
    /// small peer kernel: its mat-vec then sends each value to the other ranks as it stores it,
    /// and the all-reduce kernel only receives (one NVLink crossing less on the step's critical
    /// path).
    fn presend_target(&self, nodes: &[TensorId], i: usize) -> Option<(TensorId, matmul::Presend)> {
        let (group, rank) = self.group.as_ref()?;
        let (id, next) = (nodes[i], *nodes.get(i + 1)?);
        let (t, tn) = (self.graph.get(id), self.graph.get(next));
        let fits = t.op == Op::MulMat
            && tn.op == Op::AllReduce
            && tn.src[0] == id
            && t.dtype == DType::F32
            && t.is_contiguous()
            && t.ne[1..] == [1, 1, 1];
        if !fits {
            return None;
        }
        let (signal, region) = group.presend(*rank, t.nelements())?;
        let to = matmul::Presend {
            signal,
            region,
            rank: *rank,
            ranks: group.len(),
        };
        Some((id, to))
    }

    /// The kernel's view of a tensor: its device address (checked to be memory of this device,
    /// with the tensor inside the buffer), shape and strides.
    pub(crate) fn arg(&self, id: TensorId) -> Result<TArg> {
        let t = self.graph.get(id);
        let data = self.graph.data_or_err(id)?;
        let buf = data
            .buffer
            .as_any()
            .downcast_ref::<CudaBuffer>()
            .filter(|b| b.ordinal() == self.dev.ordinal)
            .ok_or_else(|| Error::Unsupported {
                backend: self.dev.name.clone(),
                what: format!(
                    "tensor '{}' in buffer {} (not memory of {})",
                    self.graph.label(id),
                    data.buffer.name(),
                    self.dev.name
                ),
            })?;
        let end = data
            .offset
            .checked_add(t.nbytes())
            .ok_or(Error::Overflow("tensor end"))?;
        if end > data.buffer.size() {
            return Err(Error::Buffer {
                buffer: data.buffer.name(),
                reason: format!(
                    "tensor '{}' ends at byte {end}, past the buffer's {}",
                    self.graph.label(id),
                    data.buffer.size()
                ),
            });
        }
        let mut a = TArg {
            ptr: buf.device_ptr() + data.offset as u64,
            ..TArg::default()
        };
        for d in 0..4 {
            a.ne[d] = t.ne[d] as i64;
            a.nb[d] = t.nb[d] as i64;
        }
        Ok(a)
    }

    /// `bytes` of scratch memory for the node being encoded (256-byte aligned).
    pub(crate) fn scratch(&mut self, bytes: usize) -> u64 {
        self.q8 = None;
        self.q8_tiles = None;
        let off = self.node_scratch;
        if self.f16.is_some_and(|(_, _, end)| off < end) {
            // This memory overlaps the converted activation kept for reuse.
            self.f16 = None;
        }
        self.node_scratch = (off + bytes).div_ceil(ALIGNMENT) * ALIGNMENT;
        self.scratch_need = self.scratch_need.max(self.node_scratch);
        self.scratch_base + off as u64
    }

    /// Whether the scratch arena was large enough for everything encoded.
    pub(crate) fn scratch_fits(&self) -> bool {
        self.scratch_need <= self.scratch_cap
    }

    /// Queues a kernel launch.
    pub(crate) fn launch(
        &mut self,
        file: &'static str,
        name: &str,
        grid: [u32; 3],
        block: [u32; 3],
        smem: u32,
        p: KParams,
    ) -> Result<()> {
        self.launch_clusters(file, name, [grid, block], smem, 0, p)
    }

    /// [`Encoder::launch`] in thread-block clusters of `cluster` blocks along z (0 or 1: none;
    /// only where [`Encoder::clusters`] says the device launches them), the grid and the block
    /// given as one pair.
    pub(crate) fn launch_clusters(
        &mut self,
        file: &'static str,
        name: &str,
        [grid, block]: [[u32; 3]; 2],
        smem: u32,
        cluster: u32,
        p: KParams,
    ) -> Result<()> {
        let (func, name) = self
            .dev
            .kernels
            .func(&self.dev.ctx, self.build, file, name)?;
        if smem > 48 * 1024 {
            self.dev.kernels.allow_smem(&self.dev.name, func, smem)?;
        }
        self.cmds.push(Cmd::Kernel {
            func,
            name,
            grid,
            block,
            smem,
            cluster,
            p: Box::new(p),
        });
        Ok(())
    }

    /// Whether kernels may be launched in thread-block clusters of up to 8 blocks: compute
    /// capability 9.0 or later and a driver with `cuLaunchKernelEx`.
    pub(crate) fn clusters(&self) -> bool {
        self.dev.launch_ex
    }

    /// Queues a kernel over the elements of `shape` (see FOR_EACH_ELEMENT in common.cuh).
    pub(crate) fn launch_elems(
        &mut self,
        file: &'static str,
        name: &str,
        shape: [i64; 4],
        p: KParams,
    ) -> Result<()> {
        if shape.contains(&0) {
            return Ok(());
        }
        let block = (shape[0].clamp(1, 256) as u32).div_ceil(32) * 32;
        let grid = [
            (shape[0] as u64).div_ceil(u64::from(block)).clamp(1, 65535) as u32,
            shape[1].clamp(1, 65535) as u32,
            (shape[2] * shape[3]).clamp(1, 65535) as u32,
        ];
        self.launch(file, name, grid, [block, 1, 1], 0, p)
    }

    /// Queues a kernel with a flat grid-stride loop over `n` items.
    pub(crate) fn launch_flat(
        &mut self,
        file: &'static str,
        name: &str,
        n: i64,
        p: KParams,
    ) -> Result<()> {
        if n <= 0 {
            return Ok(());
        }
        let grid = (n as u64).div_ceil(256).clamp(1, 1 << 20) as u32;
        self.launch(file, name, [grid, 1, 1], [256, 1, 1], 0, p)
    }

    /// An [`Error::Unsupported`] for node `id`.
    pub(crate) fn unsupported(&self, id: TensorId, why: &str) -> Error {
        let t = self.graph.get(id);
        Error::Unsupported {
            backend: self.dev.name.clone(),
            what: format!("{} of '{}': {why}", t.op.name(), self.graph.label(id)),
        }
    }
}

/// Whether `a` is dense (contiguous, elements of `es` bytes) with a 16-byte aligned address and
/// an element count that is a multiple of 4: what the `_flat` kernels read four at a time.
pub(crate) fn flat4(a: &TArg, es: i64) -> bool {
    a.nb[0] == es
        && a.nb[1] == a.ne[0] * es
        && a.nb[2] == a.nb[1] * a.ne[1]
        && a.nb[3] == a.nb[2] * a.ne[2]
        && a.ptr.is_multiple_of(16)
        && a.ne.iter().product::<i64>() % 4 == 0
}

/// KParams with the destination and sources set.
pub(crate) fn params(dst: TArg, srcs: &[TArg]) -> KParams {
    let mut p = KParams::default();
    p.t[0] = dst;
    for (i, s) in srcs.iter().enumerate().take(4) {
        p.t[i + 1] = *s;
    }
    p
}

/// Encodes one node.
pub(crate) fn encode_node(enc: &mut Encoder, id: TensorId) -> Result<()> {
    let op = enc.graph.get(id).op.clone();
    if !supports(enc.graph, id) {
        return Err(enc.unsupported(id, "this op or type combination is not implemented on CUDA"));
    }
    match op {
        Op::None | Op::View | Op::Reshape | Op::Permute(_) | Op::Transpose => Ok(()),
        Op::Unary(u) => elementwise::unary(enc, id, elementwise::unary_code(u), 0.0, 0.0),
        Op::Scale { scale, bias } => elementwise::unary(enc, id, 20, scale, bias),
        Op::Clamp { min, max } => elementwise::unary(enc, id, 21, min, max),
        Op::Binary(b) => elementwise::binary(enc, id, b),
        Op::Glu { op, swapped } => elementwise::glu(enc, id, op, swapped),
        Op::Cpy | Op::Cont | Op::Dup => copy::copy(enc, id),
        Op::GetRows => rows::get_rows(enc, id),
        Op::SetRows => rows::set_rows(enc, id),
        Op::MulMat => matmul::mul_mat(enc, id),
        Op::RmsNorm { eps } => norm::rms_norm(enc, id, eps),
        Op::Norm { eps } => norm::norm(enc, id, eps),
        Op::SoftMax { scale, max_bias } => norm::soft_max(enc, id, scale, max_bias),
        Op::DiagMaskInf(n) => norm::diag_mask_inf(enc, id, n),
        Op::Rope(p) => rope::rope(enc, id, &p),
        Op::FlashAttnExt {
            scale,
            max_bias,
            logit_softcap,
            ..
        } => attention::flash_attn(enc, id, scale, max_bias, logit_softcap, false).map(|_| ()),
        Op::Concat(dim) => misc::concat(enc, id, dim),
        Op::Repeat => misc::repeat(enc, id),
        Op::Pad(_) => misc::pad(enc, id),
        Op::Arange {
            start,
            stop: _,
            step,
        } => misc::arange(enc, id, start, step),
        Op::Sum => misc::sum(enc, id),
        Op::SumRows => misc::sum_rows(enc, id, false),
        Op::Mean => misc::sum_rows(enc, id, true),
        Op::Argmax => misc::argmax(enc, id),
        Op::AllReduce => comm::all_reduce(enc, id),
        Op::MulMatId { first } => moe::mul_mat_id(enc, id, first),
        Op::AddId => moe::add_id(enc, id),
        Op::Argsort { descending } => moe::sort(enc, id, descending),
        Op::TopK(_) => moe::sort(enc, id, true),
        Op::SwigluOai { alpha, limit } => elementwise::swiglu_oai(enc, id, alpha, limit),
    }
}

/// Whether this backend implements node `id` (op, types and layout). The buffers the tensors
/// live in are checked separately ([`tessera_core::Device::can_use_buffer`], and at encoding).
pub(crate) fn supports(graph: &Graph, id: TensorId) -> bool {
    let t = graph.get(id);
    let src = |i: usize| t.src.get(i).map(|&s| graph.get(s));
    let dims_fit = t.ne.iter().all(|&n| n < i32::MAX as usize);
    if !dims_fit {
        return false;
    }
    match &t.op {
        Op::None | Op::View | Op::Reshape | Op::Permute(_) | Op::Transpose => true,
        Op::Unary(_) | Op::Scale { .. } | Op::Clamp { .. } | Op::Binary(_) => t.dtype.is_float(),
        Op::Glu { .. } => matches!(t.dtype, DType::F32 | DType::F16),
        Op::Cpy | Op::Cont | Op::Dup => src(0).is_some_and(|a| copy::supported(a, t)),
        Op::GetRows => src(0).is_some_and(|a| rows::gettable(a.dtype)),
        Op::SetRows => rows::settable(t.dtype),
        Op::MulMat => match (src(0), src(1)) {
            (Some(a), Some(b)) => matmul::supported(a, b),
            _ => false,
        },
        Op::RmsNorm { .. } | Op::Norm { .. } | Op::SoftMax { .. } | Op::DiagMaskInf(_) => {
            t.dtype == DType::F32
        }
        Op::Rope(_) => matches!(t.dtype, DType::F32 | DType::F16),
        Op::SwigluOai { .. } => t.dtype == DType::F32,
        Op::FlashAttnExt { .. } => match (src(0), src(2)) {
            (Some(q), Some(v)) => {
                q.ne[0] <= 256
                    && v.ne[0] <= 256
                    && q.ne[0].is_multiple_of(4)
                    && v.ne[0].is_multiple_of(4)
            }
            _ => false,
        },
        Op::Concat(_) | Op::Repeat => {
            matches!(t.dtype.type_size(), 2 | 4 | 8) && !t.dtype.is_quantized()
        }
        Op::Pad(_) | Op::Arange { .. } | Op::SumRows | Op::Mean | Op::Argmax => true,
        Op::Sum => src(0).is_some_and(|a| a.dtype.is_float()),
        Op::AllReduce => t.dtype == DType::F32 && t.is_contiguous(),
        Op::MulMatId { .. } => match (src(0), src(1)) {
            (Some(a), Some(b)) => moe::mul_mat_id_supported(a, b),
            _ => false,
        },
        Op::AddId => t.dtype == DType::F32,
        Op::Argsort { .. } | Op::TopK(_) => {
            src(0).is_some_and(|a| a.dtype == DType::F32 && moe::sort_supported(a.ne[0]))
        }
    }
}
