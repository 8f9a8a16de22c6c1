//! `tessera devices`.

use std::sync::Arc;

use clap::Args;
use tessera::core::gguf::GgufFile;
use tessera::cpu::CpuDevice;
use tessera::meta::{MetaDevice, SplitMode};
use tessera::{Device, Error, Result};
use tessera_llm::shard::Sharding;
use tessera_llm::{ContextParams, LoadParams, ModelConfig};

/// Arguments of `tessera devices`.
#[derive(Args, Debug)]
pub struct DevicesArgs {
    /// Also show the meta device made of these parts (e.g. cpu,cuda:0 or meta:cpu,cpu), with
    /// each part's share of the work.
    #[arg(long)]
    meta: Option<String>,
    /// The meta device's split: auto (from free memory and a measured mat-vec) or a share per
    /// part (0.6,0.4).
    #[arg(long, default_value = "auto")]
    split: String,
    /// The meta device's split mode: tensor, layer or auto (default: auto).
    #[arg(long)]
    split_mode: Option<String>,
    /// A GGUF model (file, or a known model's name) to plan on the meta device: which part
    /// holds which layers, their bytes and each part's expected share of a token's time.
    #[arg(long, requires = "meta")]
    model: Option<String>,
    /// Layers on the meta device's GPU parts for the plan (as llama.cpp's -ngl).
    #[arg(long, requires = "model")]
    gpu_layers: Option<usize>,
    /// With layers on the CPU, the smallest step (tokens) whose CPU layers' mat-muls the plan
    /// runs on the first GPU part (as `generate --op-offload`; 0: off).
    #[arg(long, default_value_t = tessera_llm::OP_OFFLOAD_BATCH, requires = "model")]
    op_offload: usize,
    /// The context size the plan leaves room for (0: the model's, at most 4096).
    #[arg(long, default_value_t = 0, requires = "model")]
    ctx: usize,
}

fn gib(b: usize) -> f64 {
    b as f64 / (1u64 << 30) as f64
}

fn line(d: &dyn Device) {
    let m = d.memory();
    println!(
        "{:<10} {:<9} {:>7.1} GiB free / {:>7.1} GiB  {}",
        d.name(),
        d.kind().name(),
        gib(m.free),
        gib(m.total),
        d.description()
    );
}

/// Lists every backend's devices, or why it has none; with `--meta`, a meta device's parts and
/// their ratios.
pub fn run(a: DevicesArgs) -> Result<()> {
    let reg = tessera::registry_with(&tessera::Options::from_env()?);
    for b in reg.backends() {
        match &b.devices {
            Ok(ds) if ds.is_empty() => println!("{}: no devices", b.backend),
            Ok(ds) => ds.iter().for_each(|d| line(d.as_ref())),
            Err(why) => println!("{}: unusable here: {why}", b.backend),
        }
    }
    if let Some(spec) = &a.meta {
        let spec = if spec.starts_with("meta:") {
            spec.clone()
        } else {
            format!("meta:{spec}")
        };
        let mut options = tessera::Options::from_env()?;
        if let Some(m) = &a.split_mode {
            options.meta.split_mode = SplitMode::parse(m)?;
        }
        let dev = crate::load::meta_device(&spec, &a.split, &options)?;
        println!();
        line(dev.as_ref());
        let meta = MetaDevice::from_device(dev.as_ref());
        let ratios = meta.map(|m| m.ratios().to_vec()).unwrap_or_default();
        // Split by layers with measured ratios, the fastest part takes what fits: the shares
        // are the plan's (with --model), not the ratios'.
        let filled = meta.is_some_and(|m| m.split_mode() == SplitMode::Layer && !m.ratios_given());
        for (j, (p, r)) in dev.parts().iter().zip(ratios).enumerate() {
            let share = if filled {
                "    --".to_string()
            } else {
                format!("{:>5.1}%", r * 100.0)
            };
            println!("  part {j}: {:<10} {share}  {}", p.name(), p.description());
        }
        if let Some(model) = &a.model {
            let fallback: Arc<dyn Device> = Arc::new(CpuDevice::with_options(&options.cpu));
            plan(&a, model, &dev, &fallback)?;
        }
    }
    Ok(())
}

