//! The meta layer's all-reduce inside the part graphs, without a GPU.
//!
//! When the parts of a meta device share a backend whose communicator can join the parts'
//! streams ([`Communicator::attach`] returns a non-zero element count), the plans put
//! [`Op::AllReduce`] nodes into every part's graph instead of cutting the graph into stages,
//! and the meta backend submits each part's work from its own thread (the caller's, or one of
//! the submitting threads the meta backend keeps), because a part's graph waits inside the
//! all-reduce until every other part reaches it. Only the CUDA backend does this for real, and
//! CI has no GPU, so this file builds a mock: `GroupCpu`, a CPU device whose
//! communicator is a rendezvous of N ranks in host memory, and whose backend runs the part
//! graph on the CPU backend but stops at each `ALL_REDUCE` node to sum the node's memory with
//! the other ranks (a barrier, the sum in rank order so every rank gets the same bits, a
//! barrier). Called one part after another, as the stage-cut mode does, such a node would
//! wait forever; the barrier gives up after a timeout instead, so a regression fails rather
//! than hangs.
//!
//! The tests check that row-parallel graphs (partial results that must be summed) on 2 and 3
//! parts, with a part holding an empty slice, run through the scheduler, and the conformance
//! table (plus mat-vec cases split along k whose product feeds a row op) give the CPU's
//! results through the in-graph path; that the path was taken (the mock counts the
//! `ALL_REDUCE` nodes it ran and the between-stage all-reduces, which must be none); and, for
//! contrast, that the same mock with attaching turned off, with a small in-graph limit, or
//! with bf16 sums for large partials, sends those all-reduces between stages. The barrier is a
//! `Condvar` one rather than `std::sync::Barrier` only for its timeout.

mod meta_common;
use meta_common::*;

use std::any::Any;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tessera::meta::{AllReducePath, InputPolicy, MetaDevice, MetaOptions, SplitRatios, SplitState};
use tessera_conformance::{test, test_cases, Case, Options, Reference, Status, Summary, Tolerance};
use tessera_core::{
    Backend, Buffer, BufferType, Communicator, DType, Device, DeviceKind, Error, Graph, Memory, Op,
    ReduceType, Result, TensorId, UnaryOp,
};
use tessera_cpu::CpuDevice;

/// How long a rank waits at the barrier for the others before it reports the meta layer did
/// not run the parts side by side.
const BARRIER_TIMEOUT: Duration = Duration::from_secs(30);

// ---- the mock ----

/// What the mock did, shared by every device (and so every meta backend) of one fleet.
#[derive(Default)]
struct Stats {
    /// `ALL_REDUCE` nodes run, over all ranks.
    in_graph_nodes: AtomicUsize,
    /// Calls of [`Communicator::all_reduce`] (between stages).
    between_stages: AtomicUsize,
    /// Communicators made.
    communicators: AtomicUsize,
}

impl Stats {
    fn in_graph(&self) -> usize {
        self.in_graph_nodes.load(Ordering::SeqCst)
    }
    fn between(&self) -> usize {
        self.between_stages.load(Ordering::SeqCst)
    }
}

/// The ranks' meeting point: a reusable barrier with a timeout and one slot per rank.
struct Rendezvous {
    n: usize,
    timeout: Duration,
    state: Mutex<RvState>,
    cv: Condvar,
}

struct RvState {
    /// Each rank's values of the current all-reduce.
    slots: Vec<Vec<f32>>,
    arrived: usize,
    generation: u64,
    /// A rank timed out: every later wait fails at once.
    broken: bool,
}

