//! A loaded model: its file, config, tokenizer, chat template and weights on a device.

use std::path::Path;
use std::sync::Arc;

use tessera_core::gguf::GgufFile;
use tessera_core::{Device, Result};

use crate::chat::ChatTemplate;
use crate::config::ModelConfig;
use crate::forward::{self, StepShape, StepSource};
use crate::kv_cache::KvCache;
use crate::shard::Sharding;
use crate::tokenizer::Tokenizer;
use crate::weights::Weights;

/// A GGUF model on a device.
pub struct Model {
    /// Hyper-parameters and block features.
    pub config: ModelConfig,
    /// The tokenizer built from the file.
    pub tokenizer: Tokenizer,
    /// The chat template from the file (ChatML when it has none).
    pub template: ChatTemplate,
    /// The weights, on the device.
    pub weights: Weights,
    device: Arc<dyn Device>,
    fallback: Arc<dyn Device>,
    file: GgufFile,
    shard: Option<Sharding>,
}

impl Model {
    /// Loads a GGUF file onto `device`; `fallback` (the CPU) runs what the device cannot.
    /// `progress(done, total)` reports bytes of weights placed.
    pub fn load(
        path: impl AsRef<Path>,
        device: Arc<dyn Device>,
        fallback: Arc<dyn Device>,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<Model> {
        let file = GgufFile::open(path)?;
        Model::from_gguf(file, device, fallback, progress)
    }

    /// Builds a model from an opened GGUF file.
    pub fn from_gguf(
        file: GgufFile,
        device: Arc<dyn Device>,
        fallback: Arc<dyn Device>,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<Model> {
        let config = ModelConfig::from_gguf(&file)?;
        let tokenizer = Tokenizer::from_gguf(&file)?;
        let template = ChatTemplate::from_gguf(&file)?;
        let shard = Sharding::new(&config, &file, device.as_ref())?;
        let segments = config.fused_segments();
        let weights =
            Weights::load_with(&file, device.as_ref(), shard.as_ref(), &segments, progress)?;
        check_all_read(&config, &weights, fallback.as_ref())?;
        Ok(Model {
            config,
            tokenizer,
            template,
            weights,
            device,
            fallback,
            file,
            shard,
        })
    }

    /// The device holding the weights.
    pub fn device(&self) -> &Arc<dyn Device> {
        &self.device
    }

    /// The device that runs what the model's device cannot.
    pub fn fallback(&self) -> &Arc<dyn Device> {
        &self.fallback
    }

    /// The GGUF file.
    pub fn file(&self) -> &GgufFile {
        &self.file
    }

    /// How the model is split over the parts of a meta device (None on a plain device).
    pub fn sharding(&self) -> Option<&Sharding> {
        self.shard.as_ref()
    }
}

/// Refuses a model whose file holds a tensor the forward pass does not read: it would be an
/// architecture variant we do not compute (a bias, an extra norm), and the output would be
/// wrong without a word. The graph of a one-token step over a one-cell cache (on the CPU,
/// where it costs nothing) lists what the pass reads.
fn check_all_read(cfg: &ModelConfig, weights: &Weights, cpu: &dyn Device) -> Result<()> {
    let kv = KvCache::new(cfg, cpu, 1, 1, 1, tessera_core::DType::F16, None)?;
    let src = StepSource {
        cfg,
        weights,
        kv: &kv,
        n_ctx: 1,
    };
    let shape = StepShape {
        n_tokens: 1,
        n_kv: 1,
        n_kv_window: usize::from(kv.window_cells().is_some()),
        all_logits: false,
    };
    let (_, _, used) = forward::build(&src, shape)?;
    // LongRoPE reads one of its two factor sets, chosen by the context size.
    let either = ["rope_factors_long.weight", "rope_factors_short.weight"];
    let mut unread: Vec<&str> = weights
        .names()
        .filter(|n| !used.contains(*n) && !either.contains(n))
        .collect();
    if unread.is_empty() {
        return Ok(());
    }
    unread.sort_unstable();
    let more = unread.len().saturating_sub(3);
    let list = unread[..unread.len().min(3)].join(", ");
    Err(tessera_core::Error::Model(format!(
        "the {} file holds tensors this runner does not compute ({list}{}): refusing rather than computing it wrong",
        cfg.arch,
        if more > 0 { format!(" and {more} more") } else { String::new() }
    )))
}
