//! [`WgpuBackend`]: a stream on one device. A graph is turned into launches, their parameter
//! blocks are written into one uniform buffer (each at a dynamic offset), and every dispatch
//! is recorded in one compute pass of one command buffer and submitted once; nothing is read
//! back. The resolved dispatches (pipelines, bind groups, parameters) are kept as a
//! [`Recording`] under the graph's key (core's GraphKey): a graph run again (a model's step graph, token
//! after token) is replayed from it without deciding anything again. A graph run recently, if it
//! comes again unchanged ([`Graph::stamp`]) with the same nodes, is replayed without even
//! making its key (a model's decode step, or each stage of a meta device's part graph, whose
//! key would cost a good part of the host's time per token).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use tessera_core::backend::{Backend, Buffer};
use tessera_core::graph_key::GraphKey;
use tessera_core::staging::{foreign_staging, StagedView, Staging};
use tessera_core::{Error, Graph, Result, TensorId};

use crate::buffer::{self, Readback, WgpuBuffer};
use crate::context::{Gpu, Window, PARAMS_SIZE};
use crate::fused::Fuser;
use crate::ops::{self, Bind};
use crate::profile::{self, Profile};
use crate::staging::{StagedCopy, WgpuStaging};
use crate::timing::{self, Timer};

/// One dispatch of a recorded graph.
struct Dispatch {
    pipeline: Arc<wgpu::ComputePipeline>,
    group: Arc<wgpu::BindGroup>,
    /// Offset of its parameter block.
    offset: u32,
    groups: [u32; 3],
    /// Its variant's short name, for profiles (empty in a recording made while not profiling).
    name: String,
}

impl Dispatch {
    /// Records this dispatch into `pass`.
    fn encode(&self, pass: &mut wgpu::ComputePass<'_>) {
        pass.set_pipeline(&self.pipeline);
        pass.set_bind_group(0, self.group.as_ref(), &[self.offset]);
        pass.dispatch_workgroups(self.groups[0], self.groups[1], self.groups[2]);
    }
}

/// A graph's dispatches, decided and resolved once and replayed while the graph (its nodes,
/// shapes, types, op parameters and memory: its [`GraphKey`]) stays the same.
pub(crate) struct Recording {
    /// The key it was recorded for.
    pub key: GraphKey,
    /// Ids of the buffers it binds (sorted), so that freeing one forgets it.
    pub buffers: Vec<u64>,
    /// The parameter buffer its bind groups use, and the blocks to write there.
    params: Arc<Params>,
    bytes: Vec<u8>,
    /// A number no other recording has: what [`Params::held`] holds while the parameter
    /// buffer holds this recording's blocks.
    serial: u64,
    dispatches: Vec<Dispatch>,
}

/// A backend's parameter buffer (uniform blocks of its recordings' dispatches).
pub(crate) struct Params {
    id: u64,
    buffer: wgpu::Buffer,
    size: u64,
    /// The serial of the recording whose blocks were last written here (0: none), so that a
    /// graph replayed again and again writes them once.
    held: AtomicU64,
}

