//! CUDA graphs: replaying a computation instead of launching it again.
//!
//! A graph's command list (`cmd` module) is compared with the one last run from the same
//! place (a slot per recurring list, up to `MAX_SLOTS`, so that a caller alternating between
//! lists, such as a meta device's stages, keeps a graph for each):
//!
//! - the same list (same kernels, launch shapes and arguments, hence the same tensor
//!   addresses) replays the instantiated graph with one `cuGraphLaunch`;
//! - a list of the same launches with other arguments (another KV length, another buffer) is
//!   captured again and the instantiated graph updated in place (`cuGraphExecUpdate`), which is
//!   much cheaper than instantiating; where the update is refused the new graph is instantiated;
//! - a list seen for the first time runs eagerly: capturing only pays when a list comes back,
//!   so the first repeat is captured;
//! - a capture that fails (an operation that cannot be captured) leaves the stream usable and
//!   the list runs eagerly; after `MAX_FAILURES` failures graphs are off for the backend.
//!
//! [`crate::CudaOptions::graphs`] turns graphs off.
//!
//! [`crate::CudaOptions::profile`] times every command inside a captured graph (an event recorded
//! between commands) and logs, at debug level when the backend is dropped, the GPU time per
//! kernel name summed over all profiled runs: where a step's time goes. Profiled runs
//! instantiate a fresh graph every time, so they are slow on the host.

use cudarc::driver::sys;
use tessera_core::graph_key::GraphKey;
use tessera_core::{Graph, Result, TensorId};

use crate::blas::Blas;
use crate::cmd::Cmd;
use crate::driver::{describe, DeviceShared};

/// Capture failures after which graphs stay off.
const MAX_FAILURES: u32 = 4;

/// An instantiated graph and the graph it came from.
struct Exec {
    graph: sys::CUgraph,
    exec: sys::CUgraphExec,
}

// SAFETY: graph handles may be used from any thread; the backend owning them is used by one
// thread at a time.
unsafe impl Send for Exec {}

impl Drop for Exec {
    fn drop(&mut self) {
        // SAFETY: both handles are owned here and destroyed once.
        unsafe {
            let _ = sys::cuGraphExecDestroy(self.exec);
            let _ = sys::cuGraphDestroy(self.graph);
        }
    }
}

/// How the last computation was run (for tests and logs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GraphMode {
    /// Launched command by command.
    Eager,
    /// Captured and instantiated.
    Captured,
    /// Captured and the existing executable graph updated.
    Updated,
    /// The existing executable graph launched again.
    Replayed,
}

/// GPU time per command name, gathered when profiling ([`crate::CudaOptions::profile`]).
#[derive(Default)]
struct Profile {
    /// Runs profiled.
    runs: u32,
    /// Host milliseconds spent encoding the profiled runs' command lists, one entry a run.
    encode_ms: Vec<f64>,
    /// (name, total milliseconds, commands) in first-seen order.
    rows: Vec<(&'static str, f64, u32)>,
}

impl Profile {
    fn add(&mut self, name: &'static str, ms: f64) {
        match self.rows.iter_mut().find(|r| r.0 == name) {
            Some(r) => {
                r.1 += ms;
                r.2 += 1;
            }
            None => self.rows.push((name, ms, 1)),
        }
    }

