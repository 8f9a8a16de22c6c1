//! The test model split by layers (`--split-mode layer`): each part runs whole layers with the
//! kernels a single device would use, so over CPU parts the logits are the single CPU's bit for
//! bit, whatever the ratios (a part with ratio 0 holds nothing); over a CPU and a wgpu adapter
//! (lavapipe in CI), over a nested tensor-parallel group, with layers offloaded to a wgpu
//! adapter by count (`--gpu-layers`) or by what its capped memory holds, the greedy tokens are
//! the CPU's up to the first near-tie (top-2 logits within 0.5).

mod common;

use std::sync::Arc;

use tessera::cpu::CpuDevice;
use tessera::meta::{MetaDevice, MetaOptions, SplitMode, SplitRatios};
use tessera::{Device, Options};
use tessera_llm::{Context, ContextParams, LoadParams, Model};

use common::*;

const PROMPT: [u32; 6] = [1, 504, 3458, 282, 4649, 314];

fn layered(parts: Vec<Arc<dyn Device>>, ratios: &[f64]) -> Arc<dyn Device> {
    let options = MetaOptions::default().with_split_mode(SplitMode::Layer);
    Arc::new(
        MetaDevice::with_options(parts, &SplitRatios::Given(ratios.to_vec()), options)
            .expect("a meta device"),
    )
}

fn cpus(n: usize) -> Vec<Arc<dyn Device>> {
    (0..n)
        .map(|_| Arc::new(CpuDevice::new()) as Arc<dyn Device>)
        .collect()
}

fn params() -> LoadParams {
    LoadParams {
        gpu_layers: None,
        context: context(),
        ..LoadParams::default()
    }
}

fn context() -> ContextParams {
    ContextParams {
        n_ctx: 256,
        ..ContextParams::default()
    }
}

fn load(dev: Arc<dyn Device>, params: &LoadParams) -> tessera::Result<Arc<Model>> {
    Ok(Arc::new(Model::load_with(
        model_path(),
        dev,
        Arc::new(CpuDevice::new()),
        params,
        &mut |_, _| {},
    )?))
}

/// Greedy tokens and the logits before each.
fn greedy(model: &Arc<Model>, prompt: &[u32], steps: usize) -> (Vec<u32>, Vec<Vec<f32>>) {
    greedy_in(model, context(), prompt, steps)
}

/// The model's greedy tokens for two of llama.cpp's reference prompts equal the CPU's up to
/// the CPU's first near-tie.
fn same_tokens_as_the_cpu(model: &Arc<Model>, steps: usize) {
    let r = reference("smollm2-greedy.json");
    let cpu = cpu_model();
    for p in r["prompts"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| ["raw_france", "raw_list"].contains(&p["name"].as_str().unwrap()))
    {
        let prompt = ids(&p["prompt_ids"]);
        let (want, logits) = greedy(&cpu, &prompt, steps);
        let tie = logits
            .iter()
            .position(|l| top2_gap(l) < 0.5)
            .unwrap_or(steps);
        let (got, _) = greedy(model, &prompt, steps);
        let matched = got.iter().zip(&want).take_while(|(a, b)| a == b).count();
        let name = p["name"].as_str().unwrap();
        println!(
            "{} {name}: matched {matched}/{steps}, first near-tie at {tie}",
            model.device().name()
        );
        assert!(
            matched >= tie,
            "{} {name}: diverged at step {matched} before the near-tie at {tie}: {got:?} vs {want:?}",
            model.device().name()
        );
    }
}

fn counts(model: &Model) -> Vec<usize> {
    model
        .layer_split()
        .expect("a layer split")
        .plan()
        .counts
        .clone()
}

#[test]
fn layers_over_cpu_parts_give_the_cpus_logits_exactly() {
    let (want_toks, want) = greedy(&cpu_model(), &PROMPT, 6);
    for (ratios, expect) in [
        (vec![0.7, 0.3], vec![21, 9]),
        (vec![0.2, 0.5, 0.3], vec![6, 15, 9]),
        (vec![0.0, 1.0], vec![0, 30]),
        (vec![0.9, 0.1, 0.0], vec![27, 3, 0]),
    ] {
        let model = load(layered(cpus(ratios.len()), &ratios), &params()).unwrap();
        assert!(model.sharding().is_none());
        assert_eq!(counts(&model), expect, "{ratios:?}");
        let (toks, got) = greedy(&model, &PROMPT, 6);
        assert_eq!(toks, want_toks, "{ratios:?}");
        for (i, (w, g)) in want.iter().zip(&got).enumerate() {
            assert!(
                w == g,
                "{ratios:?} step {i}: the logits differ from the CPU's"
            );
        }
    }
}

