//! A loaded model: its file, config, tokenizer, chat template and weights on a device.

use std::path::Path;
use std::sync::Arc;

use tessera_core::gguf::GgufFile;
use tessera_core::{Device, Result};

use crate::chat::ChatTemplate;
use crate::config::LlamaConfig;
use crate::shard::Sharding;
use crate::tokenizer::Tokenizer;
use crate::weights::Weights;

/// A Llama-family GGUF model on a device.
pub struct Model {
    /// Hyper-parameters.
    pub config: LlamaConfig,
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
        let config = LlamaConfig::from_gguf(&file)?;
        let tokenizer = Tokenizer::from_gguf(&file)?;
        let template = ChatTemplate::from_gguf(&file)?;
        let shard = Sharding::new(&config, &file, device.as_ref())?;
        let weights = Weights::load_with(&file, device.as_ref(), shard.as_ref(), progress)?;
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
