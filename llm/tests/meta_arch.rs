//! Tensor parallelism of the real Gemma 3 270M file on meta devices of CPU parts. The model has
//! one KV head for its four query heads, so its heads are split by query heads with K, V and the
//! KV cache on every part; its blocks add per-head Q/K norms, post-norms after the row-parallel
//! projections (the partial sums must be all-reduced before them), a GELU-gated feed-forward,
//! an embedding scale and sliding-window layers with their own mask and cache rows.
//!
//! In precise mode nothing is quantized twice, so split or not the logits agree to rounding and
//! greedy generation gives the CPU's tokens; in the default mode the tokens agree up to the
//! first near-tie (top-2 logits within 0.5, as meta_greedy.rs defines it).

mod common;

use std::sync::{Arc, OnceLock};

use tessera::cpu::CpuDevice;
use tessera::meta::{MetaDevice, MetaOptions, SplitMode, SplitRatios};
use tessera::Device;
use tessera_llm::{ContextParams, Model};

use common::*;

fn meta(parts: Vec<Arc<dyn Device>>, ratios: &[f64]) -> Arc<dyn Device> {
    // Tensor parallelism even over unlike parts (the automatic mode would split those by
    // layers).
    let options = MetaOptions::default().with_split_mode(SplitMode::Tensor);
    Arc::new(
        MetaDevice::with_options(parts, &SplitRatios::Given(ratios.to_vec()), options)
            .expect("a meta device"),
    )
}

fn cpus(ratios: &[f64], precise: bool) -> Arc<dyn Device> {
    let parts = ratios
        .iter()
        .map(|_| Arc::new(CpuDevice::new().with_precise(precise)) as Arc<dyn Device>)
        .collect();
    meta(parts, ratios)
}

fn load(dev: Arc<dyn Device>) -> Arc<Model> {
    Arc::new(
        Model::load(
            gemma3_path(),
            dev,
            Arc::new(CpuDevice::new()),
            &mut |_, _| {},
        )
        .expect("gemma3 loads"),
    )
}

fn cpu_model(precise: bool) -> Arc<Model> {
    static DEFAULT: OnceLock<Arc<Model>> = OnceLock::new();
    static PRECISE: OnceLock<Arc<Model>> = OnceLock::new();
    let cell = if precise { &PRECISE } else { &DEFAULT };
    cell.get_or_init(|| load(Arc::new(CpuDevice::new().with_precise(precise))))
        .clone()
}

/// Greedy tokens and the logits before each.
fn greedy(model: &Arc<Model>, prompt: &[u32], steps: usize) -> (Vec<u32>, Vec<Vec<f32>>) {
    // Batches of 64 keep the sliding-window layers' ring (window + batch, padded) shorter than
    // the long prompt, so that its cells wrap around.
    greedy_in(
        model,
        ContextParams {
            n_ctx: (prompt.len() + steps + 1).next_multiple_of(256),
            n_ubatch: 64,
            ..ContextParams::default()
        },
        prompt,
        steps,
    )
}

/// The prompts of llama.cpp's Gemma 3 reference.
fn prompts() -> Vec<(String, Vec<u32>)> {
    let r = reference("gemma3-270m-reference.json");
    r["greedy"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            (
                p["name"].as_str().unwrap().to_string(),
                ids(&p["prompt_ids"]),
            )
        })
        .collect()
}

#[test]
fn gemma3_splits_by_query_heads_with_kv_on_every_part() {
    for ratios in [vec![0.5, 0.5], vec![0.7, 0.3], vec![0.6, 0.4, 0.0]] {
        let model = load(cpus(&ratios, false));
        let sh = model.sharding().expect("a sharded model");
        assert_eq!(sh.kv_heads(), None, "{ratios:?}: K and V are mirrored");
        assert_eq!(sh.q_heads().iter().sum::<usize>(), 4, "{ratios:?}");
        assert!(
            sh.q_heads()
                .iter()
                .zip(&ratios)
                .all(|(&h, &r)| (h > 0) == (r > 0.0)),
            "{ratios:?}: query heads {:?}",
            sh.q_heads()
        );
        let k = sh
            .weight_state("blk.0.attn_k.weight", tessera::DType::F32, [640, 256, 1, 1])
            .unwrap();
        assert_eq!(k, tessera::meta::SplitState::Mirrored);
        assert_eq!(sh.kv_state(), tessera::meta::SplitState::Mirrored);
    }
}

