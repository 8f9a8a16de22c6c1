//! [`CpuBackend`]: runs graph nodes one after another, each op split over a thread pool.

use std::sync::Arc;

use rayon::{ThreadPool, ThreadPoolBuilder};
use tessera_core::graph::Graph;
use tessera_core::{Backend, Error, Result, TensorId};

use crate::ops::{self, Ctx};

/// A CPU stream. Work is done by the time [`Backend::compute`] returns, so
/// [`Backend::synchronize`] has nothing to wait for.
pub struct CpuBackend {
    pool: Arc<ThreadPool>,
    precise: bool,
}

impl CpuBackend {
    /// A backend with `threads` worker threads (0: one per hardware thread); `precise` as in
    /// [`CpuBackend::set_precise`].
    pub fn new(threads: usize, precise: bool) -> Result<Self> {
        Ok(CpuBackend {
            pool: Arc::new(build_pool(threads)?),
            precise,
        })
    }

    /// Changes the number of worker threads (0: one per hardware thread).
    pub fn set_threads(&mut self, threads: usize) -> Result<()> {
        self.pool = Arc::new(build_pool(threads)?);
        Ok(())
    }

    /// The number of worker threads.
    pub fn threads(&self) -> usize {
        self.pool.current_num_threads()
    }

    /// Precise mode: `mul_mat` with quantized weights keeps the activations in f32 and
    /// dequantizes the weights a few rows at a time, instead of quantizing the activations to
    /// the weights' dot-product type (the fast default, as ggml does).
    pub fn set_precise(&mut self, precise: bool) {
        self.precise = precise;
    }

    /// Whether precise mode is on.
    pub fn precise(&self) -> bool {
        self.precise
    }
}

/// A rayon pool of `threads` workers (0: one per hardware thread).
fn build_pool(threads: usize) -> Result<ThreadPool> {
    let n = crate::host::threads_or_all(threads);
    ThreadPoolBuilder::new()
        .num_threads(n)
        .thread_name(|i| format!("tessera-cpu-{i}"))
        .build()
        .map_err(|e| Error::Device {
            device: "cpu".into(),
            reason: format!("cannot start {n} threads: {e}"),
        })
}

impl Backend for CpuBackend {
    fn name(&self) -> String {
        "cpu".into()
    }

    fn compute(&mut self, graph: &Graph, nodes: &[TensorId]) -> Result<()> {
        let ctx = Ctx {
            precise: self.precise,
        };
        self.pool
            .install(|| nodes.iter().try_for_each(|&id| ops::run(&ctx, graph, id)))
    }

    fn synchronize(&mut self) -> Result<()> {
        Ok(())
    }
}