    fn log(&self, device: &str) {
        if self.runs == 0 {
            return;
        }
        let runs = f64::from(self.runs);
        let total: f64 = self.rows.iter().map(|r| r.1).sum();
        let count: u32 = self.rows.iter().map(|r| r.2).sum();
        log::debug!(
            "{device}: profile of {} runs: {:.1} us GPU and {:.1} commands per run; host encoding {:.1} us median",
            self.runs,
            1e3 * total / runs,
            f64::from(count) / runs,
            1e3 * median(&self.encode_ms)
        );
        let mut rows = self.rows.clone();
        rows.sort_by(|a, b| b.1.total_cmp(&a.1));
        for (name, ms, n) in rows {
            log::debug!(
                "  {name:<28} {:>9.1} us/run {:>6.1} per run {:>7.2} us each",
                1e3 * ms / runs,
                f64::from(n) / runs,
                1e3 * ms / f64::from(n)
            );
        }
    }
}

/// The median of `v` (0 when empty).
fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

/// The name a command is profiled under.
fn cmd_name(c: &Cmd) -> &'static str {
    match c {
        Cmd::Kernel { name, .. } => name,
        Cmd::Gemm(_) => "cublas gemm",
        Cmd::Copy { .. } => "device copy",
    }
}

/// Most command lists a backend keeps graphs for.
const MAX_SLOTS: usize = 128;

/// What encoding depends on besides the graph and its nodes: the scratch arena (address,
/// bytes), the fusion and TF32 switches, and the all-reduce group joined (its address and the
/// rank; 0 when none). The settings of the list's [`GraphKey`].
pub(crate) type ListSetup = [u64; 6];

/// One remembered command list and its graph.
#[derive(Default)]
struct Slot {
    /// Where the list came from (the graph's and the node list's addresses and the node
    /// count): a hint for finding the slot again, never trusted without comparing commands.
    site: (usize, usize, usize),
    last: Vec<Cmd>,
    /// What `last` was encoded from, when known.
    key: Option<GraphKey>,
    exec: Option<Exec>,
    /// When the slot was last used (a counter), for evicting the oldest.
    used: u64,
}

/// The graph state of one backend: a graph per recurring command list. A caller that runs
/// several lists in turn (a meta device's stages) gets one slot per list, found by the site
/// the list came from; a list from a new site takes the slot whose list it equals, or updates
/// the most recent slot's graph when it has the same launches.
pub(crate) struct GraphCache {
    profile: Option<Profile>,
    enabled: bool,
    failures: u32,
    slots: Vec<Slot>,
    clock: u64,
    /// The names of the commands in the last list run (kernel names, `gemm`, `copy`).
    last_names: Vec<&'static str>,
    /// How the last list ran.
    pub mode: GraphMode,
}

impl GraphCache {
    /// Graphs on or off (`enabled`), commands profiled or not (`profile`).
    pub(crate) fn new(enabled: bool, profile: bool) -> GraphCache {
        GraphCache {
            profile: profile.then(Profile::default),
            enabled,
            failures: 0,
            slots: Vec::new(),
            clock: 0,
            last_names: Vec::new(),
            mode: GraphMode::Eager,
        }
    }

    /// The names of the commands in the last list run (kernel names, `gemm`, `copy`).
    pub(crate) fn last_names(&self) -> &[&'static str] {
        &self.last_names
    }

    /// Whether commands are being profiled.
    pub(crate) fn profiling(&self) -> bool {
        self.profile.is_some()
    }

    /// Adds host encoding time to the profile (nothing unless profiling).
    pub(crate) fn note_encode(&mut self, ms: f64) {
        if let Some(p) = &mut self.profile {
            p.encode_ms.push(ms);
        }
    }

    /// Logs the profile gathered so far (nothing unless profiling).
    pub(crate) fn log_profile(&self, device: &str) {
        if let Some(p) = &self.profile {
            p.log(device);
        }
    }

