//! The scheduler: runs one graph over several backends.
//!
//! Placement, per compute node, in this order:
//! 1. A node that writes into existing memory (set_rows, cpy: a result that is a view) runs on
//!    a device that can use that memory.
//! 2. A node that reads a weight (or other tensor bound before planning, such as a KV cache)
//!    runs on a device that can use that tensor's buffer: weights decide placement. Where
//!    several devices can use it (host memory), the caller's hint (below) picks among them.
//! 3. Otherwise it goes to the device the caller's hint names for it, if any
//!    ([`Scheduler::plan_hinted`]: a model split by layers names each layer's device, so that
//!    its norms and residual adds stay with its weights), else to the highest-priority device
//!    that supports it, so that work returns to the preferred device after a fallback.
//!
//! 4. With op offload on ([`Scheduler::set_op_offload`]), a large batch's mat-muls that rules
//!    1-3 put on a CPU for their weights in host memory run on a GPU of the scheduler, the
//!    weight uploaded into scratch memory kept for it (see the `offload` module).
//!
//! In each case a device that lacks the op is passed over; the last device given to
//! [`Scheduler::new`] should be the CPU, which runs everything, so an op a GPU lacks falls back
//! to it. Consecutive nodes on one device form a split. A split's sources that live in memory
//! its device cannot use are copied in before it runs (into tensors the planner adds to the
//! graph), after the producing device has finished.

use std::sync::Arc;

use crate::alloc::GraphAllocator;
use crate::backend::{Backend, Device};
use crate::error::{Error, Result};
use crate::graph::Graph;
use crate::op::Op;
use crate::tensor::{Tensor, TensorFlags, TensorId};

mod offload;

pub use offload::OffloadStats;
use offload::{Moved, Offload};

/// A run of nodes on one device, with the copies it needs first.
#[derive(Clone, Debug)]
pub struct Split {
    /// Index of the device in the scheduler.
    pub device: usize,
    /// Nodes to compute, in order.
    pub nodes: Vec<TensorId>,
    /// (source root on another device, its copy on this one), copied before the split runs.
    pub copies: Vec<(TensorId, TensorId)>,
}

/// How a graph was cut; reused for every run of the same graph.
#[derive(Clone, Debug, Default)]
pub struct SchedPlan {
    /// The splits, in execution order.
    pub splits: Vec<Split>,
    /// Device index of every tensor (by id) that runs or is allocated somewhere.
    pub placement: Vec<Option<usize>>,
    /// What one run of the plan offloads (rule 4): mat-muls and the weight bytes uploaded.
    pub offload: OffloadStats,
}

impl SchedPlan {
    /// Number of devices a graph's nodes ended up on.
    pub fn devices_used(&self) -> usize {
        let mut d: Vec<usize> = self.splits.iter().map(|s| s.device).collect();
        d.sort();
        d.dedup();
        d.len()
    }
}

/// Runs graphs over a list of devices in priority order.
pub struct Scheduler {
    devices: Vec<Arc<dyn Device>>,
    backends: Vec<Box<dyn Backend>>,
    allocators: Vec<GraphAllocator>,
    /// Devices whose work a queued run left unwaited (see [`Scheduler::compute_queued`]).
    queued: Vec<bool>,
    offload: Offload,
}

impl Scheduler {
    /// A scheduler over `devices`, most preferred first (put the CPU last as the fallback).
    pub fn new(devices: Vec<Arc<dyn Device>>) -> Result<Self> {
        if devices.is_empty() {
            return Err(Error::Invalid(
                "a scheduler needs at least one device".into(),
            ));
        }
        let backends = devices
            .iter()
            .map(|d| d.new_backend())
            .collect::<Result<Vec<_>>>()?;
        let allocators = devices
            .iter()
            .map(|d| GraphAllocator::new(d.buffer_type()))
            .collect();
        let queued = vec![false; devices.len()];
        Ok(Scheduler {
            devices,
            backends,
            allocators,
            queued,
            offload: Offload::default(),
        })
    }

    /// The devices, in priority order.
    pub fn devices(&self) -> &[Arc<dyn Device>] {
        &self.devices
    }

