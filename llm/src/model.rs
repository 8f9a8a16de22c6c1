//! A loaded model: its file, config, tokenizer, chat template and weights on a device.

use std::path::Path;
use std::sync::Arc;

use tessera::meta::{LayerShares, MetaDevice, SplitMode};
use tessera_core::gguf::GgufFile;
use tessera_core::{Device, DeviceKind, Error, Result};

use crate::chat::ChatTemplate;
use crate::config::ModelConfig;
use crate::context::{ContextParams, KV_PAD};
use crate::forward::{self, StepShape, StepSource};
use crate::kv_cache::KvCache;
use crate::shard::{planned_ctx, LayerSplit, Sharding};
use crate::tokenizer::Tokenizer;
use crate::weights::Weights;

/// The default of [`LoadParams::op_offload`]: llama.cpp's batch size from which a GPU
/// computes the mat-muls of layers left in host memory.
pub const OP_OFFLOAD_BATCH: usize = 32;

/// How a model is placed when it is loaded.
#[derive(Clone, Debug)]
pub struct LoadParams {
    /// Layers on the GPU (llama.cpp's `-ngl`): on a GPU, this many layers there and the rest on
    /// the CPU; on a meta device split by layers, this many on its parts that are not the CPU
    /// and the rest on its CPU parts (the fallback CPU joins when it has none). More than the
    /// model has means all of them. `None`: as many as fit, the rest on the CPU.
    pub gpu_layers: Option<usize>,
    /// Op offload of a layer split with CPU layers: a step of at least this many tokens
    /// computes the CPU layers' mat-muls on the split's first GPU part, each weight uploaded
    /// for the step (into scratch memory reserved on that part), the rest of those layers
    /// (attention over their KV cache, norms, residual adds) on the CPU. Decode steps, below
    /// it, run as without it. 0: off. Default [`OP_OFFLOAD_BATCH`].
    pub op_offload: usize,
    /// The context the memory is planned for (its size, batch and KV cache type): a layer
    /// split leaves room on each part for its layers' KV cache and the compute buffers.
    pub context: ContextParams,
}