    /// The slot for a list from `site`: the one that site used, else one holding the same
    /// list, else the most recent one when it has the same launches, else a new (or the
    /// oldest) slot.
    fn slot_for(&mut self, site: (usize, usize, usize), cmds: &[Cmd]) -> usize {
        if let Some(i) = self.slots.iter().position(|s| s.site == site) {
            return i;
        }
        let i = self.slots.iter().position(|s| s.last == cmds).or_else(|| {
            let recent = (0..self.slots.len()).max_by_key(|&i| self.slots[i].used)?;
            let s = &self.slots[recent];
            let same_shape = s.exec.is_some()
                && s.last.len() == cmds.len()
                && s.last.iter().zip(cmds).all(|(a, b)| a.same_kind(b));
            same_shape.then_some(recent)
        });
        let i = match i {
            Some(i) => i,
            None if self.slots.len() < MAX_SLOTS => {
                self.slots.push(Slot::default());
                self.slots.len() - 1
            }
            None => {
                let oldest = (0..self.slots.len())
                    .min_by_key(|&i| self.slots[i].used)
                    .unwrap_or(0);
                self.slots[oldest] = Slot::default();
                oldest
            }
        };
        self.slots[i].site = site;
        i
    }

    /// Launches again the graph of the list last run from `site` when that list was encoded
    /// from a graph equal to `graph` with these `nodes` and `setup` (the caller then need not
    /// encode); false when there is no such graph.
    pub(crate) fn relaunch(
        &mut self,
        dev: &DeviceShared,
        stream: sys::CUstream,
        site: (usize, usize, usize),
        (graph, nodes, setup): (&Graph, &[TensorId], &ListSetup),
    ) -> Result<bool> {
        if self.profile.is_some() || !self.enabled || self.failures >= MAX_FAILURES {
            return Ok(false);
        }
        let Some(slot) = self.slots.iter_mut().find(|s| s.site == site) else {
            return Ok(false);
        };
        let (Some(ex), Some(k)) = (&slot.exec, &mut slot.key) else {
            return Ok(false);
        };
        if !k.matches(graph, nodes, setup) {
            return Ok(false);
        }
        k.refresh(graph);
        // SAFETY: the executable graph and the stream are valid.
        unsafe { sys::cuGraphLaunch(ex.exec, stream) }
            .result()
            .map_err(|e| dev.err("launching a CUDA graph", e))?;
        self.clock += 1;
        slot.used = self.clock;
        fill_names(&mut self.last_names, &slot.last);
        self.mode = GraphMode::Replayed;
        Ok(true)
    }

