//! [`MetaOptions`]: how a meta device runs, given when it is made.

use tessera_core::options::{env_switch, env_word};
use tessera_core::{Error, Result};

/// What carries a meta device's all-reduces.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum AllReducePath {
    /// A backend communicator where every part comes from one backend that offers one (NCCL
    /// and peer copies for CUDA), else the generic path staged through host memory.
    #[default]
    Auto,
    /// Always the generic host-staged path, even where a backend communicator exists: the
    /// baseline a communicator is measured against.
    Host,
}

/// How a model runner divides a model over the parts of a meta device.
///
/// The meta device itself runs whatever graph it is given as tensor parallelism (the weights'
/// registered states decide the split); the split mode is the runner's choice of which
/// weights to register where. `Layer` gives each part whole layers instead, run one part after
/// the other by core's scheduler (see the `layers` module).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SplitMode {
    /// Every layer's weights split over all parts, partial sums all-reduced twice a layer: pays
    /// off on like devices with fast peer links.
    Tensor,
    /// Each part holds a contiguous range of whole layers with their KV cache; the activations
    /// cross once per boundary: for unlike devices, slow links and models larger than one
    /// device.
    Layer,
    /// `Tensor` for like devices that reach each other's memory (CPUs, GPUs of one backend and
    /// model with a communicator), `Layer` otherwise (and for a part that is itself a meta
    /// device).
    #[default]
    Auto,
}

impl SplitMode {
    /// Parses `tensor`, `layer` or `auto`.
    pub fn parse(s: &str) -> Result<SplitMode> {
        match s.trim().to_ascii_lowercase().as_str() {
            "tensor" => Ok(SplitMode::Tensor),
            "layer" => Ok(SplitMode::Layer),
            "auto" | "" => Ok(SplitMode::Auto),
            other => Err(Error::Invalid(format!(
                "split mode '{other}' is not tensor, layer or auto"
            ))),
        }
    }

    /// The mode's name as `parse` reads it.
    pub fn name(self) -> &'static str {
        match self {
            SplitMode::Tensor => "tensor",
            SplitMode::Layer => "layer",
            SplitMode::Auto => "auto",
        }
    }
}

/// A meta device's settings. `Default` is the tuned default; [`MetaOptions::from_env`] reads
/// the crate's environment variables.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MetaOptions {
    /// What carries the all-reduces.
    pub all_reduce: AllReducePath,
    /// Whether each backend times the host's share of every run (planning, uploads,
    /// submission, gathering) and logs the medians at info level when it is dropped.
    pub profile: bool,
    /// How a model runner divides a model over the parts.
    pub split_mode: SplitMode,
}

impl MetaOptions {
    /// The defaults overridden by the environment:
    ///
    /// - `TESSERA_ALLREDUCE`: `host` for [`AllReducePath::Host`]; `auto`, `peer` or `nccl` for
    ///   [`AllReducePath::Auto`] (the variable is shared with the CUDA backend, which reads
    ///   `peer` and `nccl` as a choice among its own carriers);
    /// - `TESSERA_META_PROFILE`: a switch (0, 1, false, true) for [`MetaOptions::profile`];
    ///
    /// Any other value is an error that names the variable.
    pub fn from_env() -> Result<MetaOptions> {
        let mut o = MetaOptions::default();
        let paths = [
            ("auto", AllReducePath::Auto),
            ("peer", AllReducePath::Auto),
            ("nccl", AllReducePath::Auto),
            ("host", AllReducePath::Host),
        ];
        if let Some(p) = env_word("TESSERA_ALLREDUCE", &paths)? {
            o.all_reduce = p;
        }
        if let Some(p) = env_switch("TESSERA_META_PROFILE")? {
            o.profile = p;
        }
        Ok(o)
    }

    /// The same options with all-reduces carried by `path`.
    pub fn with_all_reduce(mut self, path: AllReducePath) -> MetaOptions {
        self.all_reduce = path;
        self
    }

    /// The same options with models divided by `mode`.
    pub fn with_split_mode(mut self, mode: SplitMode) -> MetaOptions {
        self.split_mode = mode;
        self
    }

    /// The same options with host-side profiling on or off.
    pub fn with_profile(mut self, profile: bool) -> MetaOptions {
        self.profile = profile;
        self
    }
}
