//! The wgpu backend's host staging ([`tessera_core::staging`]): a readback buffer (MAP_READ)
//! that a read copies into and the host reads while it is mapped, and an upload buffer
//! (MAP_WRITE) that the host writes while it is mapped and a write copies out of. Both are kept
//! by the caller between transfers, so a round trip allocates nothing and copies nothing on
//! the host beyond what the caller reads and writes in the mappings.
//!
//! WebGPU maps a buffer only while no submitted command uses it, so each buffer cycles: the
//! readback buffer is copied into, mapped (after that copy), read, and unmapped before the
//! next copy into it; the upload buffer is mapped (asked for with the submit that carries the
//! copy out of it, granted once that copy has run), written, unmapped, and copied out of. The
//! copy out waits for the backend's next submit (a round trip then costs the read's submit
//! alone), and a wait for a read finds the upload buffer mapped: its copy went with an earlier
//! submit.
//!
//! A range that is not whole 4-byte words (wgpu copies only those) goes through
//! [`HostStaging`] instead: the backend's own reads and writes, which merge partial words.
//!
//! [`measure_floor`] times the same steps bare, without the staging's bookkeeping: what wgpu
//! itself costs per round trip.

use std::any::Any;
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tessera_core::staging::{check_capacity, staged_too_short, HostStaging, StagedView, Staging};
use tessera_core::Result;

use crate::buffer::WgpuBuffer;
use crate::context::Gpu;

/// The outcome of a `map_async`, sent by its callback during a poll.
type MapOutcome = Receiver<std::result::Result<(), wgpu::BufferAsyncError>>;

/// A wgpu backend's staging (see the module docs).
pub(crate) struct WgpuStaging {
    gpu: Arc<Gpu>,
    /// Bytes each buffer holds (a multiple of 4).
    cap: u64,
    readback: wgpu::Buffer,
    upload: wgpu::Buffer,
    /// The read in flight: its bytes, its submission, and its mapping.
    reading: Option<(u64, wgpu::SubmissionIndex, MapOutcome)>,
    /// The readback buffer's mapping while the host holds it, and its bytes.
    read_view: Option<(wgpu::BufferView, usize)>,
    /// The upload buffer's mapping, asked for and not yet seen granted.
    upload_asked: Option<MapOutcome>,
    /// The upload buffer's mapping while the host holds it.
    write_view: Option<wgpu::BufferViewMut>,
    /// Whether the last read went through `host` (a range of partial words).
    via_host: bool,
    host: HostStaging,
    /// Whether waits poll the device in a loop rather than block in the driver
    /// ([`crate::WgpuOptions::spin_wait`]).
    spin: bool,
}

impl WgpuStaging {
    /// Staging of `bytes` bytes (at least 4) on `gpu`.
    pub(crate) fn new(gpu: &Arc<Gpu>, bytes: usize) -> Result<WgpuStaging> {
        let cap = (bytes.max(4) as u64).div_ceil(4) * 4;
        let readback = gpu.new_buffer(
            "tessera readback",
            cap,
            wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
        )?;
        let upload = gpu.new_buffer(
            "tessera upload",
            cap,
            wgpu::BufferUsages::MAP_WRITE | wgpu::BufferUsages::COPY_SRC,
        )?;
        let upload_asked = Some(ask_map(&upload, wgpu::MapMode::Write, cap));
        Ok(WgpuStaging {
            gpu: gpu.clone(),
            cap,
            readback,
            upload,
            reading: None,
            read_view: None,
            upload_asked,
            write_view: None,
            via_host: false,
            host: HostStaging::new(bytes),
            spin: gpu.options.spin_wait,
        })
    }

    /// Whether the staging was made on `gpu`.
    pub(crate) fn on(&self, gpu: &Arc<Gpu>) -> bool {
        Arc::ptr_eq(&self.gpu, gpu)
    }

    /// Whether a transfer of `len` bytes at `offset` is whole words, as wgpu copies.
    pub(crate) fn words(offset: usize, len: usize) -> bool {
        (offset | len) & 3 == 0
    }

    /// The staging of unaligned ranges.
    pub(crate) fn host(&mut self) -> &mut HostStaging {
        &mut self.host
    }

    /// Notes that the last read went through [`WgpuStaging::host`] or not.
    pub(crate) fn set_via_host(&mut self, on: bool) {
        self.via_host = on;
    }

    /// Whether the last read went through [`WgpuStaging::host`].
    pub(crate) fn via_host(&self) -> bool {
        self.via_host
    }

    /// Lets go of the readback mapping, so that the buffer can be copied into again.
    fn release_read(&mut self) {
        if self.read_view.take().is_some() {
            self.readback.unmap();
        }
    }