#[test]
fn auto_mode_splits_unlike_devices_by_layers_and_like_cpus_by_tensors() {
    let auto = |parts| MetaDevice::new(parts, &SplitRatios::Given(vec![0.5, 0.5])).unwrap();
    assert_eq!(auto(cpus(2)).split_mode(), SplitMode::Tensor);
    match tessera::registry().find("wgpu:0") {
        Ok(gpu) => {
            let parts = vec![Arc::new(CpuDevice::new()) as Arc<dyn Device>, gpu];
            assert_eq!(auto(parts).split_mode(), SplitMode::Layer);
        }
        Err(_) => println!("skipped the CPU + wgpu:0 case: no wgpu:0 device"),
    }
}

#[test]
fn a_nested_tensor_parallel_group_runs_its_layers() {
    let options = Options::default();
    let dev = tessera::meta_device(
        &options,
        "meta:[cpu,cpu],cpu",
        &SplitRatios::Given(vec![0.6, 0.4]),
    )
    .unwrap();
    assert_eq!(dev.name(), "meta:[cpu,cpu],cpu");
    let model = load(dev, &params()).unwrap();
    let split = model.layer_split().expect("a layer split");
    assert_eq!(split.plan().counts, vec![18, 12]);
    assert!(split.sharding(0).is_some() && split.sharding(1).is_none());
    same_tokens_as_the_cpu(&model, 8);
}

#[test]
fn bad_splits_are_refused_when_the_device_is_made() {
    let e = MetaDevice::new(cpus(2), &SplitRatios::Given(vec![0.5, 0.3, 0.2]))
        .err()
        .expect("three ratios for two parts")
        .to_string();
    assert!(e.contains("3 entries") && e.contains("2 parts"), "{e}");
    let e = MetaDevice::new(cpus(2), &SplitRatios::Given(vec![0.0, 0.0]))
        .err()
        .expect("all zero")
        .to_string();
    assert!(e.contains("zero"), "{e}");
    let e = tessera::meta_device(&Options::default(), "meta:cpu,wgpu:9", &SplitRatios::Auto)
        .err()
        .expect("no such device")
        .to_string();
    assert!(e.contains("wgpu:9") && e.contains("meta:cpu,wgpu:9"), "{e}");
    // A tensor-parallel device cannot hold a group.
    let options =
        Options::default().with_meta(MetaOptions::default().with_split_mode(SplitMode::Tensor));
    let e = tessera::meta_device(&options, "meta:[cpu,cpu],cpu", &SplitRatios::Auto)
        .err()
        .expect("nested tensor parallelism")
        .to_string();
    assert!(e.contains("layer split mode"), "{e}");
}

/// The wgpu cases; skipped, saying so, when there is no wgpu:0 device.
fn wgpu(options: &Options) -> Option<Arc<dyn Device>> {
    match tessera::registry_with(options).find("wgpu:0") {
        Ok(d) => Some(d),
        Err(_) => {
            println!("skipped: no wgpu:0 device (build with the wgpu feature)");
            None
        }
    }
}

#[test]
fn layers_over_a_cpu_and_wgpu_give_the_cpus_tokens() {
    let Some(gpu) = wgpu(&Options::default()) else {
        return;
    };
    let parts = vec![Arc::new(CpuDevice::new()) as Arc<dyn Device>, gpu];
    let model = load(layered(parts, &[0.4, 0.6]), &params()).unwrap();
    let split = model.layer_split().unwrap();
    assert_eq!(split.plan().counts, vec![12, 18]);
    same_tokens_as_the_cpu(&model, 6);
}

