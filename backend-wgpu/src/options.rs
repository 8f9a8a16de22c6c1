//! [`WgpuOptions`]: the wgpu backend's settings, given to [`crate::WgpuBackendReg::with_options`]
//! and kept by every device it lists (and so by their buffers and backends). Two registries with
//! different options open their adapters separately and run side by side in one process.
//!
//! [`WgpuOptions::from_env`] reads the backend's four environment variables, and nothing else in
//! the crate reads the environment (wgpu's own `WGPU_*` variables, which choose adapters and
//! backends, are read by wgpu's `InstanceDescriptor::with_env`):
//!
//! | variable                  | field                          | default |
//! |---------------------------|--------------------------------|---------|
//! | `TESSERA_WGPU_COOP`       | [`WgpuOptions::coop`]          | 1       |
//! | `TESSERA_WGPU_SUBGROUPS`  | [`WgpuOptions::subgroups`]     | 1       |
//! | `TESSERA_WGPU_FUSION`     | [`WgpuOptions::fusion`]        | 1       |
//! | `TESSERA_WGPU_PROFILE`    | [`WgpuOptions::profile`]       | 0       |
//!
//! Each is a switch: `0`, `1`, `false` or `true`; anything else is an error naming the
//! variable.

use tessera_core::options::env_switch;
use tessera_core::Result;

/// The wgpu backend's settings (`Default`: the tuned defaults; builder-style setters).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WgpuOptions {
    /// Whether the f16 prompt mat-mat and the prompt attention run on cooperative matrices
    /// where the adapter offers them (16 x 16 x 16 f16 products summed in f32, subgroups of
    /// 32). Off keeps the f16 tiled mat-mat and the one-key-per-invocation attention, for
    /// adapters whose cooperative matrices are slower or broken.
    pub coop: bool,
    /// Whether shaders use subgroup operations where the adapter has SUBGROUP. Off runs every
    /// reduction through workgroup memory (the fallback for adapters without subgroups, and
    /// how it is tested on one that has them).
    pub subgroups: bool,
    /// Whether a backend's op sequences run fused (the `fused` module), to start with
    /// ([`crate::WgpuBackend::set_fusion`] changes it per backend). Off runs every op as its
    /// own dispatch, for comparing against the fused dispatches.
    pub fusion: bool,
    /// Whether a backend times every dispatch by shader variant, to start with
    /// ([`crate::WgpuBackend::set_profile`]; see the `profile` module).
    pub profile: bool,
    /// Whether the tiled mat-mat computes f16 and quantized weights in f16 (where the adapter
    /// has SHADER_F16): `None` (the default) on every adapter but a software rasterizer
    /// (lavapipe keeps the exact f32 path); `Some(on)` forces it, for testing either path on
    /// any adapter. Its results differ from the f32 product by about 1e-6 NMSE (activations
    /// rounded to f16, partial sums over 16 k-steps in f16), within the ops conformance
    /// tolerance (5e-4).
    pub mat_mat_f16: Option<bool>,
    /// At most this many bytes of device memory: the device reports no more (its free memory
    /// is this less what tessera has allocated on it) and refuses to allocate past it, as a
    /// smaller GPU would. `None`: the adapter's memory. For testing what does not fit (a model
    /// larger than the GPU, left partly to the CPU) on any adapter.
    pub memory_limit: Option<usize>,
    /// Whether a wait for a staged read (a host all-reduce's) polls the device in a loop
    /// instead of blocking in the driver's wait: no sleep and wake-up between the copy's end
    /// and the host's return, at the cost of a busy host thread while it waits.
    pub spin_wait: bool,
    /// The most columns of dst one workgroup of the integer-dot mat-vec computes (it takes 8, 4
    /// or 2, not above this; see `mvq_cols` in ops/matmul.rs): each part of the weights it reads
    /// is unpacked once and multiplied with all of them. 1 (or 0) gives each column workgroups
    /// of its own (the columns of a row block neighbours, so that the later ones read its
    /// weights from the cache).
    pub mat_vec_cols: u32,
    /// Columns up to which a mul_mat by weights the integer-dot mat-vec reads (Q4_0, Q4_1,
    /// Q8_0, Q4_K, Q6_K) runs as that mat-vec; past it, the tiled mat-mat.
    pub mat_vec_n: usize,
    /// Whether the integer-dot mat-vec of 2 or more columns has them quantized once, by a
    /// dispatch of their own (with the rms_norm that feeds them, once for all the mat-vecs
    /// that read one normalized column), and reads them pre-quantized, up to 16 columns a
    /// workgroup (PQ in `shaders/mat_vec_q.wgsl`). Off: every workgroup quantizes (and
    /// normalizes) its columns itself, a workgroup taking [`WgpuOptions::mat_vec_cols`] of
    /// them from 8 columns and one below (the route before, kept for an A/B).
    pub mat_vec_quantize_once: bool,
}

