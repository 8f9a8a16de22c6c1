//! Shared by the end-to-end tests: the test model (fetched and cached as the CLI does) and
//! llama.cpp's reference outputs from ../shared/reference.

#![allow(dead_code)]

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use tessera::cpu::CpuDevice;
use tessera::Device;
use tessera_llm::{fetch, Model};

/// The reference directory beside the checkout.
pub fn reference_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../shared/reference")
}

/// A reference JSON file, parsed.
pub fn reference(name: &str) -> serde_json::Value {
    let p = reference_dir().join(name);
    let text =
        std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("reading {}: {e}", p.display()));
    serde_json::from_str(&text).expect("reference JSON parses")
}

/// The test model's path, fetched on first use.
pub fn model_path() -> PathBuf {
    fetch::test_model(&mut |_| {}).expect("the test model is fetched or cached")
}

/// The test model on the CPU (default mode: activations quantized as llama.cpp does).
pub fn cpu_model() -> Arc<Model> {
    static M: OnceLock<Arc<Model>> = OnceLock::new();
    M.get_or_init(|| load(CpuDevice::new())).clone()
}

/// The test model on the CPU in precise mode (no activation quantization).
pub fn precise_model() -> Arc<Model> {
    static M: OnceLock<Arc<Model>> = OnceLock::new();
    M.get_or_init(|| load(CpuDevice::new().with_precise(true)))
        .clone()
}

fn load(cpu: CpuDevice) -> Arc<Model> {
    let dev: Arc<dyn Device> = Arc::new(cpu);
    Arc::new(Model::load(model_path(), dev.clone(), dev, &mut |_, _| {}).expect("the model loads"))
}

/// The ids of a JSON array.
pub fn ids(v: &serde_json::Value) -> Vec<u32> {
    v.as_array()
        .expect("an array")
        .iter()
        .map(|x| x.as_u64().expect("an id") as u32)
        .collect()
}

/// The floats of a JSON array.
pub fn floats(v: &serde_json::Value) -> Vec<f32> {
    v.as_array()
        .expect("an array")
        .iter()
        .map(|x| x.as_f64().expect("a number") as f32)
        .collect()
}

/// Index of the largest value (lowest index on ties).
pub fn argmax(v: &[f32]) -> usize {
    let mut best = 0;
    for (i, &x) in v.iter().enumerate() {
        if x > v[best] {
            best = i;
        }
    }
    best
}

/// The Gemma 3 270M Q4_K_M file.
pub fn gemma3_path() -> PathBuf {
    let p = fetch::cache_dir()
        .join("models")
        .join("gemma-3-270m-q4_k_m.gguf");
    assert!(p.exists(), "{} is not cached", p.display());
    p
}

/// Every non-CPU device of every compiled-in backend (wgpu adapters, CUDA GPUs); a backend
/// without devices is reported as skipped, by name and reason.
pub fn non_cpu_devices() -> Vec<Arc<dyn Device>> {
    let mut out = Vec::new();
    for b in tessera::registry().backends() {
        match &b.devices {
            Ok(d) if !d.is_empty() => out.extend(
                d.iter()
                    .filter(|d| d.kind() != tessera::core::DeviceKind::Cpu)
                    .cloned(),
            ),
            Ok(_) => println!("{}: skipped (no devices)", b.backend),
            Err(why) => println!("{}: skipped ({why})", b.backend),
        }
    }
    out
}

/// Greedy tokens of `prompt` for `steps` steps in a fresh context of `params`, and the logits
/// before each.
pub fn greedy_in(
    model: &Arc<Model>,
    params: tessera_llm::ContextParams,
    prompt: &[u32],
    steps: usize,
) -> (Vec<u32>, Vec<Vec<f32>>) {
    let mut ctx = tessera_llm::Context::new(model.clone(), params).unwrap();
    let mut logits = ctx.eval(prompt, false).unwrap();
    let (mut toks, mut all) = (Vec::new(), Vec::new());
    for _ in 0..steps {
        let t = argmax(&logits) as u32;
        toks.push(t);
        all.push(std::mem::replace(
            &mut logits,
            ctx.eval(&[t], false).unwrap(),
        ));
    }
    (toks, all)
}

/// The gap between the largest and the second largest logit.
pub fn top2_gap(logits: &[f32]) -> f32 {
    let t = argmax(logits);
    let second = logits
        .iter()
        .enumerate()
        .filter(|&(i, _)| i != t)
        .map(|(_, &v)| v)
        .fold(f32::MIN, f32::max);
    logits[t] - second
}

/// The error of `got` against `want`, normalized by `want`'s energy.
pub fn nmse(want: &[f32], got: &[f32]) -> f64 {
    let num: f64 = want
        .iter()
        .zip(got)
        .map(|(a, b)| ((a - b) as f64).powi(2))
        .sum();
    num / want.iter().map(|a| (*a as f64).powi(2)).sum::<f64>()
}
