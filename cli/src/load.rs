//! Resolving `--device` and `--model`, and loading a model with progress.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use clap::Args;
use tessera::cpu::CpuDevice;
use tessera::meta::{SplitMode, SplitRatios};
use tessera::{Device, Error, Options, Result};
use tessera_llm::{fetch, ContextParams, LoadParams, Model};

use crate::progress;

/// Options shared by the commands that load a model.
#[derive(Args, Clone, Debug)]
pub struct ModelArgs {
    /// GGUF model file, or a known model's name (`tessera models` lists them), fetched and
    /// cached on first use; without it the test model (smollm2-135m).
    #[arg(long)]
    pub model: Option<String>,
    /// Device: auto (the best present), cpu, cuda:0, wgpu:0, or meta:DEV,DEV[,...] to split the
    /// model over several devices; a part in brackets is a tensor-parallel group
    /// (meta:[cuda:0,cuda:1],cpu).
    #[arg(long, default_value = "auto")]
    pub device: String,
    /// How a meta device divides the model: auto (from free memory and a measured mat-vec) or a
    /// share per part (0.6,0.4).
    #[arg(long, default_value = "auto")]
    pub split: String,
    /// How a meta device splits the model: tensor (every layer over all parts, for like GPUs
    /// with fast links), layer (whole layers per part, the activations crossing once per
    /// boundary: unlike devices, a GPU and the CPU) or auto (tensor for like devices that
    /// reach each other's memory, layer otherwise). Default: auto.
    #[arg(long)]
    pub split_mode: Option<String>,
    /// Layers on the GPU, as llama.cpp's -ngl: on a GPU device this many there and the rest on
    /// the CPU; on a meta device split by layers this many on its parts that are not the CPU.
    /// Default: as many as the GPU's free memory holds after the KV cache and compute buffers.
    #[arg(long)]
    pub gpu_layers: Option<usize>,
    /// With layers on the CPU (--gpu-layers, or a meta device split by layers with a CPU
    /// part): a step of at least this many tokens computes those layers' mat-muls on the GPU,
    /// each weight uploaded for the step, as llama.cpp does; 0: off (the CPU computes them).
    #[arg(long, default_value_t = tessera_llm::OP_OFFLOAD_BATCH)]
    pub op_offload: usize,
    /// CPU threads (default: all cores).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Compute without quantizing activations (CPU; slower, for checking).
    #[arg(long)]
    pub precise: bool,
}

/// The backends' options: the environment's, with the CPU flags over them.
fn options(args: &ModelArgs) -> Result<Options> {
    let mut o = Options::from_env()?;
    o.cpu.precise = args.precise;
    if let Some(n) = args.threads {
        o.cpu.threads = n;
    }
    if let Some(m) = &args.split_mode {
        o.meta.split_mode = SplitMode::parse(m)?;
    }
    Ok(o)
}

/// The model's device and the CPU fallback.
pub fn devices(args: &ModelArgs) -> Result<(Arc<dyn Device>, Arc<dyn Device>)> {
    let options = options(args)?;
    let fallback: Arc<dyn Device> = Arc::new(CpuDevice::with_options(&options.cpu));
    let spec = args.device.trim();
    if spec.starts_with("meta:") {
        return Ok((meta_device(spec, &args.split, &options)?, fallback));
    }
    if args.split.trim() != "auto" {
        return Err(Error::Invalid(format!(
            "--split divides a meta device (--device meta:DEV,DEV), not {spec}"
        )));
    }
    if args.split_mode.is_some() {
        return Err(Error::Invalid(format!(
            "--split-mode divides a meta device (--device meta:DEV,DEV), not {spec} (for a GPU \
             and the CPU, use --gpu-layers)"
        )));
    }
    if spec == "cpu" {
        return Ok((fallback.clone(), fallback));
    }
    let dev = tessera::device(&options, spec)?;
    if dev.kind() == tessera::core::DeviceKind::Cpu {
        return Ok((fallback.clone(), fallback));
    }
    Ok((dev, fallback))
}

/// A meta device from its spec (`meta:cpu,cuda:0`) and split (`auto`, `0.6,0.4`), its parts
/// opened with `options`.
pub fn meta_device(spec: &str, split: &str, options: &Options) -> Result<Arc<dyn Device>> {
    tessera::meta_device(options, spec, &SplitRatios::parse(split)?)
}

/// The model path: `--model` (a file, or a known model's name, fetched with a progress bar),
/// or the test model.
pub fn model_path(args: &ModelArgs) -> Result<PathBuf> {
    let spec = args.model.as_deref().unwrap_or(fetch::SMOLLM2_135M.name);
    let options = fetch::FetchOptions::from_env();
    match fetch::find(spec) {
        // A bar only for a fetch: a file of that name, or a cached model, is returned at once.
        Some(m) if !Path::new(spec).is_file() && m.cached(&options).is_none() => {
            let pb = progress::bytes_bar(&format!("fetching {}", m.name));
            let r = m.fetch(&options, &mut progress::fetch_reporter(&pb, m));
            pb.finish_and_clear();
            r
        }
        _ => fetch::resolve(spec, &options, &mut |_| {}),
    }
}

/// Compiles and loads the device's GPU kernels now (from the disk cache after the first run),
/// with a progress bar, rather than one file at a time during the first steps.
pub fn prepare(dev: &Arc<dyn Device>) -> Result<()> {
    let pb = progress::count_bar(&format!("preparing kernels for {}", dev.name()));
    let r = dev.prepare(&mut |done, total| {
        pb.set_length(total as u64);
        pb.set_position(done as u64);
    });
    pb.finish_and_clear();
    r
}

/// How the model is placed for a context of `context`'s size: `--gpu-layers`, and the
/// context a layer split leaves room for.
pub fn load_params(args: &ModelArgs, context: &ContextParams) -> LoadParams {
    LoadParams {
        gpu_layers: args.gpu_layers,
        op_offload: args.op_offload,
        context: context.clone(),
    }
}

/// Loads the model on the chosen device, with a progress bar for the weights, placed for a
/// context of `context`'s size.
pub fn load(args: &ModelArgs, context: &ContextParams) -> Result<Arc<Model>> {
    let path = model_path(args)?;
    let (dev, fallback) = devices(args)?;
    prepare(&dev)?;
    let pb = progress::bytes_bar(&format!("loading onto {}", dev.name()));
    let params = load_params(args, context);
    let model = Model::load_with(&path, dev, fallback, &params, &mut |done, total| {
        pb.set_length(total);
        pb.set_position(done);
    });
    pb.finish_and_clear();
    let model = model.map_err(|e| match e {
        Error::Gguf { .. } | Error::Model(_) => e,
        other => Error::Model(format!("{}: {other}", path.display())),
    })?;
    match model.layer_split() {
        Some(split) => log::info!(
            "loaded {} on {} split by layers {:?}",
            path.display(),
            split.name(),
            split.plan().counts
        ),
        None => log::info!("loaded {} on {}", path.display(), model.device().name()),
    }
    Ok(Arc::new(model))
}