    /// The backend (stream) of device `i`.
    pub fn backend_mut(&mut self, i: usize) -> &mut dyn Backend {
        self.backends[i].as_mut()
    }

    /// The device for node `node` that uses the memory of tensor `id`: among the devices that
    /// can use it (several, where it is host memory and several devices read host memory), the
    /// hinted one `hint` if it supports the op, else the first that does, else the first.
    fn device_for_memory(
        &self,
        graph: &Graph,
        id: TensorId,
        node: TensorId,
        hint: Option<usize>,
    ) -> Option<usize> {
        let data = graph.data(id)?;
        let usable: Vec<usize> = (0..self.devices.len())
            .filter(|&i| self.devices[i].can_use_buffer(data.buffer.as_ref()))
            .collect();
        let supports = |i: &usize| self.devices[*i].supports_op(graph, node);
        hint.filter(|h| usable.contains(h) && supports(h))
            .or_else(|| usable.iter().copied().find(supports))
            .or_else(|| usable.first().copied())
    }

    /// Turns op offload (rule 4) on for graphs planned from now on: the mat-muls of batches of
    /// at least `min_batch` columns (tokens) whose weights are in host memory run on the
    /// first device that is neither a CPU nor a meta device; 0 turns it off. A scheduler
    /// without such a device offloads nothing.
    pub fn set_op_offload(&mut self, min_batch: usize) {
        self.offload.min_batch = min_batch;
    }

    /// What op offload has moved over every run so far.
    pub fn offload_stats(&self) -> OffloadStats {
        self.offload.stats
    }

    /// Places every node of the graph, adds the cross-device copies, and allocates compute memory on each device.
    pub fn plan(&mut self, graph: &mut Graph) -> Result<SchedPlan> {
        self.plan_hinted(graph, &[])
    }

    /// [`Scheduler::plan`] with a preferred device for nodes that neither write existing
    /// memory nor read a weight: `hint[id]` (by tensor index; missing or `None`: no
    /// preference). A hinted device that lacks the op is passed over as in rule 3.
    pub fn plan_hinted(&mut self, graph: &mut Graph, hint: &[Option<usize>]) -> Result<SchedPlan> {
        let target = offload::target(&self.devices).filter(|_| self.offload.min_batch > 0);
        let (placement, order, moved) = self.place(graph, hint, target)?;
        let Some(t) = target.filter(|_| moved.iter().any(Option::is_some)) else {
            return self.cut(graph, placement, &order, &moved, None);
        };
        // Op offload needs memory on the target (its scratch, the activations it receives):
        // where it has too little, the graph is planned again without it.
        let original = graph.clone();
        let device = self.devices[t].clone();
        let tried = self
            .offload
            .scratch(device.as_ref(), graph, &order, &placement, t, &moved)
            .and_then(|scratch| self.cut(graph, placement, &order, &moved, Some((t, scratch))));
        match tried {
            Err(e @ Error::OutOfMemory { .. }) => {
                log::warn!(
                    "op offload to {} is off for this graph ({e}): its mat-muls run where their \
                     weights are",
                    device.name()
                );
                *graph = original;
                let (placement, order, moved) = self.place(graph, hint, None)?;
                self.cut(graph, placement, &order, &moved, None)
            }
            r => r,
        }
    }

