//! Expert parallelism of the small mixture-of-experts models on meta devices of CPU parts: each
//! part holds whole experts (by the split ratios; a part may hold none), the router and the
//! rest of the feed-forward mirrored, attention split by heads as for a dense model (OLMoE's
//! whole-row Q/K norms keep its attention whole on every part). The models are F32, so split
//! or not the logits agree to rounding and greedy gives the CPU's tokens up to the CPU's first
//! near-tie.

mod common;

use std::sync::Arc;

use tessera::cpu::CpuDevice;
use tessera::meta::{MetaDevice, SplitRatios};
use tessera::Device;
use tessera_core::DType;
use tessera_llm::shard::Sharding;
use tessera_llm::synth::{self, Like, SynthType};
use tessera_llm::{Context, ContextParams, Model};

use common::argmax;

const PROMPT: &str =
    "Once upon a time, in a small village by the sea, there lived an old fisherman";
const STEPS: usize = 12;

fn meta(ratios: &[f64]) -> Arc<dyn Device> {
    let parts = ratios
        .iter()
        .map(|_| Arc::new(CpuDevice::new()) as Arc<dyn Device>)
        .collect();
    Arc::new(MetaDevice::new(parts, &SplitRatios::Given(ratios.to_vec())).unwrap())
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

#[test]
fn small_moe_models_on_meta_cpu_parts_give_the_cpus_tokens() {
    let dir = std::env::temp_dir().join(format!("tessera-meta-experts-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut failed = Vec::new();
    for like in [
        Like::MixtralSmall,
        Like::Qwen2MoeSmall,
        Like::Qwen3MoeSmall,
        Like::OlmoeSmall,
    ] {
        let path = dir.join(format!("{}.gguf", like.name()));
        synth::synth(like, SynthType::All(DType::F32), &path, &mut |_, _| {}).unwrap();
        let cpu = Arc::new(CpuDevice::new()) as Arc<dyn Device>;
        let load = |dev: Arc<dyn Device>| {
            Arc::new(Model::load(&path, dev, Arc::new(CpuDevice::new()), &mut |_, _| {}).unwrap())
        };
        let (want_logits, want, gaps) = run(&load(cpu));
        let tie = gaps.iter().position(|&g| g < 0.5).unwrap_or(STEPS);
        for ratios in [vec![0.6, 0.4], vec![0.5, 0.3, 0.2], vec![0.7, 0.3, 0.0]] {
            let dev = meta(&ratios);
            let model = load(dev.clone());
            let n_expert = model.config.moe.as_ref().unwrap().n_expert;
            let sh = Sharding::new(
                &model.config,
                &tessera_core::gguf::GgufFile::open(&path).unwrap(),
                dev.as_ref(),
            )
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
                "{} on {ratios:?}: experts {:?}; last prompt logits max |d| {worst:.2e}; greedy same {same}/{STEPS} (cpu's first near-tie at {tie})",
                like.name(),
                sh.experts()
            );
            if worst > 1e-2 || same < tie {
                failed.push(format!("{} {ratios:?}", like.name()));
            }
        }
    }
    std::fs::remove_dir_all(&dir).unwrap();
    assert!(failed.is_empty(), "differ from the CPU: {failed:?}");
}
