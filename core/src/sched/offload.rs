//! Op offload (the scheduler's rule 4): the mat-muls of a large batch whose weights sit in
//! host memory run on a GPU of the same scheduler, the weight uploaded for the run.
//!
//! A model split by layers over a GPU and the CPU keeps its CPU layers' weights in host memory,
//! and the CPU computes their prompt mat-muls at a small fraction of the GPU's rate. Uploading
//! a weight costs its bytes over the host link once per batch, and a batch of many tokens does
//! many multiply-adds per weight byte: from some batch size on, the upload and the GPU's
//! product take less time than the CPU's product. So, when [`Scheduler::set_op_offload`] is
//! given a minimum batch:
//!
//! - a `mul_mat` or `mul_mat_id` node that rules 1-3 put on a CPU because its weight is in
//!   host memory, whose batch (the product's columns: tokens) is at least the minimum, runs on
//!   the first device that is neither a CPU nor a meta device (the *target*), if it supports
//!   the op;
//! - a node placed by the hint alone (it reads no bound memory) on a CPU, whose computed sources
//!   all ran on the target by this rule, follows them (the GLU between gate/up and down, rope
//!   after Q and K), so that their results do not cross back and forth;
//! - everything that reads or writes the CPU's own memory (attention over its KV cache, the
//!   cache stores, norms with their weights, residual adds) stays on the CPU.
//!
//! The weights go into scratch memory the scheduler keeps on the target for all its plans and
//! runs: two regions, each as large as the weights one split of the target reads, used by the
//! target's splits in turn, so that a split's uploads never overwrite what the split before it
//! still reads (a backend that copies on a stream of its own may start the next upload while
//! the current product runs). Where the target has no memory for the scratch or for the
//! activations it would receive, the graph is planned without op offload and a log line says
//! so. Decode steps, whose batch is below the minimum, are planned exactly as without it.
//!
//! [`Scheduler::set_op_offload`]: super::Scheduler::set_op_offload

use std::sync::Arc;

use crate::alloc::align_up;
use crate::backend::{Buffer, Device, DeviceKind};
use crate::error::{Error, Result};
use crate::graph::Graph;
use crate::op::Op;
use crate::tensor::TensorId;

/// What op offload moved: per run of a plan ([`crate::SchedPlan::offload`]), or summed over a
/// scheduler's runs ([`super::Scheduler::offload_stats`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OffloadStats {
    /// Mat-mul nodes run on the target with an uploaded weight.
    pub ops: u64,
    /// Weight bytes uploaded for them.
    pub bytes: u64,
}

/// Why rule 4 moved a node to the target.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Moved {
    /// A mat-mul whose weight (its first source, a root in host memory) is uploaded.
    Weight(TensorId),
    /// A node that reads only results moved here.
    Follows,
}

/// The scheduler's op offload state.
#[derive(Default)]
pub(super) struct Offload {
    /// Smallest batch offloaded; 0: off.
    pub min_batch: usize,
    /// The two scratch regions on the target (absent until a plan needs them).
    slots: [Option<Arc<dyn Buffer>>; 2],
    /// Totals over the runs.
    pub stats: OffloadStats,
}

/// The device rule 4 moves work to: the first that is neither a CPU nor a meta device.
pub(super) fn target(devices: &[Arc<dyn Device>]) -> Option<usize> {
    devices
        .iter()
        .position(|d| !matches!(d.kind(), DeviceKind::Cpu | DeviceKind::Meta))
}

