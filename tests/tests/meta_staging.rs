//! The host all-reduce between parts whose memory the host cannot read: a stand-in device
//! whose buffers hide their host memory and whose stream runs its copies only when it is
//! synchronized (as a GPU's copy engine would, reading and writing the host memory it was
//! handed then), next to a CPU part summed in place. Sizes of one chunk and of several (with an
//! odd tail), f32 and bf16, repeated calls: every part must hold the sum, added in part order.
//! The same over a CPU and a wgpu adapter (lavapipe in CI), whose backend stages through its
//! own mapped readback and upload buffers.

use std::any::Any;
use std::sync::{Arc, Mutex};

mod meta_common;
use meta_common::*;

use half::bf16;
use tessera::meta::{AllReducePath, MetaDevice, MetaOptions, SplitMode, SplitRatios};
use tessera_core::{
    Backend, Buffer, BufferType, Device, DeviceKind, Graph, Memory, ReduceType, Result, TensorId,
};

/// A CPU buffer that does not show its host memory.
struct Hidden(Arc<dyn Buffer>);

impl Buffer for Hidden {
    fn name(&self) -> String {
        format!("hidden {}", self.0.name())
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

struct HiddenType(Arc<dyn BufferType>);

impl BufferType for HiddenType {
    fn name(&self) -> String {
        format!("hidden {}", self.0.name())
    }
    fn alloc(&self, size: usize) -> Result<Arc<dyn Buffer>> {
        Ok(Arc::new(Hidden(self.0.alloc(size)?)))
    }
    fn is_host(&self) -> bool {
        false
    }
}

/// A copy queued on a [`Deferred`] stream: `len` bytes from `src` to `dst`.
struct Copy {
    src: *const u8,
    dst: *mut u8,
    len: usize,
}

// SAFETY: the memory behind the pointers is kept by the caller until the stream is
// synchronized (the trait's rule for async copies).
unsafe impl Send for Copy {}

/// A stream whose async copies run, in order, when it is synchronized.
struct Deferred {
    queue: Vec<Copy>,
    /// Host staging buffers handed out by the device, counted by their first use.
    staged: Arc<Mutex<usize>>,
}

fn memory_of(b: &dyn Buffer, offset: usize) -> *mut u8 {
    let h = b
        .as_any()
        .downcast_ref::<Hidden>()
        .expect("a hidden buffer");
    // SAFETY: the caller checked the range.
    unsafe { h.0.host_ptr().expect("CPU memory").add(offset) }
}

impl Backend for Deferred {
    fn name(&self) -> String {
        "deferred".into()
    }
    fn compute(&mut self, _graph: &Graph, _nodes: &[TensorId]) -> Result<()> {
        Ok(())
    }
    fn synchronize(&mut self) -> Result<()> {
        for c in self.queue.drain(..) {
            // SAFETY: see Copy.
            unsafe { std::ptr::copy(c.src, c.dst, c.len) };
        }
        Ok(())
    }
    fn set_async(&mut self, buffer: &dyn Buffer, offset: usize, data: &[u8]) -> Result<()> {
        buffer.check_range(offset, data.len())?;
        self.queue.push(Copy {
            src: data.as_ptr(),
            dst: memory_of(buffer, offset),
            len: data.len(),
        });
        Ok(())
    }
    fn get_async(&mut self, buffer: &dyn Buffer, offset: usize, out: &mut [u8]) -> Result<()> {
        buffer.check_range(offset, out.len())?;
        *self.staged.lock().unwrap() += 1;
        self.queue.push(Copy {
            src: memory_of(buffer, offset),
            dst: out.as_mut_ptr(),
            len: out.len(),
        });
        Ok(())
    }
}

/// A device of hidden CPU buffers and deferred streams, with a host buffer type (CPU memory)
/// for staging.
struct Remote {
    inner: Arc<dyn Device>,
    staged: Arc<Mutex<usize>>,
}

impl Device for Remote {
    fn name(&self) -> String {
        "remote".into()
    }
    fn description(&self) -> String {
        "a CPU behind deferred copies".into()
    }
    fn kind(&self) -> DeviceKind {
        DeviceKind::Gpu
    }
    fn memory(&self) -> Memory {
        self.inner.memory()
    }
    fn buffer_type(&self) -> Arc<dyn BufferType> {
        Arc::new(HiddenType(self.inner.buffer_type()))
    }
    fn host_buffer_type(&self) -> Option<Arc<dyn BufferType>> {
        Some(self.inner.buffer_type())
    }
    fn new_backend(&self) -> Result<Box<dyn Backend>> {
        Ok(Box::new(Deferred {
            queue: Vec::new(),
            staged: self.staged.clone(),
        }))
    }
    fn supports_op(&self, _graph: &Graph, _id: TensorId) -> bool {
        false
    }
    fn can_use_buffer(&self, buffer: &dyn Buffer) -> bool {
        buffer.as_any().is::<Hidden>()
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

#[test]
fn host_all_reduce_through_deferred_copies_leaves_the_sum_in_every_part() {
    let staged = Arc::new(Mutex::new(0));
    let remote = || -> Arc<dyn Device> {
        Arc::new(Remote {
            inner: cpu(),
            staged: staged.clone(),
        })
    };
    let parts = vec![cpu(), remote(), remote()];
    let options = MetaOptions::default()
        .with_all_reduce(AllReducePath::Host)
        .with_split_mode(SplitMode::Tensor);
    let meta = MetaDevice::with_options(
        parts.clone(),
        &SplitRatios::Given(vec![0.4, 0.3, 0.3]),
        options,
    )
    .unwrap();
    let mut backend = meta.meta_backend().unwrap();
    assert_eq!(backend.all_reduce_path(), "host");
    // One chunk; several chunks of a large tensor with a tail; a bf16 count that is odd.
    for (count, dtype) in [
        (5, ReduceType::F32),
        (4096, ReduceType::F32),
        (3 << 18 | 3, ReduceType::F32),
        (5 << 19 | 1, ReduceType::BF16),
    ] {
        let esize = if dtype == ReduceType::BF16 { 2 } else { 4 };
        // At an offset, so that the tensor does not start at byte 0 of its buffer.
        let base = 256;
        let bufs: Vec<(Arc<dyn Buffer>, usize)> = parts
            .iter()
            .map(|p| (p.buffer_type().alloc(base + count * esize).unwrap(), base))
            .collect();
        for round in 0..2u32 {
            let inputs: Vec<Vec<f32>> = (0..3u32)
                .map(|j| values(count, 7 + j + 10 * round + count as u32))
                .collect();
            let want = ordered_sum(&inputs, dtype);
            for ((b, off), x) in bufs.iter().zip(&inputs) {
                b.set(*off, &encoded(x, dtype)).unwrap();
            }
            backend.all_reduce(&bufs, count, dtype).unwrap();
            Backend::synchronize(&mut backend).unwrap();
            for (j, (b, off)) in bufs.iter().enumerate() {
                let mut got = vec![0u8; count * esize];
                b.get(*off, &mut got).unwrap();
                assert!(
                    got == want,
                    "part {j}, {count} values of {dtype:?}, round {round}: not the sum"
                );
            }
        }
    }
    assert!(
        *staged.lock().unwrap() > 0,
        "the remote parts staged nothing"
    );
}

/// Two parts handed the same host memory are refused, not summed through aliased slices.
#[test]
fn overlapping_host_memory_is_an_error() {
    let options = MetaOptions::default()
        .with_all_reduce(AllReducePath::Host)
        .with_split_mode(SplitMode::Tensor);
    let meta = MetaDevice::with_options(
        vec![cpu(), cpu()],
        &SplitRatios::Given(vec![0.5, 0.5]),
        options,
    )
    .unwrap();
    let mut backend = meta.meta_backend().unwrap();
    let buf = cpu().buffer_type().alloc(4096).unwrap();
    let e = backend
        .all_reduce(&[(buf.clone(), 0), (buf, 64)], 256, ReduceType::F32)
        .unwrap_err()
        .to_string();
    assert!(e.contains("overlapping"), "{e}");
}

/// `x` as the bytes of a tensor of `dtype` (bf16: each value rounded).
fn encoded(x: &[f32], dtype: ReduceType) -> Vec<u8> {
    match dtype {
        ReduceType::F32 => x.iter().flat_map(|v| v.to_le_bytes()).collect(),
        ReduceType::BF16 => x
            .iter()
            .flat_map(|&v| bf16::from_f32(v).to_le_bytes())
            .collect(),
    }
}

/// The sum of `inputs` in part order, as the host all-reduce adds them: f32, or bf16 rounded
/// after every addition.
fn ordered_sum(inputs: &[Vec<f32>], dtype: ReduceType) -> Vec<u8> {
    let count = inputs[0].len();
    match dtype {
        ReduceType::F32 => (0..count)
            .flat_map(|i| {
                let mut s = inputs[0][i];
                for x in &inputs[1..] {
                    s += x[i];
                }
                s.to_le_bytes()
            })
            .collect(),
        ReduceType::BF16 => (0..count)
            .flat_map(|i| {
                let mut s = bf16::from_f32(inputs[0][i]);
                for x in &inputs[1..] {
                    s = bf16::from_f32(s.to_f32() + bf16::from_f32(x[i]).to_f32());
                }
                s.to_le_bytes()
            })
            .collect(),
    }
}

/// A CPU and a wgpu adapter (lavapipe in CI), in both orders: the host all-reduce through the
/// adapter's mapped staging leaves exactly the ordered CPU sum in both parts, for one value,
/// 16 KiB, an odd count, several MiB (several chunks and a tail) and an odd bf16 count (partial
/// words, through the backend's own reads and writes), each twice in a row with new values in
/// the same buffers (stale staging would show). Skipped, saying so, without a wgpu:0 device.
#[test]
fn host_all_reduce_over_cpu_and_wgpu_is_the_ordered_sum() {
    let Ok(gpu) = tessera::registry().find("wgpu:0") else {
        println!("skipped: no wgpu:0 device (build with the wgpu feature)");
        return;
    };
    for parts in [vec![cpu(), gpu.clone()], vec![gpu.clone(), cpu()]] {
        let names: Vec<String> = parts.iter().map(|p| p.name()).collect();
        let options = MetaOptions::default()
            .with_all_reduce(AllReducePath::Host)
            .with_split_mode(SplitMode::Tensor);
        let meta =
            MetaDevice::with_options(parts.clone(), &SplitRatios::Given(vec![0.5, 0.5]), options)
                .unwrap();
        let mut backend = meta.meta_backend().unwrap();
        for (count, dtype) in [
            (1, ReduceType::F32),
            (4096, ReduceType::F32),
            (12_345, ReduceType::F32),
            ((5 << 18) + 7, ReduceType::F32),
            (2_049, ReduceType::BF16),
        ] {
            let esize = if dtype == ReduceType::BF16 { 2 } else { 4 };
            let base = 256;
            let bufs: Vec<(Arc<dyn Buffer>, usize)> = parts
                .iter()
                .map(|p| {
                    (
                        p.buffer_type().alloc(base + count * esize + 64).unwrap(),
                        base,
                    )
                })
                .collect();
            for round in 0..2u32 {
                let inputs: Vec<Vec<f32>> = (0..2u32)
                    .map(|j| values(count, 31 + j + 10 * round + count as u32))
                    .collect();
                let want = ordered_sum(&inputs, dtype);
                for ((b, off), x) in bufs.iter().zip(&inputs) {
                    b.set(*off, &encoded(x, dtype)).unwrap();
                }
                backend.all_reduce(&bufs, count, dtype).unwrap();
                Backend::synchronize(&mut backend).unwrap();
                for (j, (b, off)) in bufs.iter().enumerate() {
                    let mut got = vec![0u8; count * esize];
                    b.get(*off, &mut got).unwrap();
                    let bad = (0..count).find(|&i| {
                        got[i * esize..(i + 1) * esize] != want[i * esize..(i + 1) * esize]
                    });
                    assert!(
                        bad.is_none(),
                        "{names:?} part {j}, {count} values of {dtype:?}, round {round}: element {bad:?} is not the ordered sum"
                    );
                }
            }
        }
    }
}
