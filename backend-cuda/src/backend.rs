//! [`CudaBackend`]: a stream on one GPU that computes graphs, copies asynchronously and records
//! events.

use std::any::Any;
use std::sync::Arc;

use cudarc::driver::{sys, CudaEvent, CudaStream};
use tessera_core::graph_key::GraphKey;
use tessera_core::staging::{foreign_staging, StagedView, Staging};
use tessera_core::{Backend, Buffer, Error, Event, Graph, Result, TensorId};

use crate::blas::Blas;
use crate::cmd::Cmd;
use crate::comm::peer::PeerGroup;
use crate::driver::DeviceShared;
use crate::graphs::{GraphCache, GraphMode, ListSetup};
use crate::kernels::Build;
use crate::memory::CudaBuffer;
use crate::ops::{Encoder, COUNTER_BYTES};
use crate::staging::CudaStaging;
use crate::{CudaOptions, FewColumns};

/// A stream of work on one GPU.
///
/// [`Backend::compute`] encodes the nodes into a command list first (an unsupported node is an
/// error before anything runs), then runs the list eagerly or through a CUDA graph
/// ([`crate::graphs`]). Scratch memory for the ops comes from an arena owned by the backend that
/// grows, stream-ordered, when a graph needs more. Its settings come from the
/// [`CudaOptions`] of the device that made it.
pub struct CudaBackend {
    graphs: GraphCache,
    blas: Blas,
    scratch: u64,
    scratch_cap: usize,
    /// Zeroed block counters for the kernels ([`crate::ops::Encoder::counters`]).
    counters: u64,
    tf32: bool,
    fuse: bool,
    few_columns: FewColumns,
    /// The kernels this stream launches.
    build: Build,
    stream: Arc<CudaStream>,
    dev: Arc<DeviceShared>,
    /// The peer all-reduce group this stream joined and its rank there, for
    /// [`tessera_core::Op::AllReduce`] nodes.
    group: Option<(Arc<PeerGroup>, usize)>,
    /// Computations run per [`GraphMode`] (eager, captured, updated, replayed), logged at
    /// debug level when the backend is dropped.
    modes: [u32; 4],
}

impl CudaBackend {
    pub(crate) fn new(dev: Arc<DeviceShared>, options: &CudaOptions) -> Result<CudaBackend> {
        dev.bind()?;
        let stream = dev
            .ctx
            .new_stream()
            .map_err(|e| dev.err("creating a stream", e))?;
        let blas = Blas::new(dev.clone(), stream.cu_stream())?;
        let s = stream.cu_stream();
        let counters = dev.pool.alloc(&dev, COUNTER_BYTES, s)?;
        // SAFETY: the block holds COUNTER_BYTES bytes of this context, ordered on the stream.
        if let Err(e) = unsafe { sys::cuMemsetD8Async(counters, 0, COUNTER_BYTES, s) }.result() {
            dev.pool.free(&dev, counters, s);
            return Err(dev.err("clearing the block counters", e));
        }
        Ok(CudaBackend {
            graphs: GraphCache::new(options.graphs, options.profile),
            blas,
            scratch: 0,
            scratch_cap: 0,
            counters,
            tf32: options.tf32,
            fuse: options.fusion,
            few_columns: options.few_columns,
            build: Build::of(options),
            stream,
            dev,
            group: None,
            modes: [0; 4],
        })
    }

    /// What encoding depends on besides the graph and its nodes (see [`ListSetup`]).
    fn list_setup(&self) -> ListSetup {
        let (group, rank) = self
            .group
            .as_ref()
            .map_or((0, 0), |(g, r)| (Arc::as_ptr(g) as usize, *r));
        [
            self.scratch,
            self.scratch_cap as u64,
            u64::from(self.fuse),
            u64::from(self.tf32),
            group as u64,
            rank as u64,
        ]
    }

    /// The device ordinal.
    pub(crate) fn ordinal(&self) -> usize {
        self.dev.ordinal
    }

    /// The raw stream.
    pub(crate) fn cu_stream(&self) -> sys::CUstream {
        self.stream.cu_stream()
    }

    /// Makes the device's context current on this thread.
    pub(crate) fn bind(&self) -> Result<()> {
        self.dev.bind()
    }

    /// Submits one command to the stream, outside any graph.
    pub(crate) fn run_command(&mut self, cmd: &Cmd) -> Result<()> {
        self.dev.bind()?;
        cmd.run(&self.dev, self.stream.cu_stream(), &self.blas)
    }