    /// Starts reading `len` bytes (whole words, at most the capacity) of `src` from `offset`:
    /// the copy is recorded after the commands in `enc` (the backend's pending writes), which
    /// is submitted, and the readback buffer's mapping is asked for.
    pub(crate) fn start_read(
        &mut self,
        src: &WgpuBuffer,
        offset: usize,
        len: usize,
        mut enc: wgpu::CommandEncoder,
    ) -> Result<()> {
        check_capacity(self, len)?;
        self.release_read();
        if self.reading.is_some() {
            return Err(self
                .gpu
                .err("a staged read started before the last one was waited for"));
        }
        let size = len as u64;
        if size > 0 {
            enc.copy_buffer_to_buffer(&src.buffer, offset as u64, &self.readback, 0, size);
        }
        let index = self.gpu.queue.submit([enc.finish()]);
        let mapped = ask_map(&self.readback, wgpu::MapMode::Read, size);
        self.reading = Some((size, index, mapped));
        self.via_host = false;
        self.gpu.check()
    }

    /// Waits for the read in flight and maps the bytes read and the upload buffer.
    pub(crate) fn view(&mut self) -> Result<StagedView<'_>> {
        let Some((size, index, mapped)) = self.reading.take() else {
            return Err(self.gpu.err("a staged view without a read"));
        };
        if size > 0 {
            wait_mapped(&self.gpu, &mapped, Some(index), self.spin, "readback")?;
            let view = self
                .readback
                .get_mapped_range(..size)
                .map_err(|e| self.gpu.err(format!("mapping the readback buffer: {e}")))?;
            self.read_view = Some((view, size as usize));
        } else {
            // Nothing was mapped: an empty read has no range to map.
            self.read_view = None;
        }
        if let Some(asked) = self.upload_asked.take() {
            wait_mapped(&self.gpu, &asked, None, self.spin, "upload")?;
            let view = self
                .upload
                .get_mapped_range_mut(..)
                .map_err(|e| self.gpu.err(format!("mapping the upload buffer: {e}")))?;
            self.write_view = Some(view);
        }
        let write = match self.write_view.as_mut() {
            Some(w) => {
                let mut w = w.slice(..size as usize);
                let ptr = w.as_raw_ptr();
                // SAFETY: the upload buffer is mapped for writing and stays mapped (its view is
                // held in `self`) while the returned slice borrows `self`; the slice covers
                // `size` bytes of the `cap`-byte mapping, and the caller only writes it
                // (StagedView::Split's rule), as mapped, possibly write-combined memory asks.
                unsafe { std::slice::from_raw_parts_mut(ptr.as_ptr().cast::<u8>(), size as usize) }
            }
            None => return Err(self.gpu.err("the upload buffer is not mapped")),
        };
        let read: &[u8] = match &self.read_view {
            Some((v, n)) => &v[..*n],
            None => &[],
        };
        Ok(StagedView::Split { read, write })
    }

    /// Hands over the first `len` bytes of the upload mapping (whole words) for writing into
    /// `dst` at `offset`: both mappings are let go, and the copy is returned for the backend's
    /// next submit, which asks for the upload buffer's next mapping with it (granted once the
    /// copy has run).
    pub(crate) fn start_write(
        &mut self,
        dst: &WgpuBuffer,
        offset: usize,
        len: usize,
    ) -> Result<StagedCopy> {
        let read = self.read_view.as_ref().map_or(0, |(_, n)| *n);
        if len > read {
            return Err(staged_too_short(len, read));
        }
        if self.write_view.take().is_none() {
            return Err(self.gpu.err("a staged write without a view"));
        }
        self.release_read();
        self.upload.unmap();
        let (tx, rx) = channel();
        self.upload_asked = Some(rx);
        Ok(StagedCopy {
            src: self.upload.clone(),
            cap: self.cap,
            dst: dst.buffer.clone(),
            offset: offset as u64,
            len: len as u64,
            mapped: tx,
        })
    }
}

/// A staged write's copy, waiting for its backend's next submit.
pub(crate) struct StagedCopy {
    /// The staging's upload buffer, of `cap` bytes.
    src: wgpu::Buffer,
    cap: u64,
    dst: wgpu::Buffer,
    offset: u64,
    len: u64,
    /// Where the upload buffer's next mapping is told.
    mapped: Sender<std::result::Result<(), wgpu::BufferAsyncError>>,
}

impl StagedCopy {
    /// Records the copy into `enc`, and asks for the upload buffer to be mapped for writing
    /// once `enc` has been submitted (the mapping is granted after the copy has run).
    pub(crate) fn record(self, enc: &mut wgpu::CommandEncoder) {
        if self.len > 0 {
            enc.copy_buffer_to_buffer(&self.src, 0, &self.dst, self.offset, self.len);
        }
        let tx = self.mapped;
        enc.map_buffer_on_submit(&self.src, wgpu::MapMode::Write, ..self.cap, move |r| {
            let _ = tx.send(r);
        });
    }
}