    /// Runs a command list from `site` (see [`Slot::site`]), encoded from `key`, on `stream`.
    pub(crate) fn run(
        &mut self,
        dev: &DeviceShared,
        stream: sys::CUstream,
        blas: &Blas,
        site: (usize, usize, usize),
        cmds: Vec<Cmd>,
        key: Option<GraphKey>,
    ) -> Result<()> {
        fill_names(&mut self.last_names, &cmds);
        if let Some(prof) = &mut self.profile {
            self.mode = GraphMode::Captured;
            return profiled(dev, stream, blas, &cmds, prof);
        }
        if !self.enabled || self.failures >= MAX_FAILURES || cmds.is_empty() {
            self.mode = GraphMode::Eager;
            return eager(dev, stream, blas, &cmds);
        }
        let i = self.slot_for(site, &cmds);
        self.clock += 1;
        let slot = &mut self.slots[i];
        slot.used = self.clock;
        slot.key = key;
        if let Some(ex) = &slot.exec {
            if cmds == slot.last {
                // SAFETY: the executable graph and the stream are valid.
                unsafe { sys::cuGraphLaunch(ex.exec, stream) }
                    .result()
                    .map_err(|e| dev.err("launching a CUDA graph", e))?;
                self.mode = GraphMode::Replayed;
                return Ok(());
            }
        }
        let same_shape = slot.last.len() == cmds.len()
            && slot.last.iter().zip(&cmds).all(|(a, b)| a.same_kind(b));
        let seen = cmds == slot.last;
        if !(seen || (same_shape && slot.exec.is_some())) {
            // New work: run it eagerly and remember it.
            slot.exec = None;
            self.mode = GraphMode::Eager;
            eager(dev, stream, blas, &cmds)?;
            slot.last = cmds;
            return Ok(());
        }
        let graph = match capture(dev, stream, blas, &cmds) {
            Ok(g) => g,
            Err(why) => {
                self.failures += 1;
                log::debug!(
                    "{}: CUDA graph capture failed ({why}); running eagerly",
                    dev.name
                );
                slot.exec = None;
                self.mode = GraphMode::Eager;
                eager(dev, stream, blas, &cmds)?;
                slot.last = cmds;
                return Ok(());
            }
        };
        let mut updated = false;
        if let Some(ex) = &mut slot.exec {
            // SAFETY: both graphs are valid; info is a valid out-pointer.
            let ok = unsafe {
                let mut info: sys::CUgraphExecUpdateResultInfo = std::mem::zeroed();
                sys::cuGraphExecUpdate_v2(ex.exec, graph, &mut info) == sys::CUresult::CUDA_SUCCESS
            };
            if ok {
                // SAFETY: the old graph is no longer needed; the exec now mirrors `graph`.
                unsafe {
                    let _ = sys::cuGraphDestroy(ex.graph);
                }
                ex.graph = graph;
                updated = true;
            }
        }
        if !updated {
            slot.exec = None;
            let mut exec: sys::CUgraphExec = std::ptr::null_mut();
            // SAFETY: graph is valid; exec is a valid out-pointer.
            let r = unsafe { sys::cuGraphInstantiateWithFlags(&mut exec, graph, 0) }.result();
            if let Err(e) = r {
                // SAFETY: the graph is ours and unused.
                unsafe {
                    let _ = sys::cuGraphDestroy(graph);
                }
                self.failures += 1;
                log::debug!(
                    "{}: instantiating a CUDA graph failed: {}",
                    dev.name,
                    describe(e)
                );
                self.mode = GraphMode::Eager;
                eager(dev, stream, blas, &cmds)?;
                slot.last = cmds;
                return Ok(());
            }
            slot.exec = Some(Exec { graph, exec });
        }
        let ex = slot
            .exec
            .as_ref()
            .map(|e| e.exec)
            .unwrap_or(std::ptr::null_mut());
        // SAFETY: ex is the valid executable graph just made or updated.
        unsafe { sys::cuGraphLaunch(ex, stream) }
            .result()
            .map_err(|e| dev.err("launching a CUDA graph", e))?;
        self.mode = if updated {
            GraphMode::Updated
        } else {
            GraphMode::Captured
        };
        slot.last = cmds;
        Ok(())
    }
}

/// Owned CUDA events, destroyed on drop.
struct Events(Vec<sys::CUevent>);

impl Drop for Events {
    fn drop(&mut self) {
        for &e in &self.0 {
            // SAFETY: each event was created here and is destroyed once.
            unsafe {
                let _ = sys::cuEventDestroy_v2(e);
            }
        }
    }
}

/// Sets `names` to the names of `cmds` (reusing its memory).
fn fill_names(names: &mut Vec<&'static str>, cmds: &[Cmd]) {
    names.clear();
    names.extend(cmds.iter().map(Cmd::name));
}