    /// Cuts the placed nodes `order` into splits, adds the copies for sources whose memory a
    /// split's device cannot use (a weight that rule 4 moved into `offload`'s scratch on its
    /// target), and allocates each device's compute memory.
    fn cut(
        &mut self,
        graph: &mut Graph,
        mut placement: Vec<Option<usize>>,
        order: &[TensorId],
        moved: &[Option<Moved>],
        offload: Option<(usize, offload::Scratch)>,
    ) -> Result<SchedPlan> {
        let (target, mut scratch) = match offload {
            Some((t, s)) => (Some(t), Some(s)),
            None => (None, None),
        };
        let mut offloaded = OffloadStats::default();

        // Cut into splits and add copies for sources whose memory the split's device cannot use.
        let mut splits: Vec<Split> = Vec::new();
        // Copies by (source root, device); an uploaded weight's by (root, device count + its
        // split), as each split uploads its own.
        let mut copy_of: std::collections::HashMap<(TensorId, usize), TensorId> =
            Default::default();
        // The target's splits so far (a split's turn picks its scratch region).
        let mut turns = 0usize;
        for &id in order {
            if graph.get(id).op.is_view() {
                continue;
            }
            let dev = placement[id.index()].expect("placed above");
            if splits.last().map(|s| s.device) != Some(dev) {
                splits.push(Split {
                    device: dev,
                    nodes: Vec::new(),
                    copies: Vec::new(),
                });
                turns += usize::from(Some(dev) == target);
            }
            let srcs = graph.get(id).src.clone();
            let mut new_srcs = srcs.clone();
            let weight = match moved[id.index()] {
                Some(Moved::Weight(w)) => Some(w),
                _ => None,
            };
            if weight.is_some() {
                offloaded.ops += 1;
            }
            for (k, &s) in srcs.iter().enumerate() {
                let (root, _) = graph.root(s);
                let here = match (graph.data(root), placement[root.index()]) {
                    (Some(d), _) => self.devices[dev].can_use_buffer(d.buffer.as_ref()),
                    (None, Some(p)) => p == dev,
                    (None, None) => true,
                };
                if here {
                    continue;
                }
                // An offloaded weight goes into its split's scratch region, once per split
                // (the region an earlier split used may have been overwritten since).
                let split_no = splits.len() - 1;
                let uploaded = weight == Some(root) && k == 0 && scratch.is_some();
                let key = if uploaded {
                    (root, self.devices.len() + split_no)
                } else {
                    (root, dev)
                };
                let copy = match copy_of.get(&key) {
                    Some(&c) => c,
                    None => {
                        let c = add_copy(graph, root)?;
                        placement.push(Some(dev));
                        copy_of.insert(key, c);
                        if let Some(sc) = scratch.as_mut().filter(|_| uploaded) {
                            let bytes = graph.get(root).nbytes();
                            let (buffer, offset) = sc.place(split_no, turns - 1, bytes)?;
                            graph.bind(c, buffer, offset)?;
                            offloaded.bytes += bytes as u64;
                        }
                        splits
                            .last_mut()
                            .expect("pushed above")
                            .copies
                            .push((root, c));
                        // Keep the source's memory until the copy has run.
                        if graph.get(root).data.is_none() {
                            graph.get_mut(root).flags.output = true;
                        }
                        c
                    }
                };
                new_srcs[k] = if s == root {
                    copy
                } else {
                    add_view_of_copy(graph, s, copy, &mut placement, dev)
                };
            }
            if new_srcs != srcs {
                graph.get_mut(id).src = new_srcs;
            }
            splits.last_mut().expect("pushed above").nodes.push(id);
        }

        // Allocate each device's tensors.
        for d in 0..self.devices.len() {
            let mut nodes: Vec<TensorId> = Vec::new();
            for s in splits.iter().filter(|s| s.device == d) {
                nodes.extend(s.copies.iter().map(|c| c.1));
                nodes.extend(&s.nodes);
            }
            if !nodes.is_empty() {
                self.allocators[d].alloc(graph, &nodes)?;
            }
        }
        if offloaded.ops > 0 {
            log::debug!(
                "op offload: {} mat-muls of this graph to {}, {} MiB of weights uploaded a run",
                offloaded.ops,
                target.map_or_else(String::new, |t| self.devices[t].name()),
                offloaded.bytes >> 20
            );
        }
        Ok(SchedPlan {
            splits,
            placement,
            offload: offloaded,
        })
    }