/// A stream of work on one wgpu device.
pub struct WgpuBackend {
    gpu: Arc<Gpu>,
    /// The parameter buffer: its id, the buffer, and its size in bytes.
    params: Option<Arc<Params>>,
    /// Timestamp queries, made on the first graph run while GPU timing is on
    /// ([`crate::set_gpu_timing`]).
    timer: Option<Timer>,
    /// Reads of [`Backend::get_async`] that the next synchronize finishes, with the memory
    /// each fills.
    reads: Vec<(Readback, Out)>,
    /// Staging buffers of finished reads, kept for the next ones.
    spare: Vec<wgpu::Buffer>,
    /// Writes of [`Backend::set_async`] not yet submitted. The next submit copies them in from
    /// one upload buffer (one staging write for all of them).
    uploads: Uploads,
    /// The upload buffer, grown as needed.
    upload: Option<wgpu::Buffer>,
    /// Whether nothing was submitted since the last wait: a synchronize then need not wait
    /// (a host write into another device's memory, say, costs no round trip).
    idle: bool,
    /// Whether op sequences run fused ([`WgpuBackend::set_fusion`]).
    fusion: bool,
    /// Dispatches of the last [`Backend::compute`].
    last_dispatches: usize,
    /// Whether graphs are profiled per dispatch ([`WgpuBackend::set_profile`]), and the
    /// profile, made on the first profiled graph.
    profiling: bool,
    profile: Option<Profile>,
    /// Host time spent finding graphs' recordings (key and lookup), and encoding and
    /// submitting them, and how many graphs (logged at debug level when the backend is
    /// dropped).
    host: HostTime,
    /// The graphs run recently and their recordings, oldest first: the same graph, unchanged,
    /// with the same nodes runs again without a key. All are dropped when a buffer is
    /// forgotten (one of them may bind it).
    recent: std::collections::VecDeque<RecentGraph>,
    /// [`Gpu::forget_count`] when `recent` was last found valid.
    recent_forgets: u64,
}

/// What [`WgpuBackend::compute`] keeps of a graph it ran.
struct RecentGraph {
    /// The graph's [`Graph::stamp`] then, and the nodes run.
    stamp: u64,
    nodes: Vec<TensorId>,
    rec: Arc<Recording>,
}

/// Most graphs a backend finds again by their stamp: a meta device's part runs its graph in
/// two stages a layer (one compute each, between all-reduces), every step.
const RECENT_GRAPHS: usize = 256;

/// Dispatches per submitted command buffer of a graph: the GPU runs the first part while the
/// host encodes the next (a single command buffer leaves the GPU idle while a large graph is
/// encoded; parts much smaller than this pay for their submits).
const SUBMIT_CHUNK: usize = 48;

/// Writes waiting for the next submit, in the order they were asked for: their bytes one after
/// another, and where each goes.
#[derive(Default)]
struct Uploads {
    bytes: Vec<u8>,
    writes: Vec<Upload>,
}

/// One pending write.
enum Upload {
    /// Bytes of [`Uploads`]' `range`, to `dst` at `offset`.
    Bytes {
        dst: wgpu::Buffer,
        offset: u64,
        range: std::ops::Range<usize>,
    },
    /// A staged write's copy out of its staging's upload buffer.
    Staged(StagedCopy),
}

/// Host time of a backend's graphs (see [`WgpuBackend`]'s `host`).
#[derive(Default)]
struct HostTime {
    lookup: std::time::Duration,
    encode: std::time::Duration,
    graphs: u64,
    /// Graphs that were a graph run recently, unchanged (no key made).
    same: u64,
}

/// The caller's memory a pending read fills.
struct Out(*mut u8, usize);

// SAFETY: a pointer to memory that the caller of `get_async` keeps for this backend until the
// next synchronize, from whichever thread drives it.
unsafe impl Send for Out {}

/// The largest [`Backend::set_async`] write gathered into the upload buffer.
const UPLOAD_MAX: usize = 1 << 20;

/// Staging buffers kept for reads, at most, and the largest kept.
const SPARE: usize = 4;
const SPARE_MAX: u64 = 64 << 20;

impl WgpuBackend {
    /// A backend on an opened device.
    pub(crate) fn new(gpu: Arc<Gpu>) -> Self {
        let options = gpu.options;
        WgpuBackend {
            gpu,
            params: None,
            timer: None,
            reads: Vec::new(),
            spare: Vec::new(),
            uploads: Uploads::default(),
            upload: None,
            idle: true,
            fusion: options.fusion,
            last_dispatches: 0,
            profiling: options.profile,
            profile: None,
            host: HostTime::default(),
            recent: std::collections::VecDeque::new(),
            recent_forgets: 0,
        }
    }

    /// Turns the per-dispatch profile on or off (at first [`crate::WgpuOptions::profile`]; see
    /// the `profile` module): while on, each graph's dispatches
    /// are timed one by one on adapters with TIMESTAMP_QUERY, and the times summed per shader
    /// variant.
    pub fn set_profile(&mut self, on: bool) {
        self.profiling = on;
        self.recent.clear();
    }