impl Staging for WgpuStaging {
    fn capacity(&self) -> usize {
        self.host.capacity().min(self.cap as usize)
    }

    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }
}

/// Asks for `size` bytes of `buffer` to be mapped; the outcome arrives during a poll.
fn ask_map(buffer: &wgpu::Buffer, mode: wgpu::MapMode, size: u64) -> MapOutcome {
    let (tx, rx) = channel();
    buffer.map_async(mode, ..size, move |r| {
        let _ = tx.send(r);
    });
    rx
}

/// Polls `gpu` until a mapping's outcome has arrived: blocking until `index` (or all work) is
/// done, or with `spin`, polling without blocking in a loop (no sleep and wake-up in the
/// driver, at the cost of a busy thread). An outcome that did not arrive after all work is
/// done, or a failed mapping, is an error naming `what`.
fn wait_mapped(
    gpu: &Gpu,
    mapped: &MapOutcome,
    index: Option<wgpu::SubmissionIndex>,
    spin: bool,
    what: &str,
) -> Result<()> {
    let outcome = |r: std::result::Result<(), wgpu::BufferAsyncError>| {
        r.map_err(|e| gpu.err(format!("mapping the {what} buffer: {e}")))
    };
    if let Ok(r) = mapped.try_recv() {
        return outcome(r);
    }
    if spin {
        loop {
            gpu.device
                .poll(wgpu::PollType::Poll)
                .map_err(|e| gpu.err(format!("polling the queue: {e}")))?;
            if let Ok(r) = mapped.try_recv() {
                return outcome(r);
            }
            gpu.check()?;
            std::hint::spin_loop();
        }
    }
    let poll = |submission_index| {
        gpu.device
            .poll(wgpu::PollType::Wait {
                submission_index,
                timeout: None,
            })
            .map_err(|e| gpu.err(format!("waiting for the queue: {e}")))
    };
    if let Some(i) = index {
        poll(Some(i))?;
        if let Ok(r) = mapped.try_recv() {
            return outcome(r);
        }
    }
    poll(None)?;
    match mapped.try_recv() {
        Ok(r) => outcome(r),
        Err(_) => Err(gpu.err(format!(
            "the {what} buffer was not mapped after all work was done"
        ))),
    }
}