    /// Joins a peer all-reduce group as rank `rank`: later graphs may hold all-reduce nodes.
    pub(crate) fn join_group(&mut self, group: Arc<PeerGroup>, rank: usize) {
        self.group = Some((group, rank));
    }

    /// How the last [`Backend::compute`] ran (eagerly, or through a captured, updated or
    /// replayed CUDA graph).
    pub fn graph_mode(&self) -> GraphMode {
        self.graphs.mode
    }

    /// How many commands (kernel launches, GEMMs, copies) the last [`Backend::compute`] encoded.
    pub fn last_command_count(&self) -> usize {
        self.graphs.last_names().len()
    }

    /// The names of the commands the last [`Backend::compute`] encoded, in order: kernel names,
    /// `gemm` for a cuBLAS GEMM, `copy` for a device copy.
    pub fn last_command_names(&self) -> Vec<&'static str> {
        self.graphs.last_names().to_vec()
    }

    fn err(&self, what: &str, e: cudarc::driver::DriverError) -> Error {
        self.dev.err(what, e)
    }

    /// `staging` as this device's, or an error.
    fn own_staging<'a>(&self, staging: &'a mut dyn Staging) -> Result<&'a mut CudaStaging> {
        match staging.as_any_mut().downcast_mut::<CudaStaging>() {
            Some(s) if s.ordinal == self.dev.ordinal => Ok(s),
            _ => Err(foreign_staging(&self.dev.name)),
        }
    }

    /// The CUDA buffer of this device behind `b`, if it is one.
    fn own<'b>(&self, b: &'b dyn Buffer) -> Option<&'b CudaBuffer> {
        b.as_any()
            .downcast_ref::<CudaBuffer>()
            .filter(|c| c.ordinal() == self.dev.ordinal)
    }

    /// The commands of `nodes`, encoded with the present scratch arena (which the encoder says
    /// whether it fits).
    fn encode<'g>(&'g self, graph: &'g Graph, nodes: &[TensorId]) -> Result<Encoder<'g>> {
        let mut enc = Encoder::new(
            &self.dev,
            graph,
            self.scratch,
            self.scratch_cap,
            self.tf32,
            self.fuse,
            &self.build,
        );
        enc.group = self.group.clone();
        enc.counters = self.counters;
        enc.few_columns = self.few_columns;
        enc.encode(nodes)?;
        Ok(enc)
    }

    /// Makes the scratch arena at least `need` bytes.
    fn grow_scratch(&mut self, need: usize) -> Result<()> {
        let size = need.max(self.scratch_cap * 3 / 2).div_ceil(1 << 20) << 20;
        let s = self.stream.cu_stream();
        self.dev.pool.free(&self.dev, self.scratch, s);
        self.scratch = 0;
        self.scratch_cap = 0;
        self.scratch = self.dev.pool.alloc(&self.dev, size, s)?;
        self.scratch_cap = size;
        log::debug!("{}: scratch arena of {size} bytes", self.dev.name);
        Ok(())
    }
}

impl Drop for CudaBackend {
    fn drop(&mut self) {
        self.graphs.log_profile(&self.dev.name);
        let [eager, captured, updated, replayed] = self.modes;
        log::debug!(
            "{}: computations run eagerly {eager}, captured {captured}, updated {updated}, replayed {replayed}",
            self.dev.name
        );
        if let Err(e) = self.stream.synchronize() {
            log::warn!("{}: {}", self.dev.name, crate::driver::describe(e));
        }
        self.dev
            .pool
            .free(&self.dev, self.scratch, self.stream.cu_stream());
        self.dev
            .pool
            .free(&self.dev, self.counters, self.stream.cu_stream());
    }
}

/// A point in a CUDA stream.
pub struct CudaEventMark {
    event: CudaEvent,
    device: String,
}