    /// The profile so far: each shader variant's short name with its total GPU time and
    /// number of dispatches, the costliest first (empty when nothing was profiled).
    pub fn profile_table(&self) -> Vec<(String, std::time::Duration, usize)> {
        self.profile
            .as_ref()
            .map(Profile::table)
            .unwrap_or_default()
    }

    /// Turns fused dispatches (the `fused` module's op sequences) on or off (at first
    /// [`crate::WgpuOptions::fusion`]).
    pub fn set_fusion(&mut self, on: bool) {
        self.fusion = on;
        self.recent.clear();
    }

    /// How many dispatches the last [`Backend::compute`] recorded or replayed (0 when it ran
    /// nothing).
    pub fn last_dispatch_count(&self) -> usize {
        self.last_dispatches
    }

    /// The parameter buffer, grown to at least `size` bytes.
    fn params_buffer(&mut self, size: u64) -> Result<Arc<Params>> {
        if let Some(p) = &self.params {
            if p.size >= size {
                return Ok(p.clone());
            }
            self.gpu.forget_buffer(p.id);
        }
        let cap = size.next_power_of_two().max(1 << 16);
        let usage = wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST;
        let buffer = self.gpu.new_buffer("tessera params", cap, usage)?;
        let p = Arc::new(Params {
            id: self.gpu.next_id(),
            buffer,
            size: cap,
            held: AtomicU64::new(0),
        });
        self.params = Some(p.clone());
        Ok(p)
    }

    /// Copies the pending [`Backend::set_async`] writes into their buffers with commands
    /// recorded into `enc` (their bytes go to the upload buffer in one queue write, which runs
    /// before `enc` is executed).
    fn flush_uploads(&mut self, enc: &mut wgpu::CommandEncoder) -> Result<()> {
        let Uploads { bytes, writes } = &mut self.uploads;
        if writes.is_empty() {
            return Ok(());
        }
        let need = bytes.len() as u64;
        if need > 0 {
            if self.upload.as_ref().is_none_or(|u| u.size() < need) {
                let size = need.next_power_of_two().max(1 << 12);
                let usage = wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::COPY_DST;
                self.upload = Some(self.gpu.new_buffer("tessera uploads", size, usage)?);
            }
            if let Some(upload) = &self.upload {
                self.gpu.queue.write_buffer(upload, 0, bytes);
            }
        }
        for w in writes.drain(..) {
            match (w, &self.upload) {
                (Upload::Bytes { dst, offset, range }, Some(upload)) => {
                    let (from, len) = (range.start as u64, range.len() as u64);
                    enc.copy_buffer_to_buffer(upload, from, &dst, offset, len);
                }
                (Upload::Bytes { .. }, None) => {
                    return Err(self.gpu.err("pending writes without an upload buffer"))
                }
                (Upload::Staged(c), _) => c.record(enc),
            }
        }
        bytes.clear();
        Ok(())
    }

