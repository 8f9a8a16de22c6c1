//! The scheduler's own logic, with a mock "device" whose memory the CPU cannot use and which
//! lacks some ops: placement by weights, CPU fallback, cross-device copies, and results equal to
//! running everything on the CPU.

use std::any::Any;
use std::sync::Arc;

use tessera::cpu::{CpuBuffer, CpuDevice};
use tessera_core::backend::{Backend, Buffer, BufferType, Device, DeviceKind, Memory};
use tessera_core::{DType, Graph, Op, Result, Scheduler, TensorId};

/// Memory of the mock device: host memory underneath, but not offered to the CPU as such.
struct MockBuffer(Arc<CpuBuffer>);

impl Buffer for MockBuffer {
    fn name(&self) -> String {
        "mock".into()
    }
    fn size(&self) -> usize {
        self.0.size()
    }
    fn set(&self, offset: usize, data: &[u8]) -> Result<()> {
        self.0.set(offset, data)
    }
    fn get(&self, offset: usize, out: &mut [u8]) -> Result<()> {
        self.0.get(offset, out)
    }
    fn clear(&self, value: u8) -> Result<()> {
        self.0.clear(value)
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// The mock device's memory; allocations above `limit` fail.
struct MockType {
    limit: usize,
}

impl BufferType for MockType {
    fn name(&self) -> String {
        "mock".into()
    }
    fn alloc(&self, size: usize) -> Result<Arc<dyn Buffer>> {
        if size > self.limit {
            return Err(tessera_core::Error::OutOfMemory {
                device: "mock:0".into(),
                bytes: size,
            });
        }
        Ok(Arc::new(MockBuffer(Arc::new(CpuBuffer::new(size)?))))
    }
    fn is_host(&self) -> bool {
        false
    }
}

/// A device that runs everything but SOFT_MAX, on its own memory only (at most `limit` bytes
/// a buffer).
struct MockDevice {
    cpu: CpuDevice,
    limit: usize,
}

impl Device for MockDevice {
    fn name(&self) -> String {
        "mock:0".into()
    }
    fn description(&self) -> String {
        "mock GPU".into()
    }
    fn kind(&self) -> DeviceKind {
        DeviceKind::Gpu
    }
    fn memory(&self) -> Memory {
        Memory::default()
    }
    fn buffer_type(&self) -> Arc<dyn BufferType> {
        Arc::new(MockType { limit: self.limit })
    }
    fn new_backend(&self) -> Result<Box<dyn Backend>> {
        Ok(Box::new(MockBackend {
            inner: self.cpu.new_backend()?,
        }))
    }
    fn supports_op(&self, graph: &Graph, id: TensorId) -> bool {
        !matches!(graph.get(id).op, Op::SoftMax { .. }) && self.cpu.supports_op(graph, id)
    }
    fn can_use_buffer(&self, buffer: &dyn Buffer) -> bool {
        buffer.as_any().is::<MockBuffer>()
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

struct MockBackend {
    inner: Box<dyn Backend>,
}

impl Backend for MockBackend {
    fn name(&self) -> String {
        "mock:0".into()
    }
    fn compute(&mut self, graph: &Graph, nodes: &[TensorId]) -> Result<()> {
        // Run on the CPU over the host memory underneath, refusing anything outside our memory.
        let mut g = graph.clone();
        for id in graph.ids() {
            if let Some(d) = graph.get(id).data.clone() {
                let mock = d.buffer.as_any().downcast_ref::<MockBuffer>();
                if let Some(m) = mock {
                    g.get_mut(id).data = None;
                    g.bind(id, m.0.clone(), d.offset)?;
                } else if nodes
                    .iter()
                    .any(|&n| graph.get(n).src.iter().any(|&s| graph.root(s).0 == id))
                {
                    panic!(
                        "the scheduler gave the mock device a tensor in memory it cannot use: {}",
                        graph.label(id)
                    );
                }
            }
        }
        self.inner.compute(&g, nodes)
    }
    fn synchronize(&mut self) -> Result<()> {
        self.inner.synchronize()
    }
}

fn f32s(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// y = softmax(W x + b): W on the mock device, b on the CPU.
fn build(w_buf: Arc<dyn Buffer>, b_buf: Arc<dyn Buffer>) -> (Graph, TensorId, TensorId) {
    let mut g = Graph::new();
    let w = g.weight("w", DType::F32, &[16, 8], w_buf, 0).unwrap();
    let b = g.weight("b", DType::F32, &[8], b_buf, 0).unwrap();
    let x = g.input("x", DType::F32, &[16, 3]).unwrap();
    let h = g.mul_mat(w, x).unwrap();
    let h = g.add(h, b).unwrap();
    let y = g.soft_max_ext(h, None, 1.0, 0.0).unwrap();
    let y = g.scale(y, 2.0).unwrap();
    g.set_output(y);
    (g, x, y)
}

fn run(
    devices: Vec<Arc<dyn Device>>,
    w_dev: &dyn Device,
    b_dev: &dyn Device,
) -> (Vec<f32>, usize, usize) {
    let w: Vec<f32> = (0..128)
        .map(|i| ((i * 37 % 29) as f32 - 14.0) / 10.0)
        .collect();
    let b: Vec<f32> = (0..8).map(|i| i as f32 / 7.0 - 0.5).collect();
    let x: Vec<f32> = (0..48)
        .map(|i| ((i * 11 % 13) as f32 - 6.0) / 5.0)
        .collect();
    let wb = w_dev.buffer_type().alloc(512).unwrap();
    wb.set(0, &f32s(&w)).unwrap();
    let bb = b_dev.buffer_type().alloc(32).unwrap();
    bb.set(0, &f32s(&b)).unwrap();
    let (mut g, xi, y) = build(wb, bb);
    let mut sched = Scheduler::new(devices).unwrap();
    let plan = sched.plan(&mut g).unwrap();
    let xd = g.data_or_err(xi).unwrap();
    xd.buffer.set(xd.offset, &f32s(&x)).unwrap();
    sched.compute(&g, &plan).unwrap();
    let yd = g.data_or_err(y).unwrap();
    let mut out = vec![0u8; 8 * 3 * 4];
    yd.buffer.get(yd.offset, &mut out).unwrap();
    // The same step again with the result read by its device's stream before the wait.
    let mut read = vec![0u8; out.len()];
    sched.compute_read(&g, &plan, y, &mut read).unwrap();
    assert_eq!(read, out, "compute_read gives what compute and a read give");
    let err = sched.compute_read(&g, &plan, y, &mut [0u8; 4]).unwrap_err();
    assert!(err.to_string().contains("into 4 bytes"), "{err}");
    let copies = plan.splits.iter().map(|s| s.copies.len()).sum();
    (
        out.chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect(),
        plan.splits.len(),
        copies,
    )
}

#[test]
fn weights_decide_placement_and_copies_cross_devices() {
    let cpu: Arc<dyn Device> = Arc::new(CpuDevice::new());
    let mock: Arc<dyn Device> = Arc::new(MockDevice {
        cpu: CpuDevice::new(),
        limit: usize::MAX,
    });
    let (want, splits, copies) = run(vec![cpu.clone()], cpu.as_ref(), cpu.as_ref());
    assert_eq!((splits, copies), (1, 0));
    // W on the mock device pulls mul_mat there (the input x is allocated there too); add reads
    // b from CPU memory, so it runs on the CPU and W x is copied out; soft_max, which the mock
    // lacks, stays there; scale returns to the preferred mock device.
    let (got, splits, copies) = run(vec![mock.clone(), cpu.clone()], mock.as_ref(), cpu.as_ref());
    assert_eq!(
        splits, 3,
        "mock (mul_mat), cpu (add, soft_max), mock (scale)"
    );
    assert_eq!(copies, 2, "W x to the CPU, the softmax back");
    assert_eq!(got, want, "the split run equals the CPU run bit for bit");
    let s: f32 = got[..8].iter().sum();
    assert!((s - 2.0).abs() < 1e-5, "each row is 2 x softmax: {s}");
}

#[test]
fn an_op_the_device_lacks_falls_back_to_the_cpu() {
    // Everything on the mock device's memory, so only soft_max (which it lacks) leaves it.
    let cpu: Arc<dyn Device> = Arc::new(CpuDevice::new());
    let mock: Arc<dyn Device> = Arc::new(MockDevice {
        cpu: CpuDevice::new(),
        limit: usize::MAX,
    });
    let (want, _, _) = run(vec![cpu.clone()], cpu.as_ref(), cpu.as_ref());
    let (got, splits, copies) = run(
        vec![mock.clone(), cpu.clone()],
        mock.as_ref(),
        mock.as_ref(),
    );
    assert_eq!(
        splits, 3,
        "mock (mul_mat, add), cpu (soft_max), mock (scale)"
    );
    assert_eq!(copies, 2, "h to the CPU, softmax back to the mock device");
    assert_eq!(got, want);
}

#[test]
fn an_op_no_device_can_run_where_its_memory_is_is_an_error() {
    // soft_max reads memory only the mock device can use, and only the mock device is given.
    let mock: Arc<dyn Device> = Arc::new(MockDevice {
        cpu: CpuDevice::new(),
        limit: usize::MAX,
    });
    let wb = mock.buffer_type().alloc(512).unwrap();
    let bb = mock.buffer_type().alloc(32).unwrap();
    let (mut g, _, _) = build(wb, bb);
    let mut sched = Scheduler::new(vec![mock]).unwrap();
    let err = sched.plan(&mut g).unwrap_err().to_string();
    assert!(err.contains("SOFT_MAX"), "{err}");
}

/// Two "layers" over two CPU devices, both of which can use the host memory the weights are in:
/// the hints decide every node, weight readers included, so each layer runs whole on its
/// device (two splits, the activation copied once between them), and a queued run followed by
/// a waited one gives the single CPU's result.
#[test]
fn hints_place_layers_whose_weights_several_devices_can_read() {
    let cpu = || Arc::new(CpuDevice::new()) as Arc<dyn Device>;
    let w: Vec<f32> = (0..256)
        .map(|i| ((i * 29 % 31) as f32 - 15.0) / 9.0)
        .collect();
    let x: Vec<f32> = (0..32).map(|i| ((i * 7 % 11) as f32 - 5.0) / 4.0).collect();
    let wb = cpu().buffer_type().alloc(1024).unwrap();
    wb.set(0, &f32s(&w)).unwrap();
    let graph = || {
        let mut g = Graph::new();
        let w1 = g.weight("w1", DType::F32, &[16, 8], wb.clone(), 0).unwrap();
        let w2 = g
            .weight("w2", DType::F32, &[8, 16], wb.clone(), 512)
            .unwrap();
        let xi = g.input("x", DType::F32, &[16, 2]).unwrap();
        let n = g.rms_norm(xi, 1e-6).unwrap();
        let h = g.mul_mat(w1, n).unwrap();
        let layer1_end = g.len();
        let h = g.rms_norm(h, 1e-6).unwrap();
        let y = g.mul_mat(w2, h).unwrap();
        g.set_output(y);
        (g, xi, y, layer1_end)
    };
    let out = |sched: &mut Scheduler, hinted: bool| {
        let (mut g, xi, y, end) = graph();
        let hint: Vec<Option<usize>> = (0..g.len()).map(|i| Some(usize::from(i >= end))).collect();
        let plan = if hinted {
            sched.plan_hinted(&mut g, &hint).unwrap()
        } else {
            sched.plan(&mut g).unwrap()
        };
        let xd = g.data_or_err(xi).unwrap();
        xd.buffer.set(xd.offset, &f32s(&x)).unwrap();
        sched.compute_queued(&g, &plan).unwrap();
        let mut first = vec![0u8; 128];
        let mut second = vec![0u8; 128];
        sched.synchronize().unwrap();
        let yd = g.data_or_err(y).unwrap();
        yd.buffer.get(yd.offset, &mut first).unwrap();
        sched.compute_read(&g, &plan, y, &mut second).unwrap();
        assert_eq!(first, second);
        let devices: Vec<usize> = plan.splits.iter().map(|s| s.device).collect();
        let copies: usize = plan.splits.iter().map(|s| s.copies.len()).sum();
        (first, devices, copies)
    };
    let (want, devices, _) = out(&mut Scheduler::new(vec![cpu()]).unwrap(), false);
    assert_eq!(devices, vec![0]);
    let mut two = Scheduler::new(vec![cpu(), cpu()]).unwrap();
    // Without hints the first device that can use the weights' memory takes everything.
    let (got, devices, _) = out(&mut two, false);
    assert_eq!((devices, &got), (vec![0], &want));
    let (got, devices, copies) = out(&mut two, true);
    assert_eq!(devices, vec![0, 1], "one split per layer");
    assert_eq!(copies, 1, "the activation crosses once, at the boundary");
    assert_eq!(got, want, "the split run equals the CPU run bit for bit");
}

/// Random values in [-1, 1) from a fixed seed.
fn random(n: usize, seed: u64) -> Vec<f32> {
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    (0..n).map(|_| rng.gen_range(-1.0..1.0)).collect()
}

/// One "layer" on the CPU part of a layer split, its weights in host memory: h = W1 norm(x),
/// g = silu(h) + b (b a host weight too), y = W2 g. Returns the graph, its input and result.
fn cpu_layer(w: &Arc<dyn Buffer>, batch: usize) -> (Graph, TensorId, TensorId) {
    let mut g = Graph::new();
    let w1 = g.weight("w1", DType::F32, &[64, 48], w.clone(), 0).unwrap();
    let b = g
        .weight("b", DType::F32, &[48], w.clone(), 64 * 48 * 4)
        .unwrap();
    let w2 = g
        .weight("w2", DType::F32, &[48, 64], w.clone(), 65 * 48 * 4)
        .unwrap();
    let x = g.input("x", DType::F32, &[64, batch]).unwrap();
    let n = g.rms_norm(x, 1e-6).unwrap();
    let h = g.mul_mat(w1, n).unwrap();
    let h = g.unary(h, tessera_core::UnaryOp::Silu).unwrap();
    let h = g.add(h, b).unwrap();
    let y = g.mul_mat(w2, h).unwrap();
    g.set_output(y);
    (g, x, y)
}

/// Plans and runs [`cpu_layer`] for `batch` tokens on `sched` with every node hinted to its
/// last device (the CPU part); returns the result, the plan and the graph.
fn run_layer(
    sched: &mut Scheduler,
    w: &Arc<dyn Buffer>,
    batch: usize,
) -> (Vec<f32>, tessera_core::SchedPlan, Graph) {
    let (mut g, x, y) = cpu_layer(w, batch);
    let cpu = sched.devices().len() - 1;
    let hint = vec![Some(cpu); g.len()];
    let plan = sched.plan_hinted(&mut g, &hint).unwrap();
    let xd = g.data_or_err(x).unwrap();
    xd.buffer
        .set(xd.offset, &f32s(&random(64 * batch, batch as u64)))
        .unwrap();
    let mut out = vec![0u8; 64 * batch * 4];
    sched.compute_read(&g, &plan, y, &mut out).unwrap();
    let out = out
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    (out, plan, g)
}

/// The scratch buffers a plan's uploaded weights are bound to, in upload order.
fn scratch_of(plan: &tessera_core::SchedPlan, g: &Graph, mock: usize) -> Vec<Arc<dyn Buffer>> {
    plan.splits
        .iter()
        .filter(|s| s.device == mock)
        .flat_map(|s| &s.copies)
        .filter(|(src, _)| g.get(*src).flags.weight)
        .map(|&(_, c)| g.data_or_err(c).unwrap().buffer)
        .collect()
}

/// Op offload: with a batch of at least the minimum, the mat-muls whose weights are in host
/// memory run on the GPU-like device, the silu after the first follows them, the add of a host
/// bias stays on the CPU; the uploads go into two scratch regions kept from plan to plan, and
/// the counters say what moved. A smaller batch (a decode step), or offload off, plans all of it
/// on the CPU. The results equal the CPU's bit for bit (the mock computes with the CPU's
/// kernels).
#[test]
fn op_offload_runs_a_large_batchs_host_weight_mat_muls_on_the_gpu() {
    let cpu: Arc<dyn Device> = Arc::new(CpuDevice::new());
    let mock: Arc<dyn Device> = Arc::new(MockDevice {
        cpu: CpuDevice::new(),
        limit: usize::MAX,
    });
    let w = cpu.buffer_type().alloc((65 * 48 + 48 * 64) * 4).unwrap();
    w.set(0, &f32s(&random(65 * 48 + 48 * 64, 7))).unwrap();
    let w_bytes = 2 * 64 * 48 * 4;
    let mut alone = Scheduler::new(vec![cpu.clone()]).unwrap();
    let mut sched = Scheduler::new(vec![mock.clone(), cpu.clone()]).unwrap();
    sched.set_op_offload(8);
    for batch in [8, 3] {
        let (want, _, _) = run_layer(&mut alone, &w, batch);
        let before = sched.offload_stats();
        let (got, plan, g) = run_layer(&mut sched, &w, batch);
        assert_eq!(
            got, want,
            "batch {batch}: the offloaded run equals the CPU's"
        );
        let devices: Vec<usize> = plan.splits.iter().map(|s| s.device).collect();
        let after = sched.offload_stats();
        if batch < 8 {
            assert_eq!(devices, vec![1], "batch {batch}: everything on the CPU");
            assert_eq!(plan.offload, Default::default());
            assert_eq!(after, before, "a small batch offloads nothing");
            continue;
        }
        assert_eq!(
            devices,
            vec![1, 0, 1, 0],
            "cpu (norm), mock (W1, silu), cpu (+ b), mock (W2)"
        );
        assert_eq!((plan.offload.ops, plan.offload.bytes), (2, w_bytes as u64));
        assert_eq!(after.ops - before.ops, 2);
        assert_eq!(after.bytes - before.bytes, w_bytes as u64);
        // Two splits, two regions; a second plan (another graph of the same batch) and its
        // run upload into the same two.
        let first = scratch_of(&plan, &g, 0);
        assert_eq!(first.len(), 2);
        assert!(!Arc::ptr_eq(&first[0], &first[1]), "the splits alternate");
        let (again, plan2, g2) = run_layer(&mut sched, &w, batch);
        assert_eq!(again, want);
        let second = scratch_of(&plan2, &g2, 0);
        assert!(first.iter().zip(&second).all(|(a, b)| Arc::ptr_eq(a, b)));
        assert_eq!(sched.offload_stats().ops - after.ops, 2);
    }
    // Off: the large batch stays on the CPU.
    sched.set_op_offload(0);
    let (_, plan, _) = run_layer(&mut sched, &w, 8);
    assert_eq!(plan.splits.len(), 1);
    assert_eq!(plan.splits[0].device, 1);
}

/// A GPU-like device without room for op offload, for its scratch (1 KiB) or for the
/// activations it would receive once the scratch fits (12 KiB: one weight): the graph is
/// planned without op offload (a log line says so), and it runs on the CPU with the CPU's
/// result.
#[test]
fn op_offload_without_room_on_the_gpu_computes_on_the_cpu() {
    let cpu: Arc<dyn Device> = Arc::new(CpuDevice::new());
    let w = cpu.buffer_type().alloc((65 * 48 + 48 * 64) * 4).unwrap();
    w.set(0, &f32s(&random(65 * 48 + 48 * 64, 11))).unwrap();
    let (want, _, _) = run_layer(&mut Scheduler::new(vec![cpu.clone()]).unwrap(), &w, 16);
    for limit in [1024, 64 * 48 * 4] {
        let mock: Arc<dyn Device> = Arc::new(MockDevice {
            cpu: CpuDevice::new(),
            limit,
        });
        let mut sched = Scheduler::new(vec![mock, cpu.clone()]).unwrap();
        sched.set_op_offload(8);
        let (got, plan, _) = run_layer(&mut sched, &w, 16);
        assert_eq!(got, want, "limit {limit}");
        assert_eq!(plan.splits.len(), 1, "limit {limit}");
        assert_eq!(plan.splits[0].device, 1);
        assert_eq!(sched.offload_stats(), Default::default());
    }
}
