//! CUDA graphs: replaying a computation instead of launching it again.
//!
//! A graph's command list ([`crate::cmd`]) is compared with the previous one:
//!
//! - the same list (same kernels, launch shapes and arguments, hence the same tensor
//!   addresses) replays the instantiated graph with one `cuGraphLaunch`;
//! - a list of the same launches with other arguments (another KV length, another buffer) is
//!   captured again and the instantiated graph updated in place (`cuGraphExecUpdate`), which is
//!   much cheaper than instantiating; where the update is refused the new graph is instantiated;
//! - a list seen for the first time runs eagerly: capturing only pays when a list comes back,
//!   so the first repeat is captured;
//! - a capture that fails (an operation that cannot be captured) leaves the stream usable and
//!   the list runs eagerly; after [`MAX_FAILURES`] failures graphs are off for the backend.
//!
//! `TESSERA_CUDA_GRAPHS=0` turns graphs off.

use cudarc::driver::sys;
use tessera_core::Result;

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

/// The graph state of one backend.
pub(crate) struct GraphCache {
    enabled: bool,
    failures: u32,
    last: Vec<Cmd>,
    exec: Option<Exec>,
    /// How the last list ran.
    pub mode: GraphMode,
}

impl GraphCache {
    pub(crate) fn new() -> GraphCache {
        let enabled = std::env::var("TESSERA_CUDA_GRAPHS").map(|v| v != "0").unwrap_or(true);
        GraphCache { enabled, failures: 0, last: Vec::new(), exec: None, mode: GraphMode::Eager }
    }

    /// Turns graphs on or off for this backend.
    pub(crate) fn set_enabled(&mut self, on: bool) {
        self.enabled = on;
        if !on {
            self.exec = None;
            self.last.clear();
        }
    }

    /// Commands in the last list run.
    pub(crate) fn last_len(&self) -> usize {
        self.last.len()
    }

    /// Runs a command list on `stream`.
    pub(crate) fn run(&mut self, dev: &DeviceShared, stream: sys::CUstream, blas: &Blas, cmds: Vec<Cmd>) -> Result<()> {
        if !self.enabled || self.failures >= MAX_FAILURES || cmds.is_empty() {
            self.mode = GraphMode::Eager;
            eager(dev, stream, blas, &cmds)?;
            self.last = cmds;
            return Ok(());
        }
        if let Some(ex) = &self.exec {
            if cmds == self.last {
                // SAFETY: the executable graph and the stream are valid.
                unsafe { sys::cuGraphLaunch(ex.exec, stream) }.result().map_err(|e| dev.err("launching a CUDA graph", e))?;
                self.mode = GraphMode::Replayed;
                return Ok(());
            }
        }
        let same_shape = self.last.len() == cmds.len() && self.last.iter().zip(&cmds).all(|(a, b)| a.same_kind(b));
        let seen = cmds == self.last;
        if !(seen || (same_shape && self.exec.is_some())) {
            // New work: run it eagerly and remember it.
            self.exec = None;
            self.mode = GraphMode::Eager;
            eager(dev, stream, blas, &cmds)?;
            self.last = cmds;
            return Ok(());
        }
        let graph = match capture(dev, stream, blas, &cmds) {
            Ok(g) => g,
            Err(why) => {
                self.failures += 1;
                log::debug!("{}: CUDA graph capture failed ({why}); running eagerly", dev.name);
                self.exec = None;
                self.mode = GraphMode::Eager;
                eager(dev, stream, blas, &cmds)?;
                self.last = cmds;
                return Ok(());
            }
        };
        let mut updated = false;
        if let Some(ex) = &mut self.exec {
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
            self.exec = None;
            let mut exec: sys::CUgraphExec = std::ptr::null_mut();
            // SAFETY: graph is valid; exec is a valid out-pointer.
            let r = unsafe { sys::cuGraphInstantiateWithFlags(&mut exec, graph, 0) }.result();
            if let Err(e) = r {
                // SAFETY: the graph is ours and unused.
                unsafe {
                    let _ = sys::cuGraphDestroy(graph);
                }
                self.failures += 1;
                log::debug!("{}: instantiating a CUDA graph failed: {}", dev.name, describe(e));
                self.mode = GraphMode::Eager;
                eager(dev, stream, blas, &cmds)?;
                self.last = cmds;
                return Ok(());
            }
            self.exec = Some(Exec { graph, exec });
        }
        let ex = self.exec.as_ref().map(|e| e.exec).unwrap_or(std::ptr::null_mut());
        // SAFETY: ex is the valid executable graph just made or updated.
        unsafe { sys::cuGraphLaunch(ex, stream) }.result().map_err(|e| dev.err("launching a CUDA graph", e))?;
        self.mode = if updated { GraphMode::Updated } else { GraphMode::Captured };
        self.last = cmds;
        Ok(())
    }
}

/// Runs commands one after another.
fn eager(dev: &DeviceShared, stream: sys::CUstream, blas: &Blas, cmds: &[Cmd]) -> Result<()> {
    for c in cmds {
        c.run(dev, stream, blas)?;
    }
    Ok(())
}

/// Captures the commands into a new graph; the stream is left out of capture mode either way.
fn capture(dev: &DeviceShared, stream: sys::CUstream, blas: &Blas, cmds: &[Cmd]) -> std::result::Result<sys::CUgraph, String> {
    // SAFETY: the stream is valid and not being captured.
    unsafe { sys::cuStreamBeginCapture_v2(stream, sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED) }
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