    /// Submits the pending [`Backend::set_async`] writes on their own.
    fn submit_uploads(&mut self) -> Result<()> {
        if self.uploads.writes.is_empty() {
            return Ok(());
        }
        let mut enc = self
            .gpu
            .device
            .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                label: Some("tessera uploads"),
            });
        self.flush_uploads(&mut enc)?;
        self.gpu.queue.submit([enc.finish()]);
        self.idle = false;
        self.gpu.check()
    }

    /// Decides the launches of `nodes` and resolves their pipelines, bind groups and
    /// parameters into a [`Recording`] (`None`: nothing to run).
    fn record(
        &mut self,
        graph: &Graph,
        nodes: &[TensorId],
        key: GraphKey,
    ) -> Result<Option<Recording>> {
        let mut launches = Vec::new();
        let fuser = Fuser::new(&self.gpu, graph, nodes);
        let mut i = 0;
        while i < nodes.len() {
            if self.fusion {
                if let Some((ls, n)) = fuser.try_fuse(i)? {
                    launches.extend(ls);
                    i += n;
                    continue;
                }
            }
            launches.extend(ops::launches(&self.gpu, graph, nodes[i])?);
            i += 1;
        }
        if launches.is_empty() {
            return Ok(None);
        }
        log::debug!(
            "wgpu: recording {} dispatches for {} nodes (fusion {})",
            launches.len(),
            nodes.len(),
            if self.fusion { "on" } else { "off" }
        );
        let stride = PARAMS_SIZE.max(u64::from(
            self.gpu.limits.min_uniform_buffer_offset_alignment,
        ));
        let params = self.params_buffer(stride * launches.len() as u64)?;
        // The scratch, made large enough for every launch before any binds it.
        let scratch_bytes = launches
            .iter()
            .flat_map(|l| &l.bind)
            .filter(|b| b.scratch)
            .map(|b| b.skip + b.span.unwrap_or(0))
            .max();
        let scratch = match scratch_bytes {
            Some(n) => Some(self.gpu.scratch(n as u64)?),
            None => None,
        };
        let mut bytes = vec![0u8; (stride as usize) * launches.len()];
        let mut dispatches = Vec::with_capacity(launches.len());
        let mut buffers = vec![params.id];
        for (i, l) in launches.iter_mut().enumerate() {
            let mut storage = Vec::with_capacity(l.bind.len());
            for (k, bind) in l.bind.iter().enumerate() {
                let (win, buf, off) = match (&scratch, bind.scratch) {
                    (Some((id, buf)), true) => {
                        let win = Window {
                            id: *id,
                            base: 0,
                            size: buf.size(),
                        };
                        (win, buf.clone(), bind.skip as u32)
                    }
                    _ => self.binding(graph, bind)?,
                };
                l.params.set_offset(k, off);
                buffers.push(win.id);
                storage.push((win, buf));
            }
            let at = i * stride as usize;
            bytes[at..at + PARAMS_SIZE as usize].copy_from_slice(bytemuck::bytes_of(&l.params));
            let pipeline = self.gpu.pipeline(&l.variant)?;
            let refs: Vec<(Window, &wgpu::Buffer)> =
                storage.iter().map(|(w, b)| (w.clone(), b)).collect();
            let group = self
                .gpu
                .bind_group(&l.variant, &refs, (params.id, &params.buffer));
            dispatches.push(Dispatch {
                pipeline,
                group,
                offset: (i as u64 * stride) as u32,
                groups: l.groups,
                name: if self.profiling {
                    profile::variant_name(&l.variant)
                } else {
                    String::new()
                },
            });
        }
        buffers.sort_unstable();
        buffers.dedup();
        Ok(Some(Recording {
            key,
            buffers,
            params,
            bytes,
            serial: self.gpu.next_id(),
            dispatches,
        }))
    }

    /// The window and wgpu buffer of a binding's memory, and its byte offset in the window.
    fn binding(&self, graph: &Graph, bind: &Bind) -> Result<(Window, wgpu::Buffer, u32)> {
        let id = bind.id;
        let data = graph.data_or_err(id)?;
        let buf = self
            .own(data.buffer.as_ref())
            .ok_or_else(|| Error::Buffer {
                buffer: data.buffer.name(),
                reason: format!(
                    "tensor '{}' is not in memory of {}",
                    graph.label(id),
                    self.gpu.name
                ),
            })?;
        let span = bind
            .span
            .unwrap_or_else(|| graph.get(id).nbytes().saturating_sub(bind.skip))
            .max(1);
        let (win, off) = buf.window(
            data.offset + bind.skip,
            span,
            &format!("tensor '{}'", graph.label(id)),
        )?;
        Ok((win, buf.buffer.clone(), off))
    }
}

impl Backend for WgpuBackend {
    fn name(&self) -> String {
        self.gpu.name.clone()
    }