impl Default for LoadParams {
    fn default() -> Self {
        LoadParams {
            gpu_layers: None,
            op_offload: OP_OFFLOAD_BATCH,
            context: ContextParams::default(),
        }
    }
}

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
    layers: Option<LayerSplit>,
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
        Model::load_with(path, device, fallback, &LoadParams::default(), progress)
    }

    /// As [`Model::load`], placed as `params` say.
    pub fn load_with(
        path: impl AsRef<Path>,
        device: Arc<dyn Device>,
        fallback: Arc<dyn Device>,
        params: &LoadParams,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<Model> {
        let file = GgufFile::open(path)?;
        Model::from_gguf_with(file, device, fallback, params, progress)
    }

    /// Builds a model from an opened GGUF file.
    pub fn from_gguf(
        file: GgufFile,
        device: Arc<dyn Device>,
        fallback: Arc<dyn Device>,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<Model> {
        Model::from_gguf_with(file, device, fallback, &LoadParams::default(), progress)
    }

    /// As [`Model::from_gguf`], placed as `params` say.
    pub fn from_gguf_with(
        file: GgufFile,
        device: Arc<dyn Device>,
        fallback: Arc<dyn Device>,
        params: &LoadParams,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<Model> {
        let config = ModelConfig::from_gguf(&file)?;
        let tokenizer = Tokenizer::from_gguf(&file)?;
        let template = ChatTemplate::from_gguf(&file)?;
        let segments = config.fused_segments();
        let layers = layer_split(&config, &file, &device, &fallback, params)?;
        let (shard, weights) = match &layers {
            Some(split) => (
                None,
                Weights::load_split(&file, split, &segments, progress)?,
            ),
            None => {
                let shard = Sharding::new(&config, &file, device.as_ref())?;
                let w = Weights::load_with(
                    &file,
                    device.as_ref(),
                    shard.as_ref(),
                    &segments,
                    progress,
                )?;
                (shard, w)
            }
        };
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
            layers,
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

    /// How the model is split over the parts of a meta device as tensor parallelism (None on
    /// a plain device and in a layer split).
    pub fn sharding(&self) -> Option<&Sharding> {
        self.shard.as_ref()
    }

    /// How the model is divided by layers (a meta device in [`SplitMode::Layer`], or a GPU
    /// with layers left to the CPU), if it is.
    pub fn layer_split(&self) -> Option<&LayerSplit> {
        self.layers.as_ref()
    }
}

/// The layer split of model `cfg` on `device` as `params` ask, if it is to be split by layers:
/// a meta device in layer mode (its given ratios, or the fastest parts filled first, or
/// `gpu_layers` on its GPU parts with the fallback CPU joining when it has no CPU part); a GPU
/// with `gpu_layers` below the model's layers, or too little free memory for the whole model
/// (the rest on the fallback CPU).
pub fn layer_split(
    cfg: &ModelConfig,
    file: &GgufFile,
    device: &Arc<dyn Device>,
    fallback: &Arc<dyn Device>,
    params: &LoadParams,
) -> Result<Option<LayerSplit>> {
    let ctx = &params.context;
    if let Some(meta) = MetaDevice::from_device(device.as_ref()) {
        if meta.split_mode() != SplitMode::Layer {
            if params.gpu_layers.is_some() {
                return Err(Error::Invalid(format!(
                    "GPU layers are a layer split, but {} splits by tensors (use the layer split \
                     mode)",
                    device.name()
                )));
            }
            return Ok(None);
        }
        let mut parts = device.parts();
        let mut speeds = meta.speeds()?;
        let shares = match params.gpu_layers {
            Some(n) => {
                if !parts.iter().any(|p| p.kind() == DeviceKind::Cpu) && n < cfg.n_layer {
                    parts.push(fallback.clone());
                    speeds.push(tessera::meta::measure_matvec(fallback.as_ref())?);
                }
                LayerShares::Offload(Some(n))
            }
            None if meta.ratios_given() => LayerShares::Given(meta.ratios().to_vec()),
            None => LayerShares::Fill,
        };
        return LayerSplit::new(
            cfg,
            file,
            &device.name(),
            parts,
            &speeds,
            &shares,
            ctx,
            params.op_offload,
        )
        .map(Some);
    }
    if device.kind() == DeviceKind::Cpu {
        return match params.gpu_layers {
            Some(n) if n > 0 => Err(Error::Invalid(format!(
                "{n} GPU layers asked for, but the device is {}",
                device.name()
            ))),
            _ => Ok(None),
        };
    }
    let name = format!("{}+{}", device.name(), fallback.name());
    let parts = vec![device.clone(), fallback.clone()];
    let shares = match params.gpu_layers {
        Some(n) if n >= cfg.n_layer => return Ok(None),
        Some(n) => LayerShares::Offload(Some(n)),
        None => {
            let n_ctx = planned_ctx(cfg, ctx).div_ceil(KV_PAD) * KV_PAD;
            let cache: usize = KvCache::layer_bytes(cfg, n_ctx, ctx.n_ubatch, KV_PAD, ctx.kv_type)
                .iter()
                .sum();
            let weights: usize = file.tensors.iter().map(|t| t.size as usize).sum();
            let need = weights + cache;
            let free = device.memory().free;
            if need <= free {
                return Ok(None);
            }
            log::info!(
                "the model and its KV cache ({} MiB) do not fit in {}'s {} MiB free: as many \
                 layers there as fit, the rest on {}",
                need >> 20,
                device.name(),
                free >> 20,
                fallback.name()
            );
            LayerShares::Offload(None)
        }
    };
    let speeds = tessera::meta::measure_speeds(&parts)?;
    LayerSplit::new(
        cfg,
        file,
        &name,
        parts,
        &speeds,
        &shares,
        ctx,
        params.op_offload,
    )
    .map(Some)
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
        n_groups: 1,
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
