//! [`MetaBackend`]: runs a graph over the parts of a meta device.
//!
//! A graph is planned once ([`crate::plan`]) and the plan kept while the same graph comes back
//! (the plan cache compares the graph's structure and bindings tensor by tensor, holding the
//! buffers it compares so their addresses cannot be reused). A run then: uploads the staged
//! inputs' slices to every part; runs each stage on every part (work is submitted part after
//! part, asynchronous GPU parts first, so that they run side by side with a CPU part, which
//! computes in the calling thread); all-reduces the partial results
//! between stages; and gathers the results the caller reads back into their memory.

use std::sync::Arc;

use tessera_core::alloc::GraphAllocator;
use tessera_core::backend::{Backend, Buffer, Communicator, DeviceKind, ReduceType};
use tessera_core::dtype::DType;
use tessera_core::error::{Error, Result};
use tessera_core::graph::Graph;
use tessera_core::graph_key::GraphKey;
use tessera_core::tensor::TensorId;

use crate::buffer::slice_of;
use crate::device::Shared;
use crate::options::AllReducePath;
use crate::plan::{self, Action, Plan, ReducePlan};
use crate::reduce::{HostReduce, ReduceBreakdown};
use crate::split::byte_chunks;
use crate::split::SplitState;
use crate::submit::Submitters;

/// Plans kept per backend (a model context alternates a prompt graph and a decode graph).
const PLAN_CACHE: usize = 4;

/// Most byte stretches of a gathered split result that are written into the caller's buffer one
/// by one; a result of more is assembled in host memory first and written at once.
const DIRECT_STRETCHES: usize = 16;

/// Host time spent per step of a run, summed over runs ([`crate::MetaOptions::profile`], logged at
/// info level when the backend is dropped).
#[derive(Default)]
struct Timings {
    /// Finding (or building) the plan, per run.
    plan: Vec<f64>,
    /// Reading the staged inputs and queuing their uploads.
    upload: Vec<f64>,
    /// Submitting the stages' work and all-reduces.
    submit: Vec<f64>,
    /// Gathering the results and waiting for the parts.
    finish: Vec<f64>,
    /// Where a concurrent submission's time goes, per stage of each run.
    threads: Vec<SubmitTimes>,
}

/// One concurrent submission of a stage (the parts' graphs hold all-reduce nodes), in seconds
/// from its start.
#[derive(Default, Clone, Copy)]
struct SubmitTimes {
    /// When the other parts' submissions had been handed to their threads.
    spawned: f64,
    /// The latest start of another part's submission in its thread.
    began: f64,
    /// The first part's own submission, in the calling thread.
    own: f64,
    /// The longest of the other parts' submissions.
    others: f64,
    /// The wait for the other threads after the first part's submission.
    joined: f64,
}

/// The median of `v` in microseconds.
fn median_us(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).map_or(0.0, |m| m * 1e6)
}

/// A stream over every part of a meta device.
pub struct MetaBackend {
    shared: Arc<Shared>,
    /// The order work is submitted to the parts in: parts that compute asynchronously (GPUs)
    /// first, so they run while a CPU part computes its share in the calling thread.
    order: Vec<usize>,
    backends: Vec<Box<dyn Backend>>,
    allocators: Vec<GraphAllocator>,
    plans: Vec<(GraphKey, Plan)>,
    comm: Option<Box<dyn Communicator>>,
    /// The most elements an all-reduce inside the part graphs may hold (0: none).
    in_graph_max: usize,
    /// Where all-reduces run inside the part graphs: a thread per part but the first, which
    /// submits that part's work concurrently with the caller's (see [`run`]).
    submitters: Option<Submitters>,
    host: HostReduce,
    timings: Option<Timings>,
}

