//! [`CudaOptions`]: how the CUDA backend is configured, given to [`crate::CudaBackendReg`] and
//! handed down to every device and stream made from it.
//!
//! `Default` is the tuned default; [`CudaOptions::from_env`] reads the crate's documented
//! environment variables (the only place this crate reads the environment):
//!
//! | variable | field | values |
//! |---|---|---|
//! | `TESSERA_CUDA_GRAPHS` | [`CudaOptions::graphs`] | switch, default on |
//! | `TESSERA_CUDA_FUSION` | [`CudaOptions::fusion`] | switch, default on |
//! | `TESSERA_CUDA_PROFILE` | [`CudaOptions::profile`] | switch, default off |
//! | `TESSERA_KERNEL_CACHE` | [`CudaOptions::kernel_cache`] | a directory |
//! | `TESSERA_ALLREDUCE` | [`CudaOptions::all_reduce`] | `auto`, `peer`, `nccl` or `host` |
//!
//! The other fields (TF32, the f16 all-reduce wire, the peer scratch size, the multi-GPU group,
//! the kernel of quantized products of a few columns) are set in code: by the facade, the CLI or
//! a test.

use std::path::PathBuf;

use tessera_core::options::{env_path, env_switch, env_word};
use tessera_core::Result;

/// Which carriers sum the partial results of a group of GPUs (`TESSERA_ALLREDUCE`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum AllReduce {
    /// The peer kernel inside the CUDA graphs, NCCL between graph stages (the default).
    #[default]
    Auto,
    /// The peer kernel only.
    Peer,
    /// NCCL only: no all-reduce inside the graphs.
    Nccl,
    /// No CUDA communicator: the meta layer's generic path through host memory.
    Host,
}

/// The words of `TESSERA_ALLREDUCE`.
const ALL_REDUCE_WORDS: [(&str, AllReduce); 4] = [
    ("auto", AllReduce::Auto),
    ("peer", AllReduce::Peer),
    ("nccl", AllReduce::Nccl),
    ("host", AllReduce::Host),
];

/// Which kernels multiply quantized weights by 2 to 32 columns (a few sequences decoded
/// together), where the weights' type has the direct kernel (`mmt` in kernels/mmvq.cu: Q4_0,
/// Q8_0, Q4_K, Q5_K, Q6_K) and the GPU int8 tensor cores (sm_80 and later).
///
/// The default stays the staged route, whose speed and results have been measured on the
/// GPU; the direct kernels become the default once `backend-cuda/tests/mmt.rs` and the
/// conformance suite have passed on a GPU with them and `bench mat_vec_batch` shows them
/// faster (see NOTES.md).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum FewColumns {
    /// The direct tensor-core kernel, a warp per 16 rows holding 3 stages of them in flight.
    Direct16,
    /// The direct tensor-core kernel, a warp per 32 rows holding 2 stages in flight (half the
    /// reads of the columns, fewer warps).
    Direct32,
    /// The mat-vec kernels up to 8 columns, the staged tensor-core mat-mat from 9 (the
    /// default).
    #[default]
    Staged,
}

/// Default peer scratch per rank: the largest f32 tensor, in MiB, that one peer all-reduce sums
/// (each GPU holds twice that per rank).
const DEFAULT_PEER_MIB: usize = 32;

/// The CUDA backend's settings (see the module docs).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CudaOptions {
    pub(crate) graphs: bool,
    pub(crate) fusion: bool,
    pub(crate) tf32: bool,
    pub(crate) profile: bool,
    pub(crate) kernel_cache: Option<PathBuf>,
    pub(crate) all_reduce: AllReduce,
    pub(crate) peer_f16: bool,
    pub(crate) peer_mib: usize,
    pub(crate) grouped: bool,
    pub(crate) few_columns: FewColumns,
}

impl Default for CudaOptions {
    fn default() -> Self {
        CudaOptions {
            graphs: true,
            fusion: true,
            tf32: false,
            profile: false,
            kernel_cache: None,
            all_reduce: AllReduce::Auto,
            peer_f16: false,
            peer_mib: DEFAULT_PEER_MIB,
            grouped: false,
            few_columns: FewColumns::default(),
        }
    }
}