    fn compute(&mut self, graph: &Graph, nodes: &[TensorId]) -> Result<()> {
        self.gpu.check()?;
        let found = std::time::Instant::now();
        let rec = match self.same_graph(graph, nodes) {
            Some(rec) => {
                self.host.same += 1;
                rec
            }
            None => match self.find_recording(graph, nodes)? {
                Some(rec) => {
                    if self.recent.len() == RECENT_GRAPHS {
                        self.recent.pop_front();
                    }
                    self.recent.push_back(RecentGraph {
                        stamp: graph.stamp(),
                        nodes: nodes.to_vec(),
                        rec: rec.clone(),
                    });
                    rec
                }
                None => {
                    self.last_dispatches = 0;
                    return Ok(());
                }
            },
        };
        self.run_recording(&rec, found)
    }

    /// One wait for everything submitted, then the pending reads are copied out of their
    /// mapped staging buffers into the callers' memory.
    fn synchronize(&mut self) -> Result<()> {
        self.submit_uploads()?;
        if self.idle {
            return self.gpu.check();
        }
        let mut result = self.gpu.wait();
        self.idle = true;
        for (r, out) in self.reads.drain(..) {
            // SAFETY: `get_async`'s caller keeps `out` for it until this synchronize.
            let out = unsafe { std::slice::from_raw_parts_mut(out.0, out.1) };
            match r.finish(&self.gpu, out) {
                Ok(staging) if staging.size() <= SPARE_MAX => self.spare.push(staging),
                Ok(_) => {}
                Err(e) => result = result.and(Err(e)),
            }
        }
        if self.spare.len() > SPARE {
            self.spare
                .sort_unstable_by_key(|b| std::cmp::Reverse(b.size()));
            self.spare.truncate(SPARE);
        }
        result
    }