impl MetaBackend {
    pub(crate) fn new(shared: Arc<Shared>) -> Result<MetaBackend> {
        let backends = shared
            .parts
            .iter()
            .map(|d| d.new_backend())
            .collect::<Result<Vec<_>>>()?;
        let allocators = shared
            .parts
            .iter()
            .map(|d| GraphAllocator::new(d.buffer_type()))
            .collect();
        let mut backends = backends;
        let host_only = shared.options.all_reduce == AllReducePath::Host;
        let comm = match shared.parts.first() {
            Some(first) if shared.parts.len() > 1 && shared.same_backend() && !host_only => {
                first.communicator(&shared.parts)?
            }
            _ => None,
        };
        if let Some(c) = &comm {
            if c.size() != shared.parts.len() {
                return Err(Error::Device {
                    device: shared.name.clone(),
                    reason: format!(
                        "the communicator has {} ranks for {} parts",
                        c.size(),
                        shared.parts.len()
                    ),
                });
            }
        }
        let mut comm = comm;
        let in_graph_max = match comm.as_mut() {
            Some(c) => c.attach(&mut backends)?,
            None => 0,
        };
        if let Some(c) = &comm {
            log::info!(
                "{}: all-reduce through {} ({} elements at most inside the graphs)",
                shared.name,
                c.name(),
                in_graph_max
            );
        }
        let submitters = if in_graph_max > 0 && shared.parts.len() > 1 {
            Some(Submitters::new(shared.parts.len() - 1, &shared.name)?)
        } else {
            None
        };
        let timings = shared.options.profile.then(Timings::default);
        let mut order: Vec<usize> = (0..shared.parts.len()).collect();
        order.sort_by_key(|&j| shared.parts[j].kind() == DeviceKind::Cpu);
        let host = HostReduce::default();
        Ok(MetaBackend {
            shared,
            order,
            backends,
            allocators,
            plans: Vec::new(),
            comm,
            in_graph_max,
            submitters,
            host,
            timings,
        })
    }

    /// What carries the all-reduces: the backend communicator's name (`nccl`, `peer`), or
    /// `host` for the generic path staged through host memory ([`AllReducePath::Host`]
    /// forces it).
    pub fn all_reduce_path(&self) -> String {
        self.comm.as_ref().map_or("host".into(), |c| c.name())
    }

    /// Turns on (emptied) or off the per-phase breakdown of the host all-reduce's time
    /// ([`MetaBackend::reduce_breakdown`]).
    pub fn set_reduce_breakdown(&mut self, on: bool) {
        self.host.set_breakdown(on);
    }

    /// Where the host all-reduces' time went since the breakdown was turned on (`None` while
    /// it is off).
    pub fn reduce_breakdown(&self) -> Option<&ReduceBreakdown> {
        self.host.breakdown()
    }

    /// Sums `count` f32 (or bf16) values at `bufs[j]` (one `(buffer, offset)` per part, each
    /// in that part's memory) into every one of them, by the path the graphs use; ordered
    /// on the parts' streams ([`Backend::synchronize`] waits for it). For measuring the path.
    pub fn all_reduce(
        &mut self,
        bufs: &[(Arc<dyn Buffer>, usize)],
        count: usize,
        dtype: ReduceType,
    ) -> Result<()> {
        reduce(
            &mut self.backends,
            &mut self.comm,
            &mut self.host,
            bufs,
            count,
            dtype,
        )
    }

    fn plan_index(&mut self, graph: &Graph, nodes: &[TensorId]) -> Result<usize> {
        if let Some(i) = self
            .plans
            .iter()
            .position(|(k, _)| k.matches(graph, nodes, &[]))
        {
            // The next run of this graph, unchanged, matches by its stamp alone.
            self.plans[i].0.refresh(graph);
            return Ok(i);
        }
        let s = &self.shared;
        let plan = plan::build(
            graph,
            nodes,
            &mut self.allocators,
            s.policy,
            &s.ratios,
            ReducePlan {
                bf16_above: s.bf16_above,
                in_graph_max: self.in_graph_max,
            },
            &s.name,
        )?;
        log::debug!(
            "{}: planned {} nodes in {} stages, {} uploads, {} gathers",
            s.name,
            nodes.len(),
            plan.reduces.len() + 1,
            plan.uploads.len(),
            plan.gathers.len()
        );
        if self.plans.len() >= PLAN_CACHE {
            self.plans.remove(0);
        }
        self.plans.push((GraphKey::new(graph, nodes, &[]), plan));
        Ok(self.plans.len() - 1)
    }
}

/// The memory of part tensor `p`.
fn part_data(plan: &Plan, j: usize, p: TensorId) -> Result<(Arc<dyn Buffer>, usize)> {
    let d = plan.parts[j].graph.data_or_err(p)?;
    Ok((d.buffer, d.offset))
}

/// Submits part `j`'s actions of stage `s`; returns the host bytes its async writes read,
/// to keep until the run is synchronized.
fn run_stage(plan: &Plan, j: usize, s: usize, b: &mut dyn Backend) -> Result<Vec<Vec<u8>>> {
    let part = &plan.parts[j];
    let mut keep = Vec::new();
    for action in &part.stages[s] {
        match action {
            Action::Compute(nodes) => b.compute(&part.graph, nodes)?,
            Action::Zero(p) => {
                let (buf, off) = part_data(plan, j, *p)?;
                let zeros = vec![0u8; part.graph.get(*p).nbytes()];
                b.set_async(buf.as_ref(), off, &zeros)?;
                keep.push(zeros);
            }
        }
    }
    Ok(keep)
}