#[test]
fn gpu_layers_put_that_many_layers_on_wgpu_and_the_rest_on_the_cpu() {
    let Some(gpu) = wgpu(&Options::default()) else {
        return;
    };
    let p = LoadParams {
        gpu_layers: Some(10),
        ..params()
    };
    let model = load(gpu, &p).unwrap();
    assert_eq!(counts(&model), vec![10, 20]);
    assert_eq!(model.layer_split().unwrap().plan().head_part, 0);
    same_tokens_as_the_cpu(&model, 6);
}

#[cfg(feature = "wgpu")]
/// A wgpu adapter with memory for about 60% of the model: by default the layers that fit go
/// there and the rest to the CPU, with the CPU's tokens; and a fixed split that would overfill
/// it is refused when the model is loaded, naming the part.
#[test]
fn a_gpu_too_small_for_the_model_gets_what_fits_and_the_cpu_the_rest() {
    let file = std::fs::metadata(model_path()).unwrap().len() as usize;
    let options = Options::default()
        .with_wgpu(tessera::wgpu::WgpuOptions::default().memory_limit(Some(file * 6 / 10)));
    let Some(gpu) = wgpu(&options) else {
        return;
    };
    let model = load(gpu.clone(), &params()).unwrap();
    let c = counts(&model);
    println!("{} MiB cap: layers {c:?}", (file * 6 / 10) >> 20);
    assert!(c[0] > 0 && c[1] > 0 && c[0] + c[1] == 30, "{c:?}");
    same_tokens_as_the_cpu(&model, 6);
    drop(model);
    let parts = vec![Arc::new(CpuDevice::new()) as Arc<dyn Device>, gpu];
    let e = load(layered(parts, &[0.1, 0.9]), &params())
        .err()
        .expect("the wgpu part cannot hold 27 layers")
        .to_string();
    assert!(
        e.contains("part 1 (wgpu:0)") && e.contains("MiB free"),
        "{e}"
    );
}

/// A prompt cut into micro-batches flows through the parts without waiting between batches
/// (a batch's first layers run while a device still computes the one before): the logits are
/// those of the same batches evaluated one call at a time, each waited for, bit for bit; over a
/// CPU and wgpu:0 where present (the asynchronous case), else over two CPUs.
#[test]
fn queued_prompt_batches_give_the_logits_of_batches_waited_for() {
    let parts: Vec<Arc<dyn Device>> = match wgpu(&Options::default()) {
        Some(gpu) => vec![Arc::new(CpuDevice::new()), gpu],
        None => cpus(2),
    };
    let model = load(layered(parts, &[0.5, 0.5]), &params()).unwrap();
    let prompt: Vec<u32> = (0..13u32).map(|i| 1 + (i * 977) % 4000).collect();
    let ctx = || {
        Context::new(
            model.clone(),
            ContextParams {
                n_ctx: 64,
                n_ubatch: 4,
                ..ContextParams::default()
            },
        )
        .unwrap()
    };
    let mut queued = ctx();
    let got = queued.eval(&prompt, false).unwrap();
    let mut waited = ctx();
    let mut want = Vec::new();
    for chunk in prompt.chunks(4) {
        want = waited.eval(chunk, false).unwrap();
    }
    assert_eq!(got.len(), want.len());
    assert!(got == want, "{}: the logits differ", model.device().name());
    // And the next token's step sees the whole prompt in the cache in both.
    let t = argmax(&got) as u32;
    assert!(queued.eval(&[t], false).unwrap() == waited.eval(&[t], false).unwrap());
}

/// Gemma 3 270M (sliding-window layers with their ring caches, one KV head) over two CPU parts
/// by layers: the single CPU's logits bit for bit.
#[test]
fn gemma3_split_by_layers_over_cpus_gives_the_cpus_logits() {
    let path = gemma3_path();
    let at = |dev: Arc<dyn Device>| {
        Arc::new(
            Model::load_with(
                &path,
                dev,
                Arc::new(CpuDevice::new()),
                &params(),
                &mut |_, _| {},
            )
            .unwrap(),
        )
    };
    let prompt = [2u32, 818, 5279, 529, 7001, 563];
    let (want_toks, want) = greedy(&at(Arc::new(CpuDevice::new())), &prompt, 3);
    let model = at(layered(cpus(2), &[0.4, 0.6]));
    assert_eq!(counts(&model), vec![7, 11]);
    let (toks, got) = greedy(&model, &prompt, 3);
    assert_eq!(toks, want_toks);
    assert!(got == want, "the logits differ from the CPU's");
}

