//! One conformance case: an op with its types and shapes, how to build its graph, and how close
//! a device's output must come to the reference's.

use std::collections::HashMap;
use std::fmt;
use std::ops::{Deref, DerefMut};
use std::sync::Arc;

use tessera_core::{DType, Graph, Result, TensorId};

use crate::init::Init;

/// How close the output of the device under test must be to the reference's.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Tolerance {
    /// Normalised mean squared error `sum((ref - out)^2) / sum(ref^2)` at most this.
    Nmse(f64),
    /// Every value equal (integer results, same-type copies).
    Exact,
    /// Results quantized into a block type: NMSE at most `nmse`, and no value further than
    /// `max_abs` from the reference's (see [`Tolerance::quantized`]).
    Quantized {
        /// The largest NMSE allowed.
        nmse: f64,
        /// The largest difference of one value.
        max_abs: f64,
    },
}

impl Tolerance {
    /// ggml's default threshold.
    pub const DEFAULT: Tolerance = Tolerance::Nmse(1e-7);
    /// mul_mat and flash_attn_ext.
    pub const MATMUL: Tolerance = Tolerance::Nmse(5e-4);
    /// soft_max.
    pub const SOFT_MAX: Tolerance = Tolerance::Nmse(1e-6);

    /// The largest NMSE allowed (0 for [`Tolerance::Exact`]).
    pub fn threshold(self) -> f64 {
        match self {
            Tolerance::Nmse(t) | Tolerance::Quantized { nmse: t, .. } => t,
            Tolerance::Exact => 0.0,
        }
    }

    /// The tolerance for results quantized into `dtype` from `n` values uniform in [-1, 1]
    /// (compared after dequantizing both).
    ///
    /// Two correct quantizers can disagree where a value sits on a rounding tie or where a
    /// float comparison in a scale search goes the other way (fused multiply-adds, a reciprocal
    /// instead of a division): ggml's estimate of "one value off by one step" fails a GPU for
    /// two such ties. So the simple block types allow four values one step off, and the K types,
    /// whose super-block scale search may settle on another, equally good, scale for a whole
    /// sub-block, allow an eighth of the type's own quantization noise (`step^2 / 4` in NMSE
    /// for uniform inputs), at most 2e-4. Either way no single value may be more than one and a half steps
    /// from the reference's: two good quantizations of one input are each within a step of it,
    /// while a wrong layout, scale or packing moves a value by several steps.
    pub fn quantized(dtype: DType, n: usize) -> Tolerance {
        let bits = match dtype {
            DType::Q2_K => 2.0,
            DType::Q3_K => 3.0,
            DType::Q4_0 | DType::Q4_1 | DType::Q4_K => 4.0,
            DType::Q5_0 | DType::Q5_1 | DType::Q5_K => 5.0,
            DType::Q6_K => 6.0,
            DType::Q8_0 | DType::Q8_1 | DType::Q8_K => 8.0,
            _ => return Tolerance::Nmse(1e-6),
        };
        let step: f64 = 2.0 / f64::powf(2.0, bits);
        let one_step = step * step / (0.25 * n.max(1) as f64);
        let k_type = matches!(
            dtype,
            DType::Q2_K | DType::Q3_K | DType::Q4_K | DType::Q5_K | DType::Q6_K | DType::Q8_K
        );
        // (capped at 2e-4: for the coarsest types an eighth of the noise would hide a whole
        // sub-block with a wrong scale)
        let nmse = if k_type {
            (step * step / 4.0 / 8.0).min(2e-4).max(one_step)
        } else {
            4.0 * one_step
        };
        Tolerance::Quantized {
            nmse,
            max_abs: 1.5 * step,
        }
    }
}

/// A graph under construction for a case, with how each leaf is to be filled.
pub struct CaseGraph {
    graph: Graph,
    inits: HashMap<TensorId, Init>,
}

impl Default for CaseGraph {
    fn default() -> Self {
        Self::new()
    }
}

impl CaseGraph {
    /// An empty graph.
    pub fn new() -> Self {
        CaseGraph {
            graph: Graph::new(),
            inits: HashMap::new(),
        }
    }

    /// A leaf of uniform values in [-1, 1).
    pub fn leaf(&mut self, dtype: DType, ne: &[usize]) -> Result<TensorId> {
        self.input(dtype, ne, Init::Uniform(-1.0, 1.0))
    }

    /// A leaf filled by `init`.
    pub fn input(&mut self, dtype: DType, ne: &[usize], init: Init) -> Result<TensorId> {
        let id = self.graph.new_tensor(dtype, ne)?;
        self.inits.insert(id, init);
        Ok(id)
    }

    /// How leaf `id` is filled (uniform in [-1, 1) unless the case said otherwise).
    pub fn init(&self, id: TensorId) -> Init {
        self.inits
            .get(&id)
            .copied()
            .unwrap_or(Init::Uniform(-1.0, 1.0))
    }

    /// The finished graph.
    pub fn into_graph(self) -> Graph {
        self.graph
    }
}

impl Deref for CaseGraph {
    type Target = Graph;
    fn deref(&self) -> &Graph {
        &self.graph
    }
}

impl DerefMut for CaseGraph {
    fn deref_mut(&mut self) -> &mut Graph {
        &mut self.graph
    }
}

/// Builds a case's graph and returns the tensor whose memory is compared.
pub type BuildFn = dyn Fn(&mut CaseGraph) -> Result<TensorId> + Send + Sync;

/// One case of the table.
#[derive(Clone)]
pub struct Case {
    op: &'static str,
    params: String,
    types: Vec<DType>,
    large: bool,
    tolerance: Tolerance,
    flops: f64,
    build: Arc<BuildFn>,
}

impl Case {
    /// A case of op `op` (ggml's upper-case name) with its parameters written `k=v,k=v`, the
    /// types it involves (for filters), its tolerance and its graph builder.
    pub fn new(
        op: &'static str,
        params: impl Into<String>,
        types: &[DType],
        tolerance: Tolerance,
        build: impl Fn(&mut CaseGraph) -> Result<TensorId> + Send + Sync + 'static,
    ) -> Case {
        Case {
            op,
            params: params.into(),
            types: types.to_vec(),
            large: false,
            tolerance,
            flops: 0.0,
            build: Arc::new(build),
        }
    }

    /// Marks the case as large (slow devices may skip it).
    pub fn large(mut self) -> Case {
        self.large = true;
        self
    }

    /// Sets the floating-point operations of one run (for perf mode's GFLOP/s).
    pub fn with_flops(mut self, flops: f64) -> Case {
        self.flops = flops;
        self
    }

    /// ggml-style name: `OP(k=v,...)`.
    pub fn name(&self) -> String {
        format!("{}({})", self.op, self.params)
    }

    /// The op's upper-case name.
    pub fn op(&self) -> &'static str {
        self.op
    }

    /// The types the case involves.
    pub fn types(&self) -> &[DType] {
        &self.types
    }

    /// Whether the case is one of the few big ones that slow devices may skip.
    pub fn is_large(&self) -> bool {
        self.large
    }

    /// How close the output must be.
    pub fn tolerance(&self) -> Tolerance {
        self.tolerance
    }

    /// Floating-point operations of one run, where they are the natural measure (0 otherwise).
    pub fn flops(&self) -> f64 {
        self.flops
    }

    /// Builds the case's graph; returns it with the tensor to compare.
    pub fn build(&self) -> Result<(CaseGraph, TensorId)> {
        let mut g = CaseGraph::new();
        let out = (self.build)(&mut g)?;
        Ok((g, out))
    }
}

impl fmt::Debug for Case {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name())
    }
}