    /// Reads of this device's buffers are copied into a staging buffer (one kept from an
    /// earlier read where one is large enough) and mapped without waiting; the next
    /// synchronize copies the bytes into `out`. The pending writes go in the same submit, just
    /// before the copy (one submit, not two: a host all-reduce writes a chunk back and reads
    /// the next). Others fall back to a synchronize and a blocking read.
    fn get_async(&mut self, buffer: &dyn Buffer, offset: usize, out: &mut [u8]) -> Result<()> {
        let Some(b) = self.own(buffer) else {
            self.synchronize()?;
            return buffer.get(offset, out);
        };
        b.check_range(offset, out.len())?;
        if out.is_empty() {
            return Ok(());
        }
        let size = buffer::read_size(offset, out.len());
        let fit = (self.spare.iter().enumerate())
            .filter(|(_, s)| s.size() >= size)
            .min_by_key(|(_, s)| s.size())
            .map(|(i, _)| i);
        let staging = match fit {
            Some(i) => self.spare.swap_remove(i),
            None => {
                let round = size
                    .next_power_of_two()
                    .min(self.gpu.limits.max_buffer_size);
                buffer::staging_buffer(&self.gpu, round.max(size))?
            }
        };
        let mut enc = self
            .gpu
            .device
            .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                label: Some("tessera read"),
            });
        self.flush_uploads(&mut enc)?;
        let r = b.start_read(offset, out.len(), staging, enc)?;
        self.idle = false;
        self.reads.push((r, Out(out.as_mut_ptr(), out.len())));
        self.gpu.check()
    }

    /// Word-aligned writes to this device's buffers are queued in stream order without
    /// waiting (small ones gathered for one upload with the next submit, larger ones queue
    /// writes of their own); others fall back to a synchronize and a blocking write.
    fn set_async(&mut self, buffer: &dyn Buffer, offset: usize, data: &[u8]) -> Result<()> {
        match self.own(buffer) {
            Some(b) if (offset | data.len()) & 3 == 0 => {
                b.check_range(offset, data.len())?;
                if data.len() > UPLOAD_MAX {
                    self.submit_uploads()?;
                    self.gpu.queue.write_buffer(&b.buffer, offset as u64, data);
                    self.gpu.queue.submit([]);
                    self.idle = false;
                    return self.gpu.check();
                }
                let Uploads { bytes, writes } = &mut self.uploads;
                let start = bytes.len();
                bytes.extend_from_slice(data);
                writes.push(Upload::Bytes {
                    dst: b.buffer.clone(),
                    offset: offset as u64,
                    range: start..bytes.len(),
                });
                Ok(())
            }
            _ => {
                self.synchronize()?;
                buffer.set(offset, data)
            }
        }
    }

    fn new_staging(&mut self, bytes: usize) -> Result<Box<dyn Staging>> {
        Ok(Box::new(WgpuStaging::new(&self.gpu, bytes)?))
    }

    /// Whole words of this device's buffers are copied into the staging's readback buffer,
    /// after the pending writes, in one submit; other ranges go through `get_async`.
    fn stage_read(
        &mut self,
        staging: &mut dyn Staging,
        buffer: &dyn Buffer,
        offset: usize,
        len: usize,
    ) -> Result<()> {
        let st = self.own_staging(staging)?;
        match self.own(buffer) {
            Some(b) if WgpuStaging::words(offset, len) => {
                b.check_range(offset, len)?;
                let mut enc =
                    self.gpu
                        .device
                        .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                            label: Some("tessera staged read"),
                        });
                self.flush_uploads(&mut enc)?;
                st.start_read(b, offset, len, enc)?;
                self.idle = false;
                Ok(())
            }
            _ => {
                st.host().read(self, buffer, offset, len)?;
                st.set_via_host(true);
                Ok(())
            }
        }
    }

    /// A staged write not yet submitted is submitted first, so that the upload buffer it
    /// copies out of can be mapped again.
    fn staged<'a>(&mut self, staging: &'a mut dyn Staging) -> Result<StagedView<'a>> {
        if self
            .uploads
            .writes
            .iter()
            .any(|w| matches!(w, Upload::Staged(_)))
        {
            self.submit_uploads()?;
        }
        let st = self.own_staging(staging)?;
        if st.via_host() {
            st.host().view(self)
        } else {
            st.view()
        }
    }

    /// After a read of whole words, the copy out of the upload buffer waits with the pending
    /// writes for the next submit (the next graph's, read's or synchronize's), which asks for
    /// the upload buffer's next mapping too: a round trip costs one submit, the read's.
    fn stage_write(
        &mut self,
        staging: &mut dyn Staging,
        buffer: &dyn Buffer,
        offset: usize,
        len: usize,
    ) -> Result<()> {
        let st = self.own_staging(staging)?;
        if st.via_host() {
            return st.host().write(self, buffer, offset, len);
        }
        let Some(b) = self.own(buffer).filter(|_| WgpuStaging::words(offset, len)) else {
            return Err(self.gpu.err(format!(
                "a staged write of {len} bytes at {offset} to {}: a staged read of whole words writes back whole words of this device's buffers",
                buffer.name()
            )));
        };
        b.check_range(offset, len)?;
        let copy = st.start_write(b, offset, len)?;
        self.uploads.writes.push(Upload::Staged(copy));
        Ok(())
    }

    /// Word-aligned copies between two of this device's buffers are recorded in stream order
    /// without waiting; others fall back to a synchronize and a blocking copy.
    fn copy_async(
        &mut self,
        src: &dyn Buffer,
        src_offset: usize,
        dst: &dyn Buffer,
        dst_offset: usize,
        len: usize,
    ) -> Result<()> {
        match (self.own(src), self.own(dst)) {
            (Some(s), Some(d)) if s.id != d.id && (src_offset | dst_offset | len) & 3 == 0 => {
                s.check_range(src_offset, len)?;
                d.check_range(dst_offset, len)?;
                let mut enc = self
                    .gpu
                    .device
                    .create_command_encoder(&wgpu::CommandEncoderDescriptor { label: None });
                self.flush_uploads(&mut enc)?;
                enc.copy_buffer_to_buffer(
                    &s.buffer,
                    src_offset as u64,
                    &d.buffer,
                    dst_offset as u64,
                    len as u64,
                );
                self.gpu.queue.submit([enc.finish()]);
                self.idle = false;
                self.gpu.check()
            }
            _ => {
                self.synchronize()?;
                dst.copy_from(dst_offset, src, src_offset, len)
            }
        }
    }
}

