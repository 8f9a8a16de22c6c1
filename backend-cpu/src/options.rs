//! [`CpuOptions`]: how the CPU backend runs, given when its device is made.

use tessera_core::options::env_value;
use tessera_core::Result;

/// The CPU backend's settings. `Default` is the tuned default (one thread per hardware thread,
/// activation-quantizing `mul_mat`); [`CpuOptions::from_env`] reads the crate's environment
/// variable.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CpuOptions {
    /// Worker threads of each backend; 0: one per hardware thread.
    pub threads: usize,
    /// Precise `mul_mat`: quantized weights times f32 activations, dequantized a few rows at a
    /// time, instead of quantizing the activations to the weights' dot-product type as ggml
    /// does. Slower; for checking.
    pub precise: bool,
}

impl CpuOptions {
    /// The defaults overridden by `TESSERA_CPU_THREADS` (a number of threads; 0 for one per
    /// hardware thread). Any other value is an error that names the variable.
    pub fn from_env() -> Result<CpuOptions> {
        let mut o = CpuOptions::default();
        if let Some(n) = env_value("TESSERA_CPU_THREADS", "a number of threads")? {
            o.threads = n;
        }
        Ok(o)
    }

    /// The same options with `n` threads per backend (0: one per hardware thread).
    pub fn with_threads(mut self, n: usize) -> CpuOptions {
        self.threads = n;
        self
    }

    /// The same options with precise `mul_mat` on or off.
    pub fn with_precise(mut self, precise: bool) -> CpuOptions {
        self.precise = precise;
        self
    }
}