impl Event for CudaEventMark {
    fn synchronize(&self) -> Result<()> {
        self.event
            .synchronize()
            .map_err(|e| crate::driver::drv(&self.device, "waiting for an event", e))
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

impl Backend for CudaBackend {
    fn name(&self) -> String {
        self.dev.name.clone()
    }

    fn compute(&mut self, graph: &Graph, nodes: &[TensorId]) -> Result<()> {
        self.dev.bind()?;
        let site = (
            graph as *const Graph as usize,
            nodes.as_ptr() as usize,
            nodes.len(),
        );
        // The same graph, unchanged, with the same nodes: its graph runs again as it is.
        let keyed = !self.graphs.profiling();
        let setup = self.list_setup();
        if keyed
            && self.graphs.relaunch(
                &self.dev,
                self.stream.cu_stream(),
                site,
                (graph, nodes, &setup),
            )?
        {
            self.modes[GraphMode::Replayed as usize] += 1;
            return Ok(());
        }
        let started = self.graphs.profiling().then(std::time::Instant::now);
        let enc = self.encode(graph, nodes)?;
        let cmds = if enc.scratch_fits() {
            enc.cmds
        } else {
            let need = enc.scratch_need;
            drop(enc);
            self.grow_scratch(need)?;
            self.encode(graph, nodes)?.cmds
        };
        if let Some(t) = started {
            self.graphs.note_encode(t.elapsed().as_secs_f64() * 1e3);
        }
        // Encoding may have grown the scratch arena: the key names the arena used.
        let key = keyed.then(|| GraphKey::new(graph, nodes, &self.list_setup()));
        let (dev, blas, s) = (&self.dev, &self.blas, self.stream.cu_stream());
        self.graphs.run(dev, s, blas, site, cmds, key)?;
        self.modes[self.graphs.mode as usize] += 1;
        Ok(())
    }

    fn synchronize(&mut self) -> Result<()> {
        self.dev.bind()?;
        self.stream
            .synchronize()
            .map_err(|e| self.err("synchronizing the stream", e))
    }

    fn set_async(&mut self, buffer: &dyn Buffer, offset: usize, data: &[u8]) -> Result<()> {
        let Some(b) = self.own(buffer) else {
            self.synchronize()?;
            return buffer.set(offset, data);
        };
        b.check_range(offset, data.len())?;
        if data.is_empty() {
            return Ok(());
        }
        self.dev.bind()?;
        // SAFETY: the range was checked. From pageable memory the driver has copied `data`
        // into its staging area before returning; page-locked `data` must stay unchanged until
        // the next synchronize (the trait's ordering rule).
        unsafe {
            sys::cuMemcpyHtoDAsync_v2(
                b.device_ptr() + offset as u64,
                data.as_ptr().cast(),
                data.len(),
                self.stream.cu_stream(),
            )
        }
        .result()
        .map_err(|e| self.err("copying to the device", e))
    }

    fn get_async(&mut self, buffer: &dyn Buffer, offset: usize, out: &mut [u8]) -> Result<()> {
        let Some(b) = self.own(buffer) else {
            self.synchronize()?;
            return buffer.get(offset, out);
        };
        b.check_range(offset, out.len())?;
        if out.is_empty() {
            return Ok(());
        }
        self.dev.bind()?;
        // SAFETY: the range was checked; the bytes are valid after the next synchronize.
        unsafe {
            sys::cuMemcpyDtoHAsync_v2(
                out.as_mut_ptr().cast(),
                b.device_ptr() + offset as u64,
                out.len(),
                self.stream.cu_stream(),
            )
        }
        .result()
        .map_err(|e| self.err("copying from the device", e))
    }

    fn new_staging(&mut self, bytes: usize) -> Result<Box<dyn Staging>> {
        Ok(Box::new(CudaStaging::new(&self.dev, bytes)?))
    }

    /// The read goes into the staging's page-locked memory on the stream (a blocking read for
    /// a buffer of another device), and the staging's event is recorded after it.
    fn stage_read(
        &mut self,
        staging: &mut dyn Staging,
        buffer: &dyn Buffer,
        offset: usize,
        len: usize,
    ) -> Result<()> {
        let st = self.own_staging(staging)?;
        st.len = None;
        self.get_async(buffer, offset, st.bytes(len)?)?;
        self.dev.bind()?;
        st.event
            .record(&self.stream)
            .map_err(|e| self.err("recording an event", e))?;
        st.len = Some(len);
        Ok(())
    }

    /// Waits for the staging's event: the read, not the writes queued after it.
    fn staged<'a>(&mut self, staging: &'a mut dyn Staging) -> Result<StagedView<'a>> {
        let st = self.own_staging(staging)?;
        if st.len.is_some() {
            st.event
                .synchronize()
                .map_err(|e| self.err("waiting for a staged read", e))?;
        }
        st.view()
    }