/// Host time of each step of bare wgpu transfers of one size ([`measure_floor`]), per call.
#[derive(Clone, Debug, Default)]
pub struct TransferFloor {
    /// Bytes moved per call.
    pub bytes: usize,
    /// Calls timed per path.
    pub calls: usize,
    /// A readback: `copy+submit` (encoding a copy into a MAP_READ buffer and submitting it),
    /// `map_async`, `wait` (until the mapping is granted), `read` (the mapped range, copied
    /// out), `unmap`, `total`.
    pub read: Vec<(&'static str, Duration)>,
    /// A write through a MAP_WRITE buffer: `map wait` (asking for the mapping and waiting
    /// for it), `write` (copying into the mapping), `unmap`, `copy+submit`, `wait` (until the
    /// copy has run), `total`.
    pub write_mapped: Vec<(&'static str, Duration)>,
    /// A write through `Queue::write_buffer`: `write_buffer+submit`, `wait`, `total`.
    pub write_queued: Vec<(&'static str, Duration)>,
}

/// Times `calls` bare transfers of `bytes` bytes (whole words) each way between host memory and
/// a storage buffer of `gpu`, step by step ([`TransferFloor`]), waiting as the staging does
/// (`spin`: [`crate::WgpuOptions::spin_wait`]). A few calls run untimed first.
pub(crate) fn measure_floor(
    gpu: &Arc<Gpu>,
    bytes: usize,
    calls: usize,
    spin: bool,
) -> Result<TransferFloor> {
    let size = (bytes.max(4) as u64).div_ceil(4) * 4;
    let usage =
        wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::COPY_DST;
    let device_buf = gpu.new_buffer("tessera floor", size, usage)?;
    let readback = gpu.new_buffer(
        "tessera floor readback",
        size,
        wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
    )?;
    let upload = gpu.new_buffer(
        "tessera floor upload",
        size,
        wgpu::BufferUsages::MAP_WRITE | wgpu::BufferUsages::COPY_SRC,
    )?;
    let data: Vec<u8> = (0..size).map(|i| (i * 7 + 3) as u8).collect();
    let mut out = vec![0u8; size as usize];
    let calls = calls.max(1);
    let warm = 3;
    let mut read = Steps::default();
    let mut write_mapped = Steps::default();
    let mut write_queued = Steps::default();
    for call in 0..warm + calls {
        let timed = call >= warm;
        // A readback.
        let mut t = Steps::start(timed);
        let mut enc = gpu
            .device
            .create_command_encoder(&wgpu::CommandEncoderDescriptor { label: None });
        enc.copy_buffer_to_buffer(&device_buf, 0, &readback, 0, size);
        let index = gpu.queue.submit([enc.finish()]);
        t.lap("copy+submit");
        let mapped = ask_map(&readback, wgpu::MapMode::Read, size);
        t.lap("map_async");
        wait_mapped(gpu, &mapped, Some(index), spin, "readback")?;
        t.lap("wait");
        {
            let view = readback
                .get_mapped_range(..size)
                .map_err(|e| gpu.err(format!("mapping the readback buffer: {e}")))?;
            out.copy_from_slice(&view);
        }
        t.lap("read");
        readback.unmap();
        t.lap("unmap");
        read.add(t);
        // A write through the mapped upload buffer.
        let mut t = Steps::start(timed);
        let mapped = ask_map(&upload, wgpu::MapMode::Write, size);
        wait_mapped(gpu, &mapped, None, spin, "upload")?;
        t.lap("map wait");
        {
            let mut view = upload
                .get_mapped_range_mut(..size)
                .map_err(|e| gpu.err(format!("mapping the upload buffer: {e}")))?;
            view.copy_from_slice(&data);
        }
        t.lap("write");
        upload.unmap();
        t.lap("unmap");
        let mut enc = gpu
            .device
            .create_command_encoder(&wgpu::CommandEncoderDescriptor { label: None });
        enc.copy_buffer_to_buffer(&upload, 0, &device_buf, 0, size);
        let index = gpu.queue.submit([enc.finish()]);
        t.lap("copy+submit");
        wait_done(gpu, index, spin)?;
        t.lap("wait");
        write_mapped.add(t);
        // A write through the queue's own staging.
        let mut t = Steps::start(timed);
        gpu.queue.write_buffer(&device_buf, 0, &data);
        let index = gpu.queue.submit([]);
        t.lap("write_buffer+submit");
        wait_done(gpu, index, spin)?;
        t.lap("wait");
        write_queued.add(t);
        gpu.check()?;
    }
    if out != data {
        return Err(gpu.err("the transfer floor read back other bytes than it wrote"));
    }
    Ok(TransferFloor {
        bytes: size as usize,
        calls,
        read: read.per_call(calls),
        write_mapped: write_mapped.per_call(calls),
        write_queued: write_queued.per_call(calls),
    })
}

/// Waits until submission `index` has run (see [`wait_mapped`] for `spin`).
fn wait_done(gpu: &Gpu, index: wgpu::SubmissionIndex, spin: bool) -> Result<()> {
    if spin {
        // A callback that runs once everything submitted so far has run.
        let (tx, rx) = channel();
        gpu.queue.on_submitted_work_done(move || {
            let _ = tx.send(());
        });
        loop {
            gpu.device
                .poll(wgpu::PollType::Poll)
                .map_err(|e| gpu.err(format!("polling the queue: {e}")))?;
            if rx.try_recv().is_ok() {
                return gpu.check();
            }
            std::hint::spin_loop();
        }
    }
    gpu.device
        .poll(wgpu::PollType::Wait {
            submission_index: Some(index),
            timeout: None,
        })
        .map_err(|e| gpu.err(format!("waiting for the queue: {e}")))?;
    gpu.check()
}

/// Step times of one call of [`measure_floor`], or their sums over calls.
#[derive(Default)]
struct Steps {
    steps: Vec<(&'static str, Duration)>,
    started: Option<Instant>,
    at: Option<Instant>,
}

impl Steps {
    fn start(timed: bool) -> Steps {
        let now = timed.then(Instant::now);
        Steps {
            steps: Vec::new(),
            started: now,
            at: now,
        }
    }

    fn lap(&mut self, step: &'static str) {
        if let Some(at) = self.at {
            let now = Instant::now();
            self.steps.push((step, now - at));
            self.at = Some(now);
        }
    }

    /// Adds a call's steps (and its total) to these sums.
    fn add(&mut self, call: Steps) {
        let Some(started) = call.started else { return };
        let total = call.at.unwrap_or(started) - started;
        for (step, t) in call.steps.into_iter().chain([("total", total)]) {
            match self.steps.iter_mut().find(|(s, _)| *s == step) {
                Some((_, sum)) => *sum += t,
                None => self.steps.push((step, t)),
            }
        }
    }

    fn per_call(self, calls: usize) -> Vec<(&'static str, Duration)> {
        self.steps
            .into_iter()
            .map(|(s, t)| (s, t / calls as u32))
            .collect()
    }
}