impl Drop for WgpuBackend {
    /// Reads the timestamps of the graphs it timed into the process-wide total, and logs its
    /// profile.
    fn drop(&mut self) {
        if let Some(t) = self.timer.as_mut() {
            if let Err(e) = t.flush(&self.gpu) {
                log::warn!("wgpu: GPU timing: {e}");
            }
        }
        if let Some(p) = &self.profile {
            p.log(&self.gpu.name);
        }
        let h = &self.host;
        if h.graphs > 0 {
            let each = |d: std::time::Duration| d.as_secs_f64() * 1e6 / h.graphs as f64;
            log::debug!(
                "{}: {} graphs ({} the graph before, unchanged), host time each: {:.1} us finding the recording, {:.1} us encoding and submitting",
                self.gpu.name,
                h.graphs,
                h.same,
                each(h.lookup),
                each(h.encode)
            );
        }
    }
}

impl WgpuBackend {
    /// The recording of a graph run recently, if `graph` is that graph, unchanged, with the
    /// same `nodes` (none once a buffer was forgotten since).
    fn same_graph(&mut self, graph: &Graph, nodes: &[TensorId]) -> Option<Arc<Recording>> {
        let forgets = self.gpu.forget_count();
        if forgets != self.recent_forgets {
            self.recent.clear();
            self.recent_forgets = forgets;
        }
        let stamp = graph.stamp();
        self.recent
            .iter()
            .rev()
            .find(|r| r.stamp == stamp && r.nodes == nodes)
            .map(|r| r.rec.clone())
    }

    /// The recording of `nodes` of `graph`: found under its key, or recorded now
    /// (`None`: nothing to run).
    fn find_recording(
        &mut self,
        graph: &Graph,
        nodes: &[TensorId],
    ) -> Result<Option<Arc<Recording>>> {
        // Fusion also depends on how many read each node (other nodes of the graph, outputs);
        // a profiled recording also names its dispatches.
        let mut settings = vec![u64::from(self.fusion), u64::from(self.profiling)];
        if self.fusion {
            let uses = graph.reader_counts();
            settings.extend(nodes.iter().map(|n| u64::from(uses[n.index()])));
        }
        // Freeing a buffer forgets the recordings that bind it (`Gpu::forget_buffer`).
        let key = GraphKey::unheld(graph, nodes, &settings);
        if let Some(rec) = self.gpu.recording(&key) {
            return Ok(Some(rec));
        }
        Ok(self.record(graph, nodes, key)?.map(|rec| {
            let rec = Arc::new(rec);
            self.gpu.keep_recording(rec.clone());
            rec
        }))
    }

