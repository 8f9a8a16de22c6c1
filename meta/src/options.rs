//! [`MetaOptions`]: how a meta device runs, given when it is made.

use tessera_core::options::{env_switch, env_word};
use tessera_core::Result;

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

/// A meta device's settings. `Default` is the tuned default; [`MetaOptions::from_env`] reads
/// the crate's environment variables.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MetaOptions {
    /// What carries the all-reduces.
    pub all_reduce: AllReducePath,
    /// Whether each backend times the host's share of every run (planning, uploads,
    /// submission, gathering) and logs the medians at info level when it is dropped.
    pub profile: bool,
}

impl MetaOptions {
    /// The defaults overridden by the environment:
    ///
    /// - `TESSERA_ALLREDUCE`: `host` for [`AllReducePath::Host`]; `auto`, `peer` or `nccl` for
    ///   [`AllReducePath::Auto`] (the variable is shared with the CUDA backend, which reads
    ///   `peer` and `nccl` as a choice among its own carriers);
    /// - `TESSERA_META_PROFILE`: a switch (0, 1, false, true) for [`MetaOptions::profile`].
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

    /// The same options with host-side profiling on or off.
    pub fn with_profile(mut self, profile: bool) -> MetaOptions {
        self.profile = profile;
        self
    }
}