impl CudaOptions {
    /// The defaults with the crate's environment variables applied (see the module docs); an
    /// error names a variable whose value is not what it should be.
    pub fn from_env() -> Result<Self> {
        let d = CudaOptions::default();
        Ok(CudaOptions {
            graphs: env_switch("TESSERA_CUDA_GRAPHS")?.unwrap_or(d.graphs),
            fusion: env_switch("TESSERA_CUDA_FUSION")?.unwrap_or(d.fusion),
            profile: env_switch("TESSERA_CUDA_PROFILE")?.unwrap_or(d.profile),
            kernel_cache: env_path("TESSERA_KERNEL_CACHE"),
            all_reduce: env_word("TESSERA_ALLREDUCE", &ALL_REDUCE_WORDS)?.unwrap_or(d.all_reduce),
            ..d
        })
    }

    /// Repeated computations are captured into CUDA graphs and replayed (on by default; off:
    /// every command is launched each time, for checking).
    pub fn graphs(mut self, on: bool) -> Self {
        self.graphs = on;
        self
    }

    /// Fused kernels replace common op sequences (on by default; off: every op on its own, for
    /// checking the fused kernels against).
    pub fn fusion(mut self, on: bool) -> Self {
        self.fusion = on;
        self
    }

    /// F32 matrix products may use TF32 tensor cores (off by default: faster, ~10 mantissa
    /// bits).
    pub fn tf32(mut self, on: bool) -> Self {
        self.tf32 = on;
        self
    }

    /// Every command inside a captured graph is timed, and the GPU time per kernel name is
    /// logged at debug level when the stream is dropped (off by default: profiled runs
    /// instantiate a fresh graph every time, slow on the host).
    pub fn profile(mut self, on: bool) -> Self {
        self.profile = on;
        self
    }

    /// Where compiled kernels are cached (by default `$XDG_CACHE_HOME/tessera/kernels`, else
    /// `~/.cache/tessera/kernels`).
    pub fn kernel_cache(mut self, dir: impl Into<PathBuf>) -> Self {
        self.kernel_cache = Some(dir.into());
        self
    }

    /// Which carriers a group of these GPUs sums through ([`AllReduce`]).
    pub fn all_reduce(mut self, path: AllReduce) -> Self {
        self.all_reduce = path;
        self
    }

    /// The peer all-reduce of tensors past the small-tensor kernel sends f16 values: half the
    /// bytes over the link (faster prompts on two GPUs), each rank's values rounded to f16
    /// before the f32 sum (off by default, since it changes results).
    pub fn peer_f16(mut self, on: bool) -> Self {
        self.peer_f16 = on;
        self
    }

    /// The largest tensor, in MiB of f32 values, that one peer all-reduce sums (1 to 4096;
    /// 32 by default); larger ones go through NCCL. Each GPU holds twice that per rank.
    pub fn peer_mib(mut self, mib: usize) -> Self {
        self.peer_mib = mib.clamp(1, 4096);
        self
    }

    /// The devices are parts of a multi-GPU group (a meta device of several parts), which run
    /// one graph together and wait on each other: kernels then do not release their
    /// successors early (see the `driver` module docs). The facade sets it for the CUDA parts of
    /// a meta device of several parts.
    pub fn grouped(mut self, on: bool) -> Self {
        self.grouped = on;
        self
    }

    /// Which kernels multiply quantized weights by 2 to 32 columns ([`FewColumns`]).
    pub fn few_columns(mut self, kernels: FewColumns) -> Self {
        self.few_columns = kernels;
        self
    }

    /// The directory compiled kernels are cached in, if one can be named.
    pub(crate) fn cache_dir(&self) -> Option<PathBuf> {
        if let Some(d) = &self.kernel_cache {
            return Some(d.clone());
        }
        if let Some(d) = env_path("XDG_CACHE_HOME") {
            return Some(d.join("tessera").join("kernels"));
        }
        env_path("HOME").map(|h| h.join(".cache").join("tessera").join("kernels"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn all_reduce_words_parse_in_any_case() {
        let p = |v| tessera_core::options::parse_word("TESSERA_ALLREDUCE", v, &ALL_REDUCE_WORDS);
        assert_eq!(p(" NCCL ").unwrap(), AllReduce::Nccl);
        assert_eq!(p("host").unwrap(), AllReduce::Host);
        let e = p("hots").unwrap_err().to_string();
        assert!(
            e.contains("TESSERA_ALLREDUCE") && e.contains("auto, peer, nccl, host"),
            "{e}"
        );
    }

    #[test]
    fn setters_change_one_field() {
        let o = CudaOptions::default()
            .fusion(false)
            .peer_mib(0)
            .grouped(true);
        assert!(!o.fusion && o.graphs && o.grouped);
        assert_eq!(o.peer_mib, 1);
    }
}