/// The weight bytes op offload uploads for one step: the mat-mul weights of the layers on
/// part `cpu`.
fn cpu_layer_mat_mul_bytes(model: &Model, cpu: usize) -> u64 {
    let split = model.layer_split().unwrap();
    let kinds = [
        "attn_q",
        "attn_k",
        "attn_v",
        "attn_output",
        "ffn_gate",
        "ffn_up",
        "ffn_down",
    ];
    model
        .file()
        .tensors
        .iter()
        .filter(|t| {
            let mut p = t.name.split('.');
            p.next() == Some("blk")
                && p.next()
                    .and_then(|l| l.parse().ok())
                    .map(|l| split.layer_part(l))
                    == Some(cpu)
                && p.next().is_some_and(|k| kinds.contains(&k))
        })
        .map(|t| t.size)
        .sum()
}

/// Op offload over wgpu:0 (lavapipe in CI) and the CPU split by layers (the CPU part last, as
/// `--gpu-layers` has it): a prompt longer than the threshold computes the CPU part's mat-muls
/// on wgpu:0 (the counters say how many and how many weight bytes: each CPU layer's seven,
/// once), the decode steps after it offload nothing, the greedy tokens are the single CPU's up
/// to its first near-tie and the prompt's logits close to its. With the threshold 0 nothing is
/// offloaded (there the CPU holds most layers, so that lavapipe's share stays small).
#[test]
fn op_offload_runs_the_cpu_layers_prompt_mat_muls_on_wgpu() {
    let Some(gpu) = wgpu(&Options::default()) else {
        return;
    };
    let cpu = cpu_model();
    let text = "The capital of France is Paris. The capital of Germany is Berlin. The capital \
                of Italy is";
    let prompt = cpu.tokenizer.encode(text, true, false).unwrap();
    // A threshold below the default: lavapipe's time grows with the prompt.
    let on = 16;
    assert!(prompt.len() > on, "{} tokens", prompt.len());
    let steps = 4;
    let (want, want_logits) = greedy(&cpu, &prompt, steps);
    let tie = want_logits
        .iter()
        .position(|l| top2_gap(l) < 0.5)
        .unwrap_or(steps);
    for (threshold, ratios, cpu_layers) in [(on, [0.8, 0.2], 6), (0, [0.1, 0.9], 27)] {
        let parts = vec![gpu.clone(), Arc::new(CpuDevice::new()) as Arc<dyn Device>];
        let p = LoadParams {
            op_offload: threshold,
            ..params()
        };
        let model = load(layered(parts, &ratios), &p).unwrap();
        assert_eq!(counts(&model)[1], cpu_layers);
        let mut ctx = Context::new(model.clone(), context()).unwrap();
        let mut logits = ctx.eval(&prompt, false).unwrap();
        let prompt_stats = ctx.offload_stats();
        let e = nmse(&want_logits[0], &logits);
        println!(
            "{} with {cpu_layers} CPU layers, threshold {threshold}: {prompt_stats:?} for the \
             prompt, its logits' nmse {e:.1e}",
            model.device().name()
        );
        // A wrong weight in one mat-mul moves the logits far more (nmse above 0.1).
        assert!(
            e < 1e-2,
            "the prompt's logits differ from the CPU's: nmse {e:e}"
        );
        if threshold == 0 {
            assert_eq!(prompt_stats, Default::default());
            continue;
        }
        assert_eq!(prompt_stats.ops, 7 * cpu_layers as u64);
        assert_eq!(prompt_stats.bytes, cpu_layer_mat_mul_bytes(&model, 1));
        let mut got = Vec::new();
        for _ in 0..steps {
            let t = argmax(&logits) as u32;
            got.push(t);
            logits = ctx.eval(&[t], false).unwrap();
        }
        let matched = got.iter().zip(&want).take_while(|(a, b)| a == b).count();
        println!("tokens matched {matched}/{steps}, the CPU's first near-tie at {tie}");
        assert!(matched >= tie, "{got:?} vs the CPU's {want:?}");
        assert_eq!(
            ctx.offload_stats(),
            prompt_stats,
            "decode steps offload nothing"
        );
    }
}