#[test]
fn precise_gemma3_on_cpu_parts_matches_the_precise_cpu() {
    const STEPS: usize = 6;
    let cpu = cpu_model(true);
    let prompts = prompts();
    let (_, prompt) = &prompts[0];
    let (toks, want) = greedy(&cpu, prompt, STEPS);
    for ratios in [vec![0.5, 0.5], vec![0.7, 0.3], vec![0.6, 0.4, 0.0]] {
        let model = load(cpus(&ratios, true));
        let (got_toks, got) = greedy(&model, prompt, STEPS);
        for (i, (w, g)) in want.iter().zip(&got).enumerate() {
            let e = nmse(w, g);
            println!("{ratios:?} step {i}: logits nmse {e:.1e}");
            assert!(
                e < 1e-6,
                "{ratios:?} step {i}: logits differ from the CPU's (nmse {e:e})"
            );
        }
        assert_eq!(got_toks, toks, "{ratios:?}");
    }
}

#[test]
fn gemma3_on_cpu_parts_generates_the_cpus_tokens() {
    const STEPS: usize = 8;
    let cpu = cpu_model(false);
    // The short prompts; the one past the sliding window has its own test.
    let prompts: Vec<_> = prompts()
        .into_iter()
        .filter(|(_, p)| p.len() < 64)
        .collect();
    assert_eq!(prompts.len(), 5);
    let want: Vec<(Vec<u32>, usize)> = prompts
        .iter()
        .map(|(_, p)| {
            let (toks, logits) = greedy(&cpu, p, STEPS);
            let tie = logits
                .iter()
                .position(|l| top2_gap(l) < 0.5)
                .unwrap_or(STEPS);
            (toks, tie)
        })
        .collect();
    for ratios in [vec![0.5, 0.5], vec![0.7, 0.3]] {
        let model = load(cpus(&ratios, false));
        for ((name, p), (toks, tie)) in prompts.iter().zip(&want) {
            let (got, _) = greedy(&model, p, STEPS);
            let matched = got.iter().zip(toks).take_while(|(a, b)| a == b).count();
            println!("  {ratios:?} {name}: matched {matched}/{STEPS}, first near-tie at {tie}");
            assert!(
                matched >= *tie,
                "{ratios:?} {name}: diverged at step {matched} before the near-tie at {tie}"
            );
        }
    }
}

/// The prompt past the sliding window (654 tokens): the window layers' ring of cache cells
/// wraps around on every part.
#[test]
fn gemma3_on_cpu_parts_past_the_sliding_window() {
    const STEPS: usize = 4;
    let cpu = cpu_model(false);
    let (name, prompt) = prompts()
        .into_iter()
        .find(|(_, p)| p.len() > 600)
        .expect("the long prompt");
    let (toks, logits) = greedy(&cpu, &prompt, STEPS);
    let tie = logits
        .iter()
        .position(|l| top2_gap(l) < 0.5)
        .unwrap_or(STEPS);
    let model = load(cpus(&[0.7, 0.3], false));
    let (got, _) = greedy(&model, &prompt, STEPS);
    let matched = got.iter().zip(&toks).take_while(|(a, b)| a == b).count();
    println!("  {name}: matched {matched}/{STEPS}, first near-tie at {tie}");
    assert!(
        matched >= tie,
        "{name}: diverged at step {matched} before the near-tie at {tie}"
    );
}

/// A CPU and a wgpu adapter (lavapipe in CI) as one meta device; skipped, saying so, when the
/// facade has no wgpu device (built without the `wgpu` feature).
#[test]
fn gemma3_on_cpu_and_wgpu_parts_generates_the_cpus_tokens() {
    let Ok(gpu) = tessera::registry().find("wgpu:0") else {
        println!("skipped: no wgpu:0 device (build with the wgpu feature)");
        return;
    };
    // Software Vulkan is slow: one prompt, a few steps.
    const N: usize = 3;
    let cpu = cpu_model(false);
    let model = load(meta(vec![Arc::new(CpuDevice::new()), gpu], &[0.5, 0.5]));
    let prompts = prompts();
    let (name, prompt) = &prompts[0];
    let (toks, logits) = greedy(&cpu, prompt, N);
    let tie = logits.iter().position(|l| top2_gap(l) < 0.5).unwrap_or(N);
    let (got, _) = greedy(&model, prompt, N);
    let matched = got.iter().zip(&toks).take_while(|(a, b)| a == b).count();
    println!(
        "  {} {name}: matched {matched}/{N}, first near-tie at {tie}",
        model.device().name()
    );
    assert!(
        matched >= tie,
        "{name}: diverged at step {matched} before the near-tie at {tie}"
    );
}