/// What a run drives: the parts' streams and the all-reduce paths.
struct Streams<'a> {
    /// Where the part graphs hold all-reduce nodes, the threads that submit every part's work
    /// but the first's (each part then submits from its own thread).
    submitters: Option<&'a Submitters>,
    order: &'a [usize],
    backends: &'a mut [Box<dyn Backend>],
    comm: &'a mut Option<Box<dyn Communicator>>,
    host: &'a mut HostReduce,
}

/// Runs a planned graph.
fn run(
    plan: &Plan,
    graph: &Graph,
    streams: Streams<'_>,
    mut timings: Option<&mut Timings>,
) -> Result<()> {
    let Streams {
        submitters,
        order,
        backends,
        comm,
        host,
    } = streams;
    let mut clock = std::time::Instant::now();
    let mut lap = |slot: fn(&mut Timings) -> &mut Vec<f64>, timings: &mut Option<&mut Timings>| {
        if let Some(t) = timings.as_deref_mut() {
            slot(t).push(clock.elapsed().as_secs_f64());
            clock = std::time::Instant::now();
        }
    };
    // Host bytes handed to async writes stay alive until the final synchronize.
    let mut keep: Vec<Vec<u8>> = Vec::new();
    for up in &plan.uploads {
        let t = graph.get(up.tensor);
        let data = graph.data_or_err(up.tensor)?;
        let mut full = vec![0u8; t.nbytes()];
        data.buffer.get(data.offset, &mut full)?;
        for (j, p) in up.part.iter().enumerate() {
            let Some(p) = *p else { continue };
            let (buf, off) = part_data(plan, j, p)?;
            let bytes = slice_of(t.dtype, t.ne, &up.state, j, &full);
            backends[j].set_async(buf.as_ref(), off, &bytes)?;
            keep.push(bytes);
        }
    }
    lap(|t| &mut t.upload, &mut timings);
    let n_stages = plan.parts.first().map_or(0, |p| p.stages.len());
    for s in 0..n_stages {
        if let Some(submitters) = submitters {
            // Each part submits concurrently with the others: a part's graph waits inside for
            // the others' all-reduce nodes, and one that has filled its launch queue must not
            // keep the next part from submitting. The first part submits from this thread,
            // the others from the submitting threads.
            let t0 = std::time::Instant::now();
            let Some((first, rest)) = backends.split_first_mut() else {
                return Err(Error::Invalid("a meta graph without parts".into()));
            };
            let each = |j: usize, b: &mut Box<dyn Backend>| {
                let began = t0.elapsed();
                let r = run_stage(plan, j + 1, s, b.as_mut());
                r.map(|k| (k, began, t0.elapsed()))
            };
            let mut spawned = t0.elapsed();
            let (own, others) = submitters.run(rest.iter_mut().collect(), &each, || {
                spawned = t0.elapsed();
                let r = run_stage(plan, 0, s, first.as_mut());
                (r, t0.elapsed())
            });
            let (own, own_end) = own;
            let mut times = SubmitTimes {
                spawned: spawned.as_secs_f64(),
                own: (own_end - spawned).as_secs_f64(),
                joined: (t0.elapsed() - own_end).as_secs_f64(),
                ..SubmitTimes::default()
            };
            let mut kept = vec![own];
            for r in others {
                kept.push(r.map(|(k, began, ended)| {
                    times.began = times.began.max(began.as_secs_f64());
                    times.others = times.others.max((ended - began).as_secs_f64());
                    k
                }));
            }
            if let Some(t) = timings.as_deref_mut() {
                t.threads.push(times);
            }
            for k in kept {
                keep.extend(k?);
            }
        } else {
            for &j in order {
                keep.extend(run_stage(plan, j, s, backends[j].as_mut())?);
            }
        }
        if let Some(items) = plan.reduces.get(s) {
            for item in items {
                let bufs = item
                    .part
                    .iter()
                    .enumerate()
                    .map(|(j, &p)| part_data(plan, j, p))
                    .collect::<Result<Vec<_>>>()?;
                let dtype = if item.bf16 {
                    ReduceType::BF16
                } else {
                    ReduceType::F32
                };
                reduce(backends, comm, host, &bufs, item.count, dtype)?;
            }
        }
    }
    lap(|t| &mut t.submit, &mut timings);
    gather(plan, graph, backends)?;
    for b in backends.iter_mut() {
        b.synchronize()?;
    }
    drop(keep);
    lap(|t| &mut t.finish, &mut timings);
    Ok(())
}