impl Rendezvous {
    fn new(n: usize, timeout: Duration) -> Rendezvous {
        Rendezvous {
            n,
            timeout,
            state: Mutex::new(RvState {
                slots: vec![Vec::new(); n],
                arrived: 0,
                generation: 0,
                broken: false,
            }),
            cv: Condvar::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, RvState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Waits until all `n` ranks have arrived.
    fn barrier<'a>(
        &'a self,
        mut st: MutexGuard<'a, RvState>,
        rank: usize,
    ) -> Result<MutexGuard<'a, RvState>> {
        let fail = |why: &str| {
            Err(Error::Device {
                device: format!("group:{rank}"),
                reason: why.into(),
            })
        };
        if st.broken {
            return fail("another rank gave up waiting at the barrier");
        }
        let generation = st.generation;
        st.arrived += 1;
        if st.arrived == self.n {
            st.arrived = 0;
            st.generation += 1;
            self.cv.notify_all();
            return Ok(st);
        }
        let deadline = Instant::now() + self.timeout;
        while st.generation == generation {
            if st.broken {
                return fail("another rank gave up waiting at the barrier");
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                st.broken = true;
                self.cv.notify_all();
                return fail(
                    "the other ranks never reached the all-reduce: were the parts' graphs \
                     submitted one after another instead of side by side?",
                );
            }
            st = self
                .cv
                .wait_timeout(st, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        Ok(st)
    }

    /// Sums `values` over the ranks in place (called by every rank at once, from its own
    /// thread). The sum is taken in rank order, so every rank gets the same bits.
    fn all_reduce(&self, rank: usize, values: &mut [f32]) -> Result<()> {
        let mut st = self.lock();
        st.slots[rank] = values.to_vec();
        let st = self.barrier(st, rank)?;
        let lens: Vec<usize> = st.slots.iter().map(Vec::len).collect();
        let result = if lens.iter().all(|&l| l == values.len()) {
            for (i, v) in values.iter_mut().enumerate() {
                *v = st.slots.iter().fold(0f32, |acc, s| acc + s[i]);
            }
            Ok(())
        } else {
            Err(Error::Device {
                device: format!("group:{rank}"),
                reason: format!("the ranks' all-reduce nodes differ in size: {lens:?}"),
            })
        };
        // No rank may write its next slot before every rank has read this one.
        drop(self.barrier(st, rank)?);
        result
    }
}

/// A fleet of `GroupCpu` devices: their shared counters and the in-graph limit their
/// communicators offer (0: they do not attach, and every all-reduce runs between stages).
#[derive(Clone)]
struct Fleet {
    stats: Arc<Stats>,
    in_graph_max: usize,
}

impl Fleet {
    fn new(in_graph_max: usize) -> Fleet {
        Fleet {
            stats: Arc::new(Stats::default()),
            in_graph_max,
        }
    }

    /// A meta device of one `GroupCpu` part per ratio.
    fn meta(&self, ratios: &[f64]) -> MetaDevice {
        self.meta_with(ratios, MetaOptions::default())
    }

    /// [`Fleet::meta`] running as `options` say.
    fn meta_with(&self, ratios: &[f64], options: MetaOptions) -> MetaDevice {
        let parts: Vec<Arc<dyn Device>> = (0..ratios.len())
            .map(|rank| {
                Arc::new(GroupCpu {
                    inner: CpuDevice::new().with_threads(1),
                    rank,
                    fleet: self.clone(),
                }) as Arc<dyn Device>
            })
            .collect();
        MetaDevice::with_options(parts, &SplitRatios::Given(ratios.to_vec()), options)
            .expect("a meta device")
    }
}

/// A CPU device whose parts of one meta device form a communicator group.
struct GroupCpu {
    inner: CpuDevice,
    rank: usize,
    fleet: Fleet,
}

impl Device for GroupCpu {
    fn name(&self) -> String {
        // One backend name for every rank, so the meta device asks for a communicator.
        format!("group:{}", self.rank)
    }
    fn description(&self) -> String {
        format!("mock group rank over {}", self.inner.description())
    }
    fn kind(&self) -> DeviceKind {
        self.inner.kind()
    }
    fn memory(&self) -> Memory {
        self.inner.memory()
    }
    fn buffer_type(&self) -> Arc<dyn BufferType> {
        self.inner.buffer_type()
    }
    fn host_buffer_type(&self) -> Option<Arc<dyn BufferType>> {
        self.inner.host_buffer_type()
    }
    fn new_backend(&self) -> Result<Box<dyn Backend>> {
        Ok(Box::new(GroupBackend {
            inner: self.inner.new_backend()?,
            rank: self.rank,
            joined: None,
            stats: self.fleet.stats.clone(),
        }))
    }
    fn supports_op(&self, graph: &Graph, id: TensorId) -> bool {
        let t = graph.get(id);
        if t.op == Op::AllReduce {
            return t.dtype == DType::F32 && t.is_contiguous();
        }
        self.inner.supports_op(graph, id)
    }
    fn can_use_buffer(&self, buffer: &dyn Buffer) -> bool {
        self.inner.can_use_buffer(buffer)
    }
    fn buffer_from_host(
        &self,
        bytes: Arc<dyn tessera_core::backend::HostBytes>,
    ) -> Result<Option<Arc<dyn Buffer>>> {
        self.inner.buffer_from_host(bytes)
    }
    fn communicator(&self, devices: &[Arc<dyn Device>]) -> Result<Option<Box<dyn Communicator>>> {
        for (j, d) in devices.iter().enumerate() {
            match d.as_any().downcast_ref::<GroupCpu>() {
                Some(g) if g.rank == j => {}
                _ => return Ok(None),
            }
        }
        self.fleet
            .stats
            .communicators
            .fetch_add(1, Ordering::SeqCst);
        Ok(Some(Box::new(GroupComm {
            rv: Arc::new(Rendezvous::new(devices.len(), BARRIER_TIMEOUT)),
            fleet: self.fleet.clone(),
        })))
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// One rank's stream: the CPU backend, stopping at `ALL_REDUCE` nodes to meet the others.
struct GroupBackend {
    inner: Box<dyn Backend>,
    rank: usize,
    /// The group it joined ([`Communicator::attach`]) and its rank there.
    joined: Option<(Arc<Rendezvous>, usize)>,
    stats: Arc<Stats>,
}

impl GroupBackend {
    fn all_reduce_node(&mut self, graph: &Graph, id: TensorId) -> Result<()> {
        let Some((rv, rank)) = self.joined.clone() else {
            return Err(Error::Unsupported {
                backend: format!("group:{}", self.rank),
                what: "ALL_REDUCE outside a communicator group".into(),
            });
        };
        let t = graph.get(id);
        if t.dtype != DType::F32 || !t.is_contiguous() || t.src.len() != 1 {
            return Err(Error::Unsupported {
                backend: format!("group:{}", self.rank),
                what: format!("ALL_REDUCE of {} {:?}", t.dtype, t.ne),
            });
        }
        if t.view_src != Some(t.src[0]) {
            return Err(Error::Invalid(format!(
                "{} is not an in-place view of its source",
                graph.label(id)
            )));
        }
        self.inner.synchronize()?;
        let d = graph.data_or_err(id)?;
        let mut bytes = vec![0u8; t.nbytes()];
        d.buffer.get(d.offset, &mut bytes)?;
        let mut values: Vec<f32> = bytes
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        rv.all_reduce(rank, &mut values)?;
        for (o, v) in bytes.chunks_exact_mut(4).zip(&values) {
            o.copy_from_slice(&v.to_le_bytes());
        }
        d.buffer.set(d.offset, &bytes)?;
        self.stats.in_graph_nodes.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
}

impl Backend for GroupBackend {
    fn name(&self) -> String {
        format!("group:{}", self.rank)
    }
    fn compute(&mut self, graph: &Graph, nodes: &[TensorId]) -> Result<()> {
        let mut start = 0;
        for (i, &id) in nodes.iter().enumerate() {
            if graph.get(id).op == Op::AllReduce {
                if start < i {
                    self.inner.compute(graph, &nodes[start..i])?;
                }
                self.all_reduce_node(graph, id)?;
                start = i + 1;
            }
        }
        if start < nodes.len() {
            self.inner.compute(graph, &nodes[start..])?;
        }
        Ok(())
    }
    fn synchronize(&mut self) -> Result<()> {
        self.inner.synchronize()
    }
    fn as_any_mut(&mut self) -> Option<&mut dyn Any> {
        Some(self)
    }
}

/// The group's communicator: joins the ranks' backends, and sums between stages through
/// host reads and writes of the ranks' buffers.
struct GroupComm {
    rv: Arc<Rendezvous>,
    fleet: Fleet,
}

fn read_values(buf: &dyn Buffer, off: usize, count: usize, dtype: ReduceType) -> Result<Vec<f32>> {
    Ok(match dtype {
        ReduceType::F32 => {
            let mut b = vec![0u8; count * 4];
            buf.get(off, &mut b)?;
            b.chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect()
        }
        ReduceType::BF16 => {
            let mut b = vec![0u8; count * 2];
            buf.get(off, &mut b)?;
            b.chunks_exact(2)
                .map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f32())
                .collect()
        }
    })
}

fn write_values(buf: &dyn Buffer, off: usize, values: &[f32], dtype: ReduceType) -> Result<()> {
    let bytes: Vec<u8> = match dtype {
        ReduceType::F32 => values.iter().flat_map(|v| v.to_le_bytes()).collect(),
        ReduceType::BF16 => values
            .iter()
            .flat_map(|&v| half::bf16::from_f32(v).to_le_bytes())
            .collect(),
    };
    buf.set(off, &bytes)
}

impl Communicator for GroupComm {
    fn name(&self) -> String {
        "mock-group".into()
    }
    fn size(&self) -> usize {
        self.rv.n
    }
    fn all_reduce(
        &mut self,
        backends: &mut [Box<dyn Backend>],
        bufs: &[(Arc<dyn Buffer>, usize)],
        count: usize,
        dtype: ReduceType,
    ) -> Result<()> {
        self.fleet
            .stats
            .between_stages
            .fetch_add(1, Ordering::SeqCst);
        if bufs.len() != self.rv.n || backends.len() != self.rv.n {
            return Err(Error::Invalid(format!(
                "all-reduce over {} buffers and {} backends for {} ranks",
                bufs.len(),
                backends.len(),
                self.rv.n
            )));
        }
        for b in backends.iter_mut() {
            b.synchronize()?;
        }
        let mut sum = vec![0f32; count];
        for (buf, off) in bufs {
            for (s, v) in sum
                .iter_mut()
                .zip(read_values(buf.as_ref(), *off, count, dtype)?)
            {
                *s += v;
            }
        }
        for (buf, off) in bufs {
            write_values(buf.as_ref(), *off, &sum, dtype)?;
        }
        Ok(())
    }
    fn attach(&mut self, backends: &mut [Box<dyn Backend>]) -> Result<usize> {
        if self.fleet.in_graph_max == 0 {
            return Ok(0);
        }
        for (j, b) in backends.iter_mut().enumerate() {
            let gb = b
                .as_any_mut()
                .and_then(|a| a.downcast_mut::<GroupBackend>())
                .ok_or_else(|| Error::Invalid(format!("rank {j}'s backend is not a group rank")))?;
            gb.joined = Some((self.rv.clone(), j));
        }
        Ok(self.fleet.in_graph_max)
    }
}

// ---- hand-built graphs with sharded weights (as in meta.rs) ----

/// Two row-parallel layers in a row, each summed before a norm: a large partial (64 x 5) and
/// a small one (16 x 5), for an in-graph limit between them.
fn two_reduce_weights(ratios: &[f64], dtype: DType) -> Vec<W> {
    let (k, m) = (64, 96);
    let hidden = tessera::meta::partition_units(m, 32, ratios, "hidden").unwrap();
    let hidden2 = tessera::meta::partition_units(k, 32, ratios, "hidden2").unwrap();
    vec![
        weight(
            dtype,
            [k, m, 1, 1],
            SplitState::split(1, hidden.clone()),
            11,
        ),
        weight(dtype, [m, k, 1, 1], SplitState::split(0, hidden), 12),
        weight(
            dtype,
            [k, k, 1, 1],
            SplitState::split(1, hidden2.clone()),
            13,
        ),
        weight(dtype, [k, 16, 1, 1], SplitState::split(0, hidden2), 14),
    ]
}

fn two_reduce(g: &mut Graph, w: &[TensorId], x: TensorId) -> Result<Vec<TensorId>> {
    let h = g.mul_mat(w[0], x)?;
    let h = g.unary(h, UnaryOp::Gelu)?;
    let y = g.mul_mat(w[1], h)?; // partial, 64 x 5
    let z = g.add(y, x)?;
    let z = g.rms_norm(z, 1e-5)?;
    let h2 = g.mul_mat(w[2], z)?;
    let h2 = g.unary(h2, UnaryOp::Silu)?;
    let y2 = g.mul_mat(w[3], h2)?; // partial, 16 x 5
    let out = g.rms_norm(y2, 1e-5)?;
    Ok(vec![out, z])
}

/// Runs `build` on the CPU and on a fleet's meta device; checks the outputs agree.
fn compare(
    fleet: &Fleet,
    ratios: &[f64],
    ws: &dyn Fn(&[f64]) -> Vec<W>,
    build: &BuildFn,
    runs: usize,
    what: &str,
) {
    let want = eval(&cpu(), &ws(ratios), &[64, 5], build, 1).unwrap();
    let dev: Arc<dyn Device> = Arc::new(fleet.meta(ratios));
    let got = eval(&dev, &ws(ratios), &[64, 5], build, runs)
        .unwrap_or_else(|e| panic!("{what} on {}: {e}", dev.name()));
    assert_close(what, &want, &got, 1e-10);
}

// ---- tests ----

#[test]
fn the_mock_group_is_the_path_the_meta_backend_uses() {
    let fleet = Fleet::new(1 << 24);
    let m = fleet.meta(&[0.5, 0.5]);
    let mb = m.meta_backend().unwrap();
    assert_eq!(mb.all_reduce_path(), "mock-group");
    assert_eq!(fleet.stats.communicators.load(Ordering::SeqCst), 1);
}

/// Two meta devices of one process with different options: the one whose options ask for the
/// host path never asks its parts for a communicator, the other still uses the group's.
#[test]
fn the_host_path_option_leaves_the_communicator_out_for_its_device_only() {
    let fleet = Fleet::new(1 << 24);
    let host = fleet.meta_with(
        &[0.5, 0.5],
        MetaOptions::default().with_all_reduce(AllReducePath::Host),
    );
    let auto = fleet.meta(&[0.5, 0.5]);
    assert_eq!(host.options().all_reduce, AllReducePath::Host);
    let mut hb = host.meta_backend().unwrap();
    let ab = auto.meta_backend().unwrap();
    assert_eq!(hb.all_reduce_path(), "host");
    assert_eq!(ab.all_reduce_path(), "mock-group");
    assert_eq!(fleet.stats.communicators.load(Ordering::SeqCst), 1);
    // The host path sums too.
    let bufs: Vec<(Arc<dyn Buffer>, usize)> = [1.0f32, 2.0]
        .iter()
        .map(|&v| {
            let b = CpuDevice::new().buffer_type().alloc(16).unwrap();
            write_values(b.as_ref(), 0, &[v; 4], ReduceType::F32).unwrap();
            (b, 0)
        })
        .collect();
    hb.all_reduce(&bufs, 4, ReduceType::F32).unwrap();
    hb.synchronize().unwrap();
    for (b, _) in &bufs {
        let sums = read_values(b.as_ref(), 0, 4, ReduceType::F32).unwrap();
        assert_eq!(sums, [3.0; 4]);
    }
}

#[test]
fn a_rank_left_alone_at_the_barrier_fails_instead_of_hanging() {
    let rv = Rendezvous::new(2, Duration::from_millis(100));
    let mut v = vec![1.5f32; 4];
    let e = rv.all_reduce(0, &mut v).unwrap_err();
    assert!(e.to_string().contains("side by side"), "{e}");
    // The group stays broken: a late rank fails at once.
    assert!(rv.all_reduce(1, &mut v).is_err());
}

#[test]
fn ranks_get_the_same_sum_in_rank_order() {
    let rv = Rendezvous::new(3, BARRIER_TIMEOUT);
    let inputs = [vec![1e8f32, 1.0], vec![-1e8, 2.0], vec![1.0, 3.0]];
    let outs: Vec<Vec<f32>> = std::thread::scope(|s| {
        let jobs: Vec<_> = inputs
            .iter()
            .enumerate()
            .map(|(r, v)| {
                let rv = &rv;
                s.spawn(move || {
                    let mut v = v.clone();
                    rv.all_reduce(r, &mut v).map(|()| v)
                })
            })
            .collect();
        jobs.into_iter()
            .map(|j| j.join().unwrap().unwrap())
            .collect()
    });
    // ((0 + 1e8) - 1e8) + 1 = 1 in f32, on every rank.
    for o in &outs {
        assert_eq!(o, &vec![1.0, 6.0]);
    }
}

#[test]
fn row_parallel_partials_are_summed_inside_the_graphs_on_two_parts() {
    for dtype in [DType::F32, DType::Q8_0] {
        let fleet = Fleet::new(1 << 24);
        let ratios = [0.6, 0.4];
        let what = format!("mlp {dtype} on 2 parts");
        compare(&fleet, &ratios, &|r| mlp_weights(r, dtype), &mlp, 3, &what);
        // One partial (y) per run, summed by an ALL_REDUCE node on each of the 2 ranks.
        assert_eq!(fleet.stats.in_graph(), 3 * 2, "{what}");
        assert_eq!(
            fleet.stats.between(),
            0,
            "{what}: an all-reduce ran between stages"
        );
    }
}

#[test]
fn row_parallel_partials_are_summed_inside_the_graphs_on_three_parts() {
    let fleet = Fleet::new(1 << 24);
    let what = "mlp on 3 parts";
    compare(
        &fleet,
        &[0.5, 0.3, 0.2],
        &|r| mlp_weights(r, DType::Q8_0),
        &mlp,
        2,
        what,
    );
    assert_eq!(fleet.stats.in_graph(), 2 * 3, "{what}");
    assert_eq!(fleet.stats.between(), 0, "{what}");

    let fleet = Fleet::new(1 << 24);
    let what = "two reduces on 3 parts";
    compare(
        &fleet,
        &[0.4, 0.35, 0.25],
        &|r| two_reduce_weights(r, DType::F32),
        &two_reduce,
        2,
        what,
    );
    assert_eq!(fleet.stats.in_graph(), 2 * 2 * 3, "{what}");
    assert_eq!(fleet.stats.between(), 0, "{what}");
}

#[test]
fn a_part_with_an_empty_slice_still_joins_the_in_graph_sum() {
    let fleet = Fleet::new(1 << 24);
    let what = "mlp with an empty third part";
    compare(
        &fleet,
        &[0.6, 0.4, 0.0],
        &|r| mlp_weights(r, DType::Q8_0),
        &mlp,
        2,
        what,
    );
    assert_eq!(fleet.stats.in_graph(), 2 * 3, "{what}");
    assert_eq!(fleet.stats.between(), 0, "{what}");
}

#[test]
fn without_attaching_the_same_mock_sums_between_stages() {
    let fleet = Fleet::new(0);
    let what = "mlp, stage-cut mode";
    compare(
        &fleet,
        &[0.6, 0.4],
        &|r| mlp_weights(r, DType::Q8_0),
        &mlp,
        2,
        what,
    );
    assert_eq!(fleet.stats.in_graph(), 0, "{what}: an ALL_REDUCE node ran");
    assert_eq!(fleet.stats.between(), 2, "{what}");
}

#[test]
fn an_in_graph_limit_sends_larger_partials_between_stages() {
    // y (320 elements) is over the limit, y2 (80) under it.
    let fleet = Fleet::new(100);
    let what = "two reduces, limit 100";
    compare(
        &fleet,
        &[0.7, 0.3],
        &|r| two_reduce_weights(r, DType::F32),
        &two_reduce,
        2,
        what,
    );
    assert_eq!(fleet.stats.in_graph(), 2 * 2, "{what}");
    assert_eq!(fleet.stats.between(), 2, "{what}");
}

#[test]
fn bf16_partials_go_between_stages_and_the_rest_stay_inside() {
    // Partials of at least 1000 bytes move as bf16, which only the between-stage path does:
    // y (64 x 5 f32, 1280 bytes) goes between stages, y2 (16 x 5, 320 bytes) stays inside.
    let fleet = Fleet::new(1 << 24);
    let ratios = [0.7, 0.3];
    let ws = |r: &[f64]| two_reduce_weights(r, DType::F32);
    let want = eval(&cpu(), &ws(&ratios), &[64, 5], &two_reduce, 1).unwrap();
    let dev: Arc<dyn Device> = Arc::new(fleet.meta(&ratios).with_bf16_reduce(1000));
    let got = eval(&dev, &ws(&ratios), &[64, 5], &two_reduce, 2).unwrap();
    // bf16 keeps 8 significant bits: about 4e-3 relative per value.
    assert_close("two reduces, bf16 above 1000 bytes", &want, &got, 1e-4);
    assert!(nmse(&want[1], &got[1]) > 0.0, "the bf16 path ran as f32");
    assert_eq!(fleet.stats.in_graph(), 2 * 2);
    assert_eq!(fleet.stats.between(), 2);
}

#[test]
fn the_scheduler_runs_a_meta_device_that_sums_inside_its_graphs() {
    let fleet = Fleet::new(1 << 24);
    let ratios = [0.25, 0.75];
    let dev: Arc<dyn Device> = Arc::new(fleet.meta(&ratios));
    scheduled_mlp_matches_the_cpu(&dev, &ratios, 5, 2);
    assert_eq!(fleet.stats.in_graph(), 2 * 2);
    assert_eq!(fleet.stats.between(), 0);
}

/// Mat-vec cases whose product feeds a row op: with one column the only split of the inputs
/// is along k, so the product is partial and must be summed before the norm (a decode step's
/// row-parallel projection).
fn matvec_then_norm_cases() -> Vec<Case> {
    let mut cases = Vec::new();
    for ta in [
        DType::F32,
        DType::F16,
        DType::Q4_0,
        DType::Q8_0,
        DType::Q4_K,
        DType::Q6_K,
    ] {
        for (k, m) in [(768, 32), (1536, 80)] {
            for soft_max in [false, true] {
                let then = if soft_max { "soft_max" } else { "rms_norm" };
                cases.push(Case::new(
                    "MUL_MAT",
                    format!("type_a={ta},type_b=f32,k={k},m={m},n=1,then={then}"),
                    &[ta, DType::F32],
                    Tolerance::MATMUL,
                    move |g| {
                        let a = g.leaf(ta, &[k, m])?;
                        let b = g.leaf(DType::F32, &[k, 1])?;
                        let c = g.mul_mat(a, b)?;
                        if soft_max {
                            g.soft_max_ext(c, None, 0.5, 0.0)
                        } else {
                            g.rms_norm(c, 1e-6)
                        }
                    },
                ));
            }
        }
    }
    cases
}

/// Runs `cases` (all of the table where `None`) on a meta device of `parts` against the CPU.
fn conformance(parts: MetaDevice, cases: Option<&[Case]>, what: &str) -> Summary {
    let dev: Arc<dyn Device> = Arc::new(parts.with_input_policy(InputPolicy::MostSplit));
    let start = Instant::now();
    let reference = Reference::Device(cpu());
    let summary = match cases {
        Some(c) => test_cases(c, &dev, &reference, &Options::default(), &mut |_| {}),
        None => test(&dev, &reference, &Options::default(), &mut |_| {}),
    };
    println!("{what}: {summary}");
    println!(
        "{what}: {} cases in {:.1} s",
        summary.results.len(),
        start.elapsed().as_secs_f64(),
    );
    for f in summary.failures() {
        eprintln!("{f}");
    }
    summary
}

#[test]
fn conformance_cases_split_along_k_sum_inside_the_graphs() {
    let cases = matvec_then_norm_cases();
    for ratios in [&[0.7, 0.3][..], &[0.5, 0.3, 0.2][..]] {
        let fleet = Fleet::new(1 << 24);
        let what = format!("mat-vec then norm on {ratios:?}");
        let s = conformance(fleet.meta(ratios), Some(&cases), &what);
        assert_eq!(s.failed(), 0, "{what}: {}", s.totals());
        assert_eq!(s.passed(), cases.len(), "{what}: {}", s.totals());
        // Each case runs once on the meta device: one ALL_REDUCE node per rank.
        assert_eq!(
            fleet.stats.in_graph(),
            cases.len() * ratios.len(),
            "{what}: not every case summed inside the graphs"
        );
        assert_eq!(fleet.stats.between(), 0, "{what}");
    }
}

#[test]
fn every_splittable_conformance_case_matches_the_cpu_with_in_graph_sums() {
    // The whole table, with the parts submitting side by side: the same cases pass (and the
    // same are skipped as unsplittable) as on plain CPU parts.
    let ratios = [0.6, 0.4];
    let fleet = Fleet::new(1 << 24);
    let s = conformance(fleet.meta(&ratios), None, "group parts");
    assert_eq!(s.failed(), 0, "{}", s.totals());
    assert!(s.passed() > 700, "{}", s.totals());
    assert_eq!(fleet.stats.between(), 0);
    let plain = MetaDevice::new(
        ratios.iter().map(|_| cpu()).collect(),
        &SplitRatios::Given(ratios.to_vec()),
    )
    .unwrap();
    let p = conformance(plain, None, "cpu parts");
    let passed = |s: &Summary| -> Vec<String> {
        s.results
            .iter()
            .filter(|r| r.status == Status::Passed)
            .map(|r| r.name.clone())
            .collect()
    };
    assert_eq!(passed(&s), passed(&p));
}