/// Whether rule 4 moves node `id`, which rules 1-3 put on device `dev`, to `target`; `moved`
/// holds the decisions for the nodes before it (by tensor index).
pub(super) fn moves(
    devices: &[Arc<dyn Device>],
    graph: &Graph,
    id: TensorId,
    dev: usize,
    target: usize,
    min_batch: usize,
    moved: &[Option<Moved>],
) -> Option<Moved> {
    let t = graph.get(id);
    if devices[dev].kind() != DeviceKind::Cpu || t.op.is_view() || t.view_src.is_some() {
        return None;
    }
    let batch = match t.op {
        Op::MulMat => t.ne[1] * t.ne[2] * t.ne[3],
        Op::MulMatId { .. } => t.ne[2] * t.ne[3],
        _ => 0,
    };
    let weight = t.src.first().map(|&s| graph.root(s).0).filter(|&w| {
        let wt = graph.get(w);
        wt.flags.weight
            && wt
                .data
                .as_ref()
                .is_some_and(|d| !devices[target].can_use_buffer(d.buffer.as_ref()))
    });
    let why = match weight {
        Some(w) if batch >= min_batch => Moved::Weight(w),
        Some(_) => return None,
        None => {
            // Follows: every source is a result moved here or a graph input without memory,
            // and at least one is a moved result.
            let mut any = false;
            for &s in &t.src {
                let (root, _) = graph.root(s);
                let r = graph.get(root);
                if moved[root.index()].is_some() {
                    any = true;
                } else if r.op != Op::None || r.data.is_some() {
                    return None;
                }
            }
            if !any {
                return None;
            }
            Moved::Follows
        }
    };
    devices[target].supports_op(graph, id).then_some(why)
}

impl Offload {
    /// Scratch for the weights of a plan whose nodes run in `order` on the devices
    /// `placement` gives: every split of the target gets the region of its turn (its index
    /// among the target's splits, modulo 2), large enough for the weights its moved nodes read.
    /// Returns the regions and each region's alignment; an error when the target cannot
    /// allocate them.
    pub(super) fn scratch(
        &mut self,
        device: &dyn Device,
        graph: &Graph,
        order: &[TensorId],
        placement: &[Option<usize>],
        target: usize,
        moved: &[Option<Moved>],
    ) -> Result<Scratch> {
        let align = device.buffer_type().alignment().max(1);
        let (mut need, mut turns) = (0usize, 0usize);
        let mut current: Option<(usize, Vec<TensorId>)> = None; // (bytes, weights) of the split
        let mut last_dev = None;
        for &id in order {
            if graph.get(id).op.is_view() {
                continue;
            }
            let dev = placement[id.index()];
            if dev != last_dev {
                last_dev = dev;
                if let Some((bytes, _)) = current.take() {
                    need = need.max(bytes);
                }
                if dev == Some(target) {
                    turns += 1;
                    current = Some((0, Vec::new()));
                }
            }
            if let (Some((bytes, weights)), Some(Moved::Weight(w))) =
                (current.as_mut(), moved[id.index()])
            {
                if !weights.contains(&w) {
                    weights.push(w);
                    *bytes += align_up(graph.get(w).nbytes(), align);
                }
            }
        }
        if let Some((bytes, _)) = current {
            need = need.max(bytes);
        }
        let regions = turns.min(2);
        let bt = device.buffer_type();
        if need > bt.max_size() {
            return Err(Error::OutOfMemory {
                device: device.name(),
                bytes: need,
            });
        }
        for slot in self.slots.iter_mut().take(regions) {
            if slot.as_ref().is_none_or(|b| b.size() < need) {
                // A plan made before keeps the smaller buffer it is bound to alive.
                *slot = Some(bt.alloc(need.max(1))?);
            }
        }
        Ok(Scratch {
            regions: self.slots.clone(),
            align,
            cursor: 0,
            split: None,
        })
    }
}

/// The scratch regions of one plan being cut, and where the next upload goes.
pub(super) struct Scratch {
    regions: [Option<Arc<dyn Buffer>>; 2],
    align: usize,
    cursor: usize,
    /// The split being cut (its index among all splits).
    split: Option<usize>,
}

impl Scratch {
    /// Where the next weight (`bytes` long) of split `split`, the `turn`-th split of the
    /// target, goes: its region and offset there.
    pub(super) fn place(
        &mut self,
        split: usize,
        turn: usize,
        bytes: usize,
    ) -> Result<(Arc<dyn Buffer>, usize)> {
        if self.split != Some(split) {
            self.split = Some(split);
            self.cursor = 0;
        }
        let buffer = self.regions[turn % 2]
            .clone()
            .ok_or_else(|| Error::Invalid("op offload scratch region missing".into()))?;
        let offset = self.cursor;
        self.cursor += align_up(bytes, self.align);
        Ok((buffer, offset))
    }
}