    /// Runs recording `rec` (its parameter blocks written where the buffer holds another's,
    /// then its dispatches encoded and submitted; profiled per dispatch while profiling);
    /// `found`: when the search for it began.
    fn run_recording(&mut self, rec: &Arc<Recording>, found: std::time::Instant) -> Result<()> {
        self.last_dispatches = rec.dispatches.len();
        let held = rec.params.held.swap(rec.serial, Ordering::Relaxed);
        if held != rec.serial {
            self.gpu
                .queue
                .write_buffer(&rec.params.buffer, 0, &rec.bytes);
        }
        if self.profiling && self.gpu.timestamps {
            self.submit_uploads()?;
            let gpu = self.gpu.clone();
            let prof = self.profile.get_or_insert_with(|| Profile::new(&gpu));
            let names: Vec<&str> = rec.dispatches.iter().map(|d| d.name.as_str()).collect();
            self.idle = false;
            prof.run(&gpu, &names, |pass, i| rec.dispatches[i].encode(pass))?;
            return self.gpu.check();
        }
        self.host.lookup += found.elapsed();
        let started = std::time::Instant::now();
        let mut first = self
            .gpu
            .device
            .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                label: Some("tessera graph"),
            });
        self.flush_uploads(&mut first)?;
        let mut first = Some(first);
        let timer = if timing::timing_on() && self.gpu.timestamps {
            Some(self.timer.get_or_insert_with(|| Timer::new(&self.gpu)))
        } else {
            None
        };
        // A timed graph is one pass; else the GPU starts on the first SUBMIT_CHUNK dispatches
        // while the rest are encoded.
        let chunk = match timer {
            Some(_) => rec.dispatches.len().max(1),
            None => SUBMIT_CHUNK,
        };
        let mut timer = timer;
        // An empty graph still submits (the queued writes run).
        let empty: &[Dispatch] = &[];
        let parts = rec.dispatches.chunks(chunk);
        for part in parts.chain(rec.dispatches.is_empty().then_some(empty)) {
            let mut enc = first.take().unwrap_or_else(|| {
                self.gpu
                    .device
                    .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                        label: Some("tessera graph"),
                    })
            });
            {
                let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor {
                    label: None,
                    timestamp_writes: timer.take().and_then(|t| t.next()),
                });
                for d in part {
                    d.encode(&mut pass);
                }
            }
            self.gpu.queue.submit([enc.finish()]);
        }
        self.idle = false;
        self.host.encode += started.elapsed();
        self.host.graphs += 1;
        self.gpu.check()
    }

    /// `staging` as this device's, or an error.
    fn own_staging<'a>(&self, staging: &'a mut dyn Staging) -> Result<&'a mut WgpuStaging> {
        match staging.as_any_mut().downcast_mut::<WgpuStaging>() {
            Some(s) if s.on(&self.gpu) => Ok(s),
            _ => Err(foreign_staging(&self.gpu.name)),
        }
    }

    /// `buffer` as one of this device's buffers.
    fn own<'a>(&self, buffer: &'a dyn Buffer) -> Option<&'a WgpuBuffer> {
        buffer
            .as_any()
            .downcast_ref::<WgpuBuffer>()
            .filter(|b| Arc::ptr_eq(&b.gpu, &self.gpu))
    }
}

#[cfg(test)]
mod tests {
    use tessera_core::backend::BackendReg;

    /// Async reads (unaligned, several before one synchronize, staging reused by the next
    /// round) see the async writes queued before them.
    #[test]
    fn get_async_reads_after_set_async() {
        let Ok(devs) = crate::WgpuBackendReg::default().devices() else {
            return;
        };
        let buf = devs[0].buffer_type().alloc(4099).unwrap();
        let mut backend = devs[0].new_backend().unwrap();
        for round in 0..3u8 {
            let data: Vec<u8> = (0..4096u32).map(|i| (i as u8) ^ round).collect();
            backend.set_async(buf.as_ref(), 0, &data).unwrap();
            let (mut a, mut b) = (vec![0u8; 4096], vec![0u8; 5]);
            backend.get_async(buf.as_ref(), 0, &mut a).unwrap();
            backend.get_async(buf.as_ref(), 3, &mut b).unwrap();
            backend.synchronize().unwrap();
            assert_eq!(a, data);
            assert_eq!(b, data[3..8]);
        }
    }

    /// A read of several MiB (copied out of the mapped staging on several threads) from an
    /// unaligned offset gives the bytes written, behind a large write.
    #[test]
    fn large_async_reads_are_whole() {
        let Ok(devs) = crate::WgpuBackendReg::default().devices() else {
            return;
        };
        let n = (3 << 20) + 5;
        let buf = devs[0].buffer_type().alloc(n + 8).unwrap();
        let mut backend = devs[0].new_backend().unwrap();
        let data: Vec<u8> = (0..n + 3)
            .map(|i| (i as u32).wrapping_mul(2_654_435_761).to_le_bytes()[3])
            .collect();
        backend.set_async(buf.as_ref(), 4, &data).unwrap();
        let mut out = vec![0u8; n];
        backend.get_async(buf.as_ref(), 7, &mut out).unwrap();
        backend.synchronize().unwrap();
        assert!(out == data[3..], "the read differs from the bytes written");
    }
}