/// One all-reduce: through the communicator where there is one, else staged through the host.
fn reduce(
    backends: &mut [Box<dyn Backend>],
    comm: &mut Option<Box<dyn Communicator>>,
    host: &mut HostReduce,
    bufs: &[(Arc<dyn Buffer>, usize)],
    count: usize,
    dtype: ReduceType,
) -> Result<()> {
    match comm {
        Some(c) => c.all_reduce(backends, bufs, count, dtype),
        None => host.all_reduce(backends, bufs, count, dtype == ReduceType::BF16),
    }
}

/// Reads the results back into the caller's memory: slices joined, partial sums added, a
/// mirrored result from the first part that holds it. Results that [`gather_in_place`] can
/// read straight into a staged buffer go that way; the others through host copies.
fn gather(plan: &Plan, graph: &Graph, backends: &mut [Box<dyn Backend>]) -> Result<()> {
    // Per result, the bytes read from each part; None for a result read in place by
    // gather_in_place (nothing left to do for it below).
    let mut bufs: Vec<Option<Vec<Option<Vec<u8>>>>> = Vec::with_capacity(plan.gathers.len());
    for gt in &plan.gathers {
        if gather_in_place(plan, graph, gt, backends)? {
            bufs.push(None);
            continue;
        }
        let mut per_part: Vec<Option<Vec<u8>>> = vec![None; backends.len()];
        let first = gt.part.iter().position(Option::is_some);
        for (j, p) in gt.part.iter().enumerate() {
            let Some(p) = *p else { continue };
            if gt.state == SplitState::Mirrored && Some(j) != first {
                continue;
            }
            let (buf, off) = part_data(plan, j, p)?;
            let mut bytes = vec![0u8; plan.parts[j].graph.get(p).nbytes()];
            backends[j].get_async(buf.as_ref(), off, &mut bytes)?;
            per_part[j] = Some(bytes);
        }
        bufs.push(Some(per_part));
    }
    if plan.gathers.is_empty() {
        return Ok(());
    }
    for b in backends.iter_mut() {
        b.synchronize()?;
    }
    for (gt, per_part) in plan.gathers.iter().zip(bufs) {
        let Some(per_part) = per_part else { continue };
        let t = graph.get(gt.tensor);
        let data = graph.data_or_err(gt.tensor)?;
        let n = t.nbytes();
        // Results of few stretches (a row of logits split by columns, a mirrored tensor) go
        // straight into the caller's buffer; others are assembled first.
        let mut full = vec![];
        match &gt.state {
            SplitState::Mirrored => match per_part.into_iter().flatten().next() {
                Some(b) => data.buffer.set(data.offset, &b[..n])?,
                None => data.buffer.set(data.offset, &vec![0u8; n])?,
            },
            SplitState::Split(x) => {
                let chunks: Vec<_> = (0..per_part.len())
                    .map(|j| byte_chunks(t.dtype, t.ne, x, j))
                    .collect();
                let direct = chunks.iter().map(Vec::len).sum::<usize>() <= DIRECT_STRETCHES;
                if !direct {
                    full = vec![0u8; n];
                }
                for (b, stretches) in per_part.iter().zip(&chunks) {
                    let Some(b) = b else { continue };
                    for &(f, p, len) in stretches {
                        if direct {
                            data.buffer.set(data.offset + f, &b[p..p + len])?;
                        } else {
                            full[f..f + len].copy_from_slice(&b[p..p + len]);
                        }
                    }
                }
            }
            SplitState::Partial => {
                if t.dtype != DType::F32 {
                    return Err(Error::Split {
                        tensor: graph.label(gt.tensor),
                        op: t.op.name(),
                        reason: "a partial result must be f32 to be summed".into(),
                    });
                }
                let mut sum = vec![0f32; n / 4];
                for b in per_part.iter().flatten() {
                    for (s, c) in sum.iter_mut().zip(b.chunks_exact(4)) {
                        *s += f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
                    }
                }
                full = vec![0u8; n];
                for (o, s) in full.chunks_exact_mut(4).zip(&sum) {
                    o.copy_from_slice(&s.to_le_bytes());
                }
            }
        }
        if !full.is_empty() {
            data.buffer.set(data.offset, &full)?;
        }
    }
    Ok(())
}