    /// Rules 1-3 for every node of `graph` (and rule 4 towards `target`, where given): each
    /// tensor's device, the computed nodes in order, and what rule 4 moved.
    #[allow(clippy::type_complexity)]
    fn place(
        &self,
        graph: &Graph,
        hint: &[Option<usize>],
        target: Option<usize>,
    ) -> Result<(Vec<Option<usize>>, Vec<TensorId>, Vec<Option<Moved>>)> {
        let n = graph.len();
        let mut placement: Vec<Option<usize>> = vec![None; n];
        let mut order: Vec<TensorId> = Vec::new();
        let mut moved: Vec<Option<Moved>> = vec![None; n];
        for id in graph.ids().collect::<Vec<_>>() {
            let t = graph.get(id);
            if t.op == Op::None {
                continue;
            }
            let hinted = hint
                .get(id.index())
                .copied()
                .flatten()
                .filter(|&d| d < self.devices.len());
            let dev = if t.op.is_view() {
                // A view lives where its root is computed or bound.
                let (root, _) = graph.root(id);
                placement[root.index()].or_else(|| self.device_for_memory(graph, root, id, hinted))
            } else if t.view_src.is_some() {
                // Writes into existing memory.
                let (root, _) = graph.root(id);
                match placement[root.index()] {
                    Some(d) => Some(d),
                    None => self.device_for_memory(graph, root, id, hinted),
                }
            } else {
                let mut pick = None;
                for &s in &t.src {
                    let (root, _) = graph.root(s);
                    let rt = graph.get(root);
                    if rt.data.is_some() && (rt.flags.weight || !rt.flags.input) {
                        pick = self.device_for_memory(graph, root, id, hinted);
                        if pick.is_some() {
                            break;
                        }
                    }
                }
                pick.filter(|&d| self.devices[d].supports_op(graph, id))
                    .or_else(|| hinted.filter(|&d| self.devices[d].supports_op(graph, id)))
                    .or_else(|| {
                        (0..self.devices.len()).find(|&d| self.devices[d].supports_op(graph, id))
                    })
            };
            let mut dev = dev.ok_or_else(|| Error::Unsupported {
                backend: self
                    .devices
                    .iter()
                    .map(|d| d.name())
                    .collect::<Vec<_>>()
                    .join(","),
                what: format!("{} for tensor '{}'", t.op.name(), graph.label(id)),
            })?;
            if !t.op.is_view() && !self.devices[dev].supports_op(graph, id) {
                return Err(Error::Unsupported {
                    backend: self.devices[dev].name(),
                    what: format!(
                        "{} for tensor '{}' (its memory is there)",
                        t.op.name(),
                        graph.label(id)
                    ),
                });
            }
            if let Some(t) = target {
                let m = offload::moves(
                    &self.devices,
                    graph,
                    id,
                    dev,
                    t,
                    self.offload.min_batch,
                    &moved,
                );
                if m.is_some() {
                    moved[id.index()] = m;
                    dev = t;
                }
            }
            placement[id.index()] = Some(dev);
            order.push(id);
        }

        // Inputs without memory live on the device of their first consumer.
        for &id in &order {
            let srcs = graph.get(id).src.clone();
            for s in srcs {
                let (root, _) = graph.root(s);
                if graph.get(root).op == Op::None
                    && graph.get(root).data.is_none()
                    && placement[root.index()].is_none()
                {
                    placement[root.index()] = placement[id.index()];
                }
            }
        }

        Ok((placement, order, moved))
    }

    /// Runs a planned graph: copies, then each split on its device; waits for all of it.
    pub fn compute(&mut self, graph: &Graph, plan: &SchedPlan) -> Result<()> {
        self.run(graph, plan, None, true)
    }

    /// Runs a planned graph as [`Scheduler::compute`] does, but returns once the last work is
    /// queued rather than done: a device that computes asynchronously (a GPU) may still be
    /// running its splits when this returns. The host waits only where a split needs what
    /// another device computed in this run. Queued runs of micro-batches of a model split by
    /// layers so overlap: the host computes the next micro-batch's first layers (a CPU part)
    /// while a GPU runs the previous one's last layers. Each device's work stays in its
    /// stream's order; [`Scheduler::synchronize`] waits for all of it.
    pub fn compute_queued(&mut self, graph: &Graph, plan: &SchedPlan) -> Result<()> {
        self.run(graph, plan, None, false)
    }