/// Runs the commands as one captured graph with an event recorded before the first and after
/// each, waits for it, and adds each command's GPU time to `prof`.
fn profiled(
    dev: &DeviceShared,
    stream: sys::CUstream,
    blas: &Blas,
    cmds: &[Cmd],
    prof: &mut Profile,
) -> Result<()> {
    let mut ev = Events(Vec::with_capacity(cmds.len() + 1));
    for _ in 0..=cmds.len() {
        let mut e: sys::CUevent = std::ptr::null_mut();
        // SAFETY: e is a valid out-pointer.
        unsafe { sys::cuEventCreate(&mut e, 0) }
            .result()
            .map_err(|err| dev.err("creating a profiling event", err))?;
        ev.0.push(e);
    }
    let record = |e: sys::CUevent| {
        // SAFETY: the event and stream are valid; an external record becomes a graph node.
        unsafe {
            sys::cuEventRecordWithFlags(
                e,
                stream,
                sys::CUevent_record_flags::CU_EVENT_RECORD_EXTERNAL as u32,
            )
        }
        .result()
        .map_err(|err| dev.err("recording a profiling event", err))
    };
    // SAFETY: the stream is valid and not being captured.
    unsafe {
        sys::cuStreamBeginCapture_v2(
            stream,
            sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED,
        )
    }
    .result()
    .map_err(|e| dev.err("beginning a profiling capture", e))?;
    let mut failed = record(ev.0[0]).err();
    for (c, &e) in cmds.iter().zip(&ev.0[1..]) {
        if failed.is_some() {
            break;
        }
        failed = c.run(dev, stream, blas).and_then(|()| record(e)).err();
    }
    let mut graph: sys::CUgraph = std::ptr::null_mut();
    // SAFETY: ends the capture begun above; graph is a valid out-pointer.
    let ended = unsafe { sys::cuStreamEndCapture(stream, &mut graph) }.result();
    let g = Exec {
        graph,
        exec: std::ptr::null_mut(),
    };
    if let Some(e) = failed {
        return Err(e);
    }
    ended.map_err(|e| dev.err("ending a profiling capture", e))?;
    let mut g = g;
    // SAFETY: the graph was just captured; exec is a valid out-pointer.
    unsafe { sys::cuGraphInstantiateWithFlags(&mut g.exec, g.graph, 0) }
        .result()
        .map_err(|e| dev.err("instantiating a profiling graph", e))?;
    // SAFETY: the executable graph and the stream are valid.
    unsafe { sys::cuGraphLaunch(g.exec, stream) }
        .result()
        .map_err(|e| dev.err("launching a profiling graph", e))?;
    // SAFETY: the stream is valid.
    unsafe { sys::cuStreamSynchronize(stream) }
        .result()
        .map_err(|e| dev.err("waiting for a profiling graph", e))?;
    for (c, w) in cmds.iter().zip(ev.0.windows(2)) {
        let mut ms = 0.0f32;
        // SAFETY: both events were recorded by the finished graph.
        unsafe { sys::cuEventElapsedTime_v2(&mut ms, w[0], w[1]) }
            .result()
            .map_err(|e| dev.err("reading a profiling event", e))?;
        prof.add(cmd_name(c), f64::from(ms));
    }
    prof.runs += 1;
    Ok(())
}

/// Runs commands one after another.
fn eager(dev: &DeviceShared, stream: sys::CUstream, blas: &Blas, cmds: &[Cmd]) -> Result<()> {
    for c in cmds {
        c.run(dev, stream, blas)?;
    }
    Ok(())
}

/// Captures the commands into a new graph; the stream is left out of capture mode either way.
fn capture(
    dev: &DeviceShared,
    stream: sys::CUstream,
    blas: &Blas,
    cmds: &[Cmd],
) -> std::result::Result<sys::CUgraph, String> {
    // SAFETY: the stream is valid and not being captured.
    unsafe {
        sys::cuStreamBeginCapture_v2(
            stream,
            sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED,
        )
    }
    .result()
    .map_err(describe)?;
    let mut failed = None;
    for c in cmds {
        if let Err(e) = c.run(dev, stream, blas) {
            failed = Some(e.to_string());
            break;
        }
    }
    let mut graph: sys::CUgraph = std::ptr::null_mut();
    // SAFETY: ends the capture begun above; graph is a valid out-pointer.
    let ended = unsafe { sys::cuStreamEndCapture(stream, &mut graph) }.result();
    if let Some(why) = failed {
        if !graph.is_null() {
            // SAFETY: the partial graph is ours.
            unsafe {
                let _ = sys::cuGraphDestroy(graph);
            }
        }
        return Err(why);
    }
    ended.map_err(describe)?;
    if graph.is_null() {
        return Err("the capture gave no graph".into());
    }
    Ok(graph)
}
