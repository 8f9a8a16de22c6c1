//! Greedy generation of the test model on every non-CPU device present (wgpu adapters, CUDA
//! GPUs, as compiled in) against llama.cpp's tokens, to the first near-tie, as the CPU is
//! checked in reference_greedy.rs. Absent backends are reported as skipped by name.
//!
//! `TESSERA_GREEDY_PROMPTS` (default 3) sets how many reference prompts run, and
//! `TESSERA_GREEDY_TOKENS` (default 16) how many tokens each: software adapters are slow.

mod common;

use std::sync::Arc;

use tessera::Device;
use tessera_llm::{Context, ContextParams, Model};

use common::*;

fn env_usize(key: &str, default: usize) -> usize {
    std::env::var(key)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

#[test]
fn greedy_generation_on_every_device_matches_llama_cpp_to_the_first_near_tie() {
    let mut tested = 0;
    for dev in non_cpu_devices() {
        check_device(dev);
        tested += 1;
    }
    println!("{tested} non-CPU devices tested");
}

fn check_device(dev: Arc<dyn Device>) {
    let cpu: Arc<dyn Device> = Arc::new(tessera::cpu::CpuDevice::new());
    let model = Arc::new(
        Model::load(model_path(), dev.clone(), cpu, &mut |_, _| {}).expect("the model loads"),
    );
    let r = reference("smollm2-greedy.json");
    let n_prompts = env_usize("TESSERA_GREEDY_PROMPTS", 3);
    let n_tokens = env_usize("TESSERA_GREEDY_TOKENS", 16);
    for p in r["prompts"].as_array().unwrap().iter().take(n_prompts) {
        let name = p["name"].as_str().unwrap();
        let prompt = ids(&p["prompt_ids"]);
        let want = ids(&p["generated_ids"]);
        let want = &want[..n_tokens.min(want.len())];
        let steps = p["steps"].as_array().unwrap();
        let tie = steps
            .iter()
            .position(|s| s["margin_top1_top2"].as_f64().unwrap() < 0.5)
            .unwrap_or(steps.len())
            .min(want.len());
        let mut ctx = Context::new(model.clone(), ContextParams::default()).unwrap();
        let mut logits = ctx.eval(&prompt, false).unwrap();
        let mut got = Vec::new();
        for _ in 0..want.len() {
            assert!(
                logits.iter().all(|x| x.is_finite()),
                "{}: {name}: non-finite logits",
                dev.name()
            );
            let t = argmax(&logits) as u32;
            got.push(t);
            logits = ctx.eval(&[t], false).unwrap();
        }
        let matched = got.iter().zip(want).take_while(|(a, b)| a == b).count();
        println!(
            "{}: {name}: matched {matched}/{} tokens; first near-tie at step {tie}",
            dev.name(),
            want.len()
        );
        assert!(
            matched >= tie,
            "{}: {name}: diverged at step {matched}, before the first near-tie at {tie}",
            dev.name()
        );
    }
}