    /// A write into this device's memory goes out of the page-locked memory on the staging's
    /// own stream, after the read it follows, and this stream waits for it: the next read
    /// into the staging and every later computation are queued after it, so the memory stays
    /// unchanged until the copy has run. Other buffers are written in stream order.
    fn stage_write(
        &mut self,
        staging: &mut dyn Staging,
        buffer: &dyn Buffer,
        offset: usize,
        len: usize,
    ) -> Result<()> {
        let st = self.own_staging(staging)?;
        st.check_write(len)?;
        let Some(b) = self.own(buffer) else {
            return self.set_async(buffer, offset, st.bytes(len)?);
        };
        b.check_range(offset, len)?;
        if len == 0 {
            return Ok(());
        }
        self.dev.bind()?;
        st.up
            .wait(&st.event)
            .map_err(|e| self.err("ordering a staged write after its read", e))?;
        let data = st.bytes(len)?.as_ptr();
        // SAFETY: the range was checked; `data` is `len` bytes of page-locked memory that the
        // staging keeps alive and that the host leaves unchanged until this copy has run (the
        // next read into it is queued on this stream, which waits for the copy below).
        unsafe {
            sys::cuMemcpyHtoDAsync_v2(
                b.device_ptr() + offset as u64,
                data.cast(),
                len,
                st.up.cu_stream(),
            )
        }
        .result()
        .map_err(|e| self.err("copying to the device", e))?;
        st.written
            .record(&st.up)
            .map_err(|e| self.err("recording an event", e))?;
        self.stream
            .wait(&st.written)
            .map_err(|e| self.err("waiting for a staged write", e))
    }

    fn copy_async(
        &mut self,
        src: &dyn Buffer,
        src_offset: usize,
        dst: &dyn Buffer,
        dst_offset: usize,
        len: usize,
    ) -> Result<()> {
        src.check_range(src_offset, len)?;
        dst.check_range(dst_offset, len)?;
        if len == 0 {
            return Ok(());
        }
        let s = self.stream.cu_stream();
        let src_cuda = src.as_any().downcast_ref::<CudaBuffer>();
        let dst_cuda = dst.as_any().downcast_ref::<CudaBuffer>();
        self.dev.bind()?;
        // SAFETY (each arm): both ranges were checked above; host memory involved belongs to
        // buffers the caller keeps alive until the stream is synchronized.
        let r = match (src_cuda, dst_cuda) {
            (Some(a), Some(b))
                if a.ordinal() == self.dev.ordinal && b.ordinal() == self.dev.ordinal =>
            unsafe {
                sys::cuMemcpyDtoDAsync_v2(
                    b.device_ptr() + dst_offset as u64,
                    a.device_ptr() + src_offset as u64,
                    len,
                    s,
                )
            },
            (Some(a), Some(b)) => unsafe {
                sys::cuMemcpyPeerAsync(
                    b.device_ptr() + dst_offset as u64,
                    b.dev.ctx.cu_ctx(),
                    a.device_ptr() + src_offset as u64,
                    a.dev.ctx.cu_ctx(),
                    len,
                    s,
                )
            },
            (None, Some(b)) if b.ordinal() == self.dev.ordinal && src.host_ptr().is_some() => unsafe {
                let p = src
                    .host_ptr()
                    .unwrap_or(std::ptr::null_mut())
                    .add(src_offset);
                sys::cuMemcpyHtoDAsync_v2(b.device_ptr() + dst_offset as u64, p as *const _, len, s)
            },
            (Some(a), None) if a.ordinal() == self.dev.ordinal && dst.host_ptr().is_some() => unsafe {
                let p = dst
                    .host_ptr()
                    .unwrap_or(std::ptr::null_mut())
                    .add(dst_offset);
                sys::cuMemcpyDtoHAsync_v2(p as *mut _, a.device_ptr() + src_offset as u64, len, s)
            },
            _ => {
                self.synchronize()?;
                return dst.copy_from(dst_offset, src, src_offset, len);
            }
        };
        r.result()
            .map_err(|e| self.err("copying between buffers", e))
    }

    fn record_event(&mut self) -> Result<Option<Arc<dyn Event>>> {
        self.dev.bind()?;
        let event = self
            .dev
            .ctx
            .new_event(None)
            .map_err(|e| self.err("creating an event", e))?;
        event
            .record(&self.stream)
            .map_err(|e| self.err("recording an event", e))?;
        Ok(Some(Arc::new(CudaEventMark {
            event,
            device: self.dev.name.clone(),
        })))
    }

    fn wait_event(&mut self, event: &dyn Event) -> Result<()> {
        match event.as_any().downcast_ref::<CudaEventMark>() {
            Some(e) => {
                self.dev.bind()?;
                self.stream
                    .wait(&e.event)
                    .map_err(|err| self.err("waiting for an event", err))
            }
            None => event.synchronize(),
        }
    }

    fn as_any_mut(&mut self) -> Option<&mut dyn Any> {
        Some(self)
    }
}