/// Says whether prompts of `split` run its CPU layers' mat-muls on a GPU part (op offload).
fn offload_line(split: &tessera_llm::shard::LayerSplit) {
    let p = split.plan();
    let parts = split.parts();
    let cpu_layers = parts.iter().enumerate().any(|(j, d)| {
        let (first, end) = p.range(j);
        d.kind() == tessera::core::DeviceKind::Cpu && end > first
    });
    let gpu = parts
        .iter()
        .find(|d| d.kind() != tessera::core::DeviceKind::Cpu);
    match (cpu_layers, gpu) {
        (true, Some(gpu)) if split.op_offload() > 0 => println!(
            "  op offload: steps of {} tokens or more compute the CPU layers' mat-muls on {} \
             ({:.1} MiB reserved there for the uploaded weights)",
            split.op_offload(),
            gpu.name(),
            split.offload_scratch() as f64 / (1u64 << 20) as f64
        ),
        (true, Some(_)) => println!("  op offload: off (the CPU computes its layers' mat-muls)"),
        _ => {}
    }
}

/// Prints how model `spec` would be placed on `dev`.
fn plan(
    a: &DevicesArgs,
    spec: &str,
    dev: &Arc<dyn Device>,
    fallback: &Arc<dyn Device>,
) -> Result<()> {
    let args = crate::load::ModelArgs {
        model: Some(spec.to_string()),
        device: dev.name(),
        split: a.split.clone(),
        split_mode: a.split_mode.clone(),
        gpu_layers: a.gpu_layers,
        op_offload: a.op_offload,
        threads: None,
        precise: false,
    };
    let path = crate::load::model_path(&args)?;
    let file = GgufFile::open(&path)?;
    let cfg = ModelConfig::from_gguf(&file)?;
    let params = LoadParams {
        gpu_layers: a.gpu_layers,
        op_offload: a.op_offload,
        context: ContextParams {
            n_ctx: a.ctx,
            ..ContextParams::default()
        },
    };
    let n_ctx = tessera_llm::shard::planned_ctx(&cfg, &params.context);
    println!();
    match tessera_llm::model::layer_split(&cfg, &file, dev, fallback, &params)? {
        Some(split) => {
            let p = split.plan();
            println!(
                "{} on {}: {} layers split by layers, context {n_ctx}",
                path.display(),
                split.name(),
                cfg.n_layer
            );
            for (j, part) in split.parts().iter().enumerate() {
                let (first, end) = p.range(j);
                let layers = if end > first {
                    format!("layers {first:>3}..{end:<3} ({:>3})", end - first)
                } else {
                    "no layers          ".to_string()
                };
                println!(
                    "  part {j}: {:<12} {layers}{:<14} {:>9.1} MiB  {:>5.1}% of a token's time",
                    part.name(),
                    if j == p.head_part {
                        " + output head"
                    } else {
                        ""
                    },
                    p.bytes[j] as f64 / (1u64 << 20) as f64,
                    p.time[j] * 100.0
                );
            }
            offload_line(&split);
        }
        None => {
            let sh = Sharding::new(&cfg, &file, dev.as_ref())?
                .ok_or_else(|| Error::Invalid(format!("{} is not a meta device", dev.name())))?;
            println!(
                "{} on {}: tensor parallel, query heads {:?}, KV heads {}, feed-forward rows {:?}",
                path.display(),
                dev.name(),
                sh.q_heads(),
                sh.kv_heads()
                    .map_or("on every part".to_string(), |k| format!("{k:?}")),
                sh.ffn_rows()
            );
        }
    }
    Ok(())
}
