//! Expert parallelism of the small mixture-of-experts models on meta devices: each part holds
//! whole experts (by the split ratios; a part may hold none), the router and the rest of the
//! feed-forward mirrored, attention split by heads as for a dense model (OLMoE's whole-row Q/K
//! norms keep its attention whole on every part, as do heads the ratios cannot divide). The
//! models are F32, so split or not the logits agree to rounding (within 0.1 against a spread of
//! about 24; a wrong expert or a lost sum moves them by tens) and greedy gives the CPU's tokens
//! up to the CPU's first near-tie. gpt-oss-small's experts are MXFP4, whose products round
//! their input rows to Q8_0 (as llama.cpp's do): the summation order of a split attention moves
//! some values across a rounding step, and its logits agree within 0.3; with a wgpu part, whose
//! MXFP4 mat-vec reads the rows unrounded, within 1.0 (the rule of the llama.cpp comparison).
//! Parts are CPUs, and a CPU with each GPU device present (lavapipe in CI: meta:cpu,wgpu:0).

mod common;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use tessera::cpu::CpuDevice;
use tessera::meta::{MetaDevice, SplitRatios};
use tessera::Device;
use tessera_core::gguf::GgufFile;
use tessera_core::DType;
use tessera_llm::shard::Sharding;
use tessera_llm::synth::{self, Like, SynthType};
use tessera_llm::{Context, ContextParams, Model};

use common::argmax;

const PROMPT: &str =
    "Once upon a time, in a small village by the sea, there lived an old fisherman";
const STEPS: usize = 12;
const MODELS: [Like; 5] = [
    Like::MixtralSmall,
    Like::Qwen2MoeSmall,
    Like::Qwen3MoeSmall,
    Like::OlmoeSmall,
    Like::GptOssSmall,
];

fn cpu() -> Arc<dyn Device> {
    Arc::new(CpuDevice::new())
}

fn meta(parts: Vec<Arc<dyn Device>>, ratios: &[f64]) -> Arc<dyn Device> {
    Arc::new(MetaDevice::new(parts, &SplitRatios::Given(ratios.to_vec())).unwrap())
}

/// The F32 file of `like` in `dir`.
fn model_file(dir: &Path, like: Like) -> PathBuf {
    let path = dir.join(format!("{}.gguf", like.name()));
    synth::synth(like, SynthType::All(DType::F32), &path, &mut |_, _| {}).unwrap();
    path
}

fn load(path: &Path, dev: Arc<dyn Device>) -> Arc<Model> {
    Arc::new(Model::load(path, dev, cpu(), &mut |_, _| {}).unwrap())
}

/// The prompt's last logits, then the greedy ids and the top-2 gap before each.
fn run(model: &Arc<Model>) -> (Vec<f32>, Vec<u32>, Vec<f32>) {
    let mut ctx = Context::new(model.clone(), ContextParams::default()).unwrap();
    let prompt = model.tokenizer.encode(PROMPT, true, true).unwrap();
    let mut logits = ctx.eval(&prompt, false).unwrap();
    let first = logits.clone();
    let (mut ids, mut gaps) = (Vec::new(), Vec::new());
    for _ in 0..STEPS {
        let t = argmax(&logits);
        let second = logits
            .iter()
            .enumerate()
            .filter(|&(i, _)| i != t)
            .map(|(_, &v)| v)
            .fold(f32::NEG_INFINITY, f32::max);
        gaps.push(logits[t] - second);
        ids.push(t as u32);
        logits = ctx.eval(&[t as u32], false).unwrap();
    }
    (first, ids, gaps)
}

/// Runs every model on the CPU and on each meta device `metas` makes (with its ratios);
/// returns the runs that differ.
fn compare(tag: &str, metas: &dyn Fn() -> Vec<(Vec<f64>, Arc<dyn Device>)>) -> Vec<String> {
    let dir =
        std::env::temp_dir().join(format!("tessera-meta-experts-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut failed = Vec::new();
    for like in MODELS {
        let path = model_file(&dir, like);
        let (want_logits, want, gaps) = run(&load(&path, cpu()));
        let tie = gaps.iter().position(|&g| g < 0.5).unwrap_or(STEPS);
        for (ratios, dev) in metas() {
            let model = load(&path, dev.clone());
            let n_expert = model.config.moe.as_ref().unwrap().n_expert;
            let file = GgufFile::open(&path).unwrap();
            let sh = Sharding::new(&model.config, &file, dev.as_ref())
                .unwrap()
                .unwrap();
            assert_eq!(
                sh.experts().iter().sum::<usize>(),
                n_expert,
                "{}: every expert on one part",
                like.name()
            );
            let (logits, got, _) = run(&model);
            let worst = logits
                .iter()
                .zip(&want_logits)
                .map(|(a, b)| (a - b).abs())
                .fold(0f32, f32::max);
            let same = got.iter().zip(&want).take_while(|(a, b)| a == b).count();
            println!(
                "{} on {} {ratios:?}: experts {:?}; last prompt logits max |d| {worst:.2e}; \
                 greedy same {same}/{STEPS} (the CPU's first near-tie at {tie})",
                like.name(),
                dev.name(),
                sh.experts()
            );
            let tol = match (like, tag) {
                (Like::GptOssSmall, "cpu") => 0.3,
                (Like::GptOssSmall, _) => 1.0,
                _ => 0.1,
            };
            if worst > tol || same < tie {
                failed.push(format!("{} on {} {ratios:?}", like.name(), dev.name()));
            }
        }
    }
    std::fs::remove_dir_all(&dir).unwrap();
    failed
}

#[test]
fn small_moe_models_on_meta_cpu_parts_give_the_cpus_tokens() {
    let metas = || {
        // 0.75,0.25 cannot divide qwen3moe-small's heads (2 KV heads of 2 query heads): its
        // attention stays whole on every part while the experts split.
        [
            vec![0.6, 0.4],
            vec![0.75, 0.25],
            vec![0.5, 0.3, 0.2],
            vec![0.7, 0.3, 0.0],
        ]
        .into_iter()
        .map(|r| {
            let parts = r.iter().map(|_| cpu()).collect();
            (r.clone(), meta(parts, &r))
        })
        .collect()
    };
    let failed = compare("cpu", &metas);
    assert!(failed.is_empty(), "differ from the CPU: {failed:?}");
}

/// A CPU and each GPU device present (absent backends reported as skipped by name).
#[test]
fn small_moe_models_on_a_cpu_and_each_gpu_device_give_the_cpus_tokens() {
    let gpus = common::non_cpu_devices();
    let metas = || {
        gpus.iter()
            .map(|g| {
                let r = vec![0.5, 0.5];
                (r.clone(), meta(vec![cpu(), g.clone()], &r))
            })
            .collect()
    };
    let failed = compare("gpu", &metas);
    println!("{} non-CPU devices tested", gpus.len());
    assert!(failed.is_empty(), "differ from the CPU: {failed:?}");
}