    /// Waits for the work queued on every device.
    pub fn synchronize(&mut self) -> Result<()> {
        self.queued.iter_mut().for_each(|q| *q = false);
        self.backends.iter_mut().try_for_each(|b| b.synchronize())
    }

    /// [`Scheduler::compute`], then the bytes of tensor `id` (one of the graph's results) read
    /// into `out`: its device's backend queues the read behind the computation, so that the
    /// one wait for the computation also brings the bytes back (no second round trip).
    pub fn compute_read(
        &mut self,
        graph: &Graph,
        plan: &SchedPlan,
        id: TensorId,
        out: &mut [u8],
    ) -> Result<()> {
        let want = graph.get(id).nbytes();
        if out.len() != want {
            return Err(Error::Invalid(format!(
                "reading '{}' of {want} bytes into {} bytes",
                graph.label(id),
                out.len()
            )));
        }
        self.run(graph, plan, Some((id, out)), true)
    }

    /// The splits of `plan` in order, then `read` (see [`Scheduler::compute_read`]), then,
    /// with `wait`, one synchronize of each backend that ran something.
    fn run(
        &mut self,
        graph: &Graph,
        plan: &SchedPlan,
        read: Option<(TensorId, &mut [u8])>,
        wait: bool,
    ) -> Result<()> {
        // Work left by queued runs counts as this run's: a copy from its device waits for it,
        // and so does the end of a run that waits.
        let mut dirty = std::mem::replace(&mut self.queued, vec![false; self.devices.len()]);
        for split in &plan.splits {
            for &(src, dst) in &split.copies {
                let from = plan.placement.get(src.index()).copied().flatten();
                if let Some(f) = from {
                    if dirty[f] {
                        self.backends[f].synchronize()?;
                        dirty[f] = false;
                    }
                }
                let s = graph.data_or_err(src)?;
                let d = graph.data_or_err(dst)?;
                let len = graph.get(src).nbytes();
                self.backends[split.device].copy_async(
                    s.buffer.as_ref(),
                    s.offset,
                    d.buffer.as_ref(),
                    d.offset,
                    len,
                )?;
            }
            self.backends[split.device].compute(graph, &split.nodes)?;
            dirty[split.device] = true;
        }
        self.offload.stats.ops += plan.offload.ops;
        self.offload.stats.bytes += plan.offload.bytes;
        let mut late = None;
        if let Some((id, out)) = read {
            let d = graph.data_or_err(id)?;
            match plan.placement.get(id.index()).copied().flatten() {
                Some(dev) => {
                    self.backends[dev].get_async(d.buffer.as_ref(), d.offset, out)?;
                    dirty[dev] = true;
                }
                None => late = Some((d, out)),
            }
        }
        if !wait {
            self.queued = dirty;
            return Ok(());
        }
        for (i, b) in self.backends.iter_mut().enumerate() {
            if dirty[i] {
                b.synchronize()?;
            }
        }
        match late {
            Some((d, out)) => d.buffer.get(d.offset, out),
            None => Ok(()),
        }
    }
}

fn add_copy(graph: &mut Graph, root: TensorId) -> Result<TensorId> {
    let t = graph.get(root);
    let ne: Vec<usize> = t.ne.to_vec();
    let (dtype, nb, name) = (t.dtype, t.nb, format!("{}#copy", graph.label(root)));
    let c = graph.new_tensor(dtype, &ne)?;
    let ct = graph.get_mut(c);
    ct.nb = nb; // same layout, so views of the copy keep their strides and offsets
    ct.name = name;
    ct.flags = TensorFlags {
        input: true,
        output: false,
        weight: false,
    };
    Ok(c)
}

fn add_view_of_copy(
    graph: &mut Graph,
    view: TensorId,
    copy: TensorId,
    placement: &mut Vec<Option<usize>>,
    dev: usize,
) -> TensorId {
    let v: Tensor = graph.get(view).clone();
    let mut nv = v;
    nv.view_src = Some(copy);
    nv.src = vec![copy];
    nv.data = None;
    nv.flags = TensorFlags::default();
    let id = TensorId(graph.len() as u32);
    graph.push_raw(nv);
    placement.push(Some(dev));
    id
}