/// Reads a result straight from the parts into the caller's staged buffer, with no host copy
/// between, then waits for the parts: a mirrored result from its first part, a split one whose
/// parts are few byte stretches (a row of logits split by columns) from each. Returns whether
/// it did (false: the result takes the general path).
fn gather_in_place(
    plan: &Plan,
    graph: &Graph,
    gt: &plan::Transfer,
    backends: &mut [Box<dyn Backend>],
) -> Result<bool> {
    let t = graph.get(gt.tensor);
    let n = t.nbytes();
    // Per part: (byte offset in the result, byte offset in the part's tensor, bytes).
    let stretches: Vec<Vec<(usize, usize, usize)>> = match &gt.state {
        SplitState::Mirrored => {
            let Some(first) = gt.part.iter().position(Option::is_some) else {
                return Ok(false);
            };
            (0..gt.part.len())
                .map(|j| {
                    if j == first {
                        vec![(0, 0, n)]
                    } else {
                        Vec::new()
                    }
                })
                .collect()
        }
        SplitState::Split(x) => {
            let chunks: Vec<_> = (0..gt.part.len())
                .map(|j| byte_chunks(t.dtype, t.ne, x, j))
                .collect();
            if chunks.iter().map(Vec::len).sum::<usize>() > DIRECT_STRETCHES {
                return Ok(false);
            }
            chunks
        }
        SplitState::Partial => return Ok(false),
    };
    let data = graph.data_or_err(gt.tensor)?;
    let Some(meta) = data
        .buffer
        .as_any()
        .downcast_ref::<crate::buffer::MetaBuffer>()
    else {
        return Ok(false);
    };
    let read = meta.with_staged_mut(|bytes| {
        let dst = bytes.get_mut(data.offset..data.offset + n).ok_or_else(|| {
            Error::Invalid(format!("'{}' lies past its buffer", graph.label(gt.tensor)))
        })?;
        for (j, part) in stretches.iter().enumerate() {
            let Some(p) = gt.part[j] else { continue };
            let (buf, off) = part_data(plan, j, p)?;
            for &(f, at, len) in part {
                backends[j].get_async(buf.as_ref(), off + at, &mut dst[f..f + len])?;
            }
        }
        // The reads land in `dst` by the time every part has synchronized.
        backends.iter_mut().try_for_each(|b| b.synchronize())
    });
    match read {
        Some(r) => r.map(|()| true),
        None => Ok(false),
    }
}

impl Drop for MetaBackend {
    fn drop(&mut self) {
        if let Some(t) = &self.timings {
            log::info!(
                "{}: {} runs, median host µs per run: plan {:.0}, upload {:.0}, submit {:.0}, gather and wait {:.0}",
                self.shared.name,
                t.plan.len(),
                median_us(&t.plan),
                median_us(&t.upload),
                median_us(&t.submit),
                median_us(&t.finish)
            );
            if !t.threads.is_empty() {
                let m = |f: fn(&SubmitTimes) -> f64| {
                    median_us(&t.threads.iter().map(f).collect::<Vec<_>>())
                };
                log::info!(
                    "{}: concurrent submission, median µs: handed over {:.0}, latest part began {:.0}, first part {:.0}, other parts {:.0}, join wait {:.0}",
                    self.shared.name,
                    m(|x| x.spawned),
                    m(|x| x.began),
                    m(|x| x.own),
                    m(|x| x.others),
                    m(|x| x.joined)
                );
            }
        }
    }
}

impl Backend for MetaBackend {
    fn name(&self) -> String {
        self.shared.name.clone()
    }

    fn compute(&mut self, graph: &Graph, nodes: &[TensorId]) -> Result<()> {
        let start = std::time::Instant::now();
        if let Some(s) = &self.submitters {
            // Awake by the time the run hands them their parts' work (after planning and the
            // uploads).
            s.wake();
        }
        let i = self.plan_index(graph, nodes)?;
        let MetaBackend {
            plans,
            order,
            backends,
            comm,
            host,
            submitters,
            timings,
            ..
        } = self;
        if let Some(t) = timings.as_mut() {
            t.plan.push(start.elapsed().as_secs_f64());
        }
        let streams = Streams {
            submitters: submitters.as_ref(),
            order,
            backends,
            comm,
            host,
        };
        run(&plans[i].1, graph, streams, timings.as_mut())
    }

    fn synchronize(&mut self) -> Result<()> {
        self.backends.iter_mut().try_for_each(|b| b.synchronize())
    }
}