impl Default for WgpuOptions {
    fn default() -> Self {
        WgpuOptions {
            coop: true,
            subgroups: true,
            fusion: true,
            profile: false,
            mat_mat_f16: None,
            memory_limit: None,
            spin_wait: false,
            mat_vec_cols: 8,
            mat_vec_n: 16,
            mat_vec_quantize_once: true,
        }
    }
}

impl WgpuOptions {
    /// The defaults, changed by the variables of the module's table that are set; an error
    /// names a variable whose value is not a switch.
    pub fn from_env() -> Result<Self> {
        let d = WgpuOptions::default();
        Ok(WgpuOptions {
            coop: env_switch("TESSERA_WGPU_COOP")?.unwrap_or(d.coop),
            subgroups: env_switch("TESSERA_WGPU_SUBGROUPS")?.unwrap_or(d.subgroups),
            fusion: env_switch("TESSERA_WGPU_FUSION")?.unwrap_or(d.fusion),
            profile: env_switch("TESSERA_WGPU_PROFILE")?.unwrap_or(d.profile),
            mat_mat_f16: d.mat_mat_f16,
            memory_limit: d.memory_limit,
            spin_wait: d.spin_wait,
            mat_vec_cols: d.mat_vec_cols,
            mat_vec_n: d.mat_vec_n,
            mat_vec_quantize_once: d.mat_vec_quantize_once,
        })
    }

    /// Sets [`WgpuOptions::coop`].
    pub fn coop(mut self, on: bool) -> Self {
        self.coop = on;
        self
    }

    /// Sets [`WgpuOptions::subgroups`].
    pub fn subgroups(mut self, on: bool) -> Self {
        self.subgroups = on;
        self
    }

    /// Sets [`WgpuOptions::fusion`].
    pub fn fusion(mut self, on: bool) -> Self {
        self.fusion = on;
        self
    }

    /// Sets [`WgpuOptions::profile`].
    pub fn profile(mut self, on: bool) -> Self {
        self.profile = on;
        self
    }

    /// Sets [`WgpuOptions::memory_limit`].
    pub fn memory_limit(mut self, bytes: Option<usize>) -> Self {
        self.memory_limit = bytes;
        self
    }

    /// Sets [`WgpuOptions::spin_wait`].
    pub fn spin_wait(mut self, on: bool) -> Self {
        self.spin_wait = on;
        self
    }

    /// Sets [`WgpuOptions::mat_vec_cols`].
    pub fn mat_vec_cols(mut self, most: u32) -> Self {
        self.mat_vec_cols = most;
        self
    }

    /// Sets [`WgpuOptions::mat_vec_n`].
    pub fn mat_vec_n(mut self, n: usize) -> Self {
        self.mat_vec_n = n;
        self
    }

    /// Sets [`WgpuOptions::mat_vec_quantize_once`].
    pub fn mat_vec_quantize_once(mut self, on: bool) -> Self {
        self.mat_vec_quantize_once = on;
        self
    }

    /// Sets [`WgpuOptions::mat_mat_f16`].
    pub fn mat_mat_f16(mut self, on: Option<bool>) -> Self {
        self.mat_mat_f16 = on;
        self
    }
}

#[cfg(test)]
mod tests {
    use super::WgpuOptions;

    /// The variables are switches: unset keeps the default, 0 turns one off (in particular
    /// TESSERA_WGPU_SUBGROUPS=0 turns subgroups off, and nothing else does), and a value that
    /// is not a switch is an error naming its variable. (The crate's other unit tests do not
    /// read the environment.)
    #[test]
    fn from_env_reads_switches_and_refuses_the_rest() {
        std::env::remove_var("TESSERA_WGPU_COOP");
        std::env::remove_var("TESSERA_WGPU_FUSION");
        std::env::remove_var("TESSERA_WGPU_PROFILE");
        std::env::set_var("TESSERA_WGPU_SUBGROUPS", "0");
        let o = WgpuOptions::from_env().unwrap();
        assert_eq!(o, WgpuOptions::default().subgroups(false));
        std::env::set_var("TESSERA_WGPU_SUBGROUPS", "true");
        assert_eq!(WgpuOptions::from_env().unwrap(), WgpuOptions::default());
        std::env::set_var("TESSERA_WGPU_SUBGROUPS", "off");
        let e = WgpuOptions::from_env().unwrap_err().to_string();
        assert!(e.contains("TESSERA_WGPU_SUBGROUPS"), "{e}");
        std::env::remove_var("TESSERA_WGPU_SUBGROUPS");
    }
}
