//! One small random-weight model per quant type against llama.cpp's outputs for it
//! (llm/tests/data/quant/TYPE.json, made by scripts/reference/make_quant_model_references.py):
//! `synth --like quant-small --type TYPE` for every newer GGUF type (IQ1_S, IQ2_XXS and IQ2_XS,
//! whose quantizers need an importance matrix, as random blocks) and llama.cpp's IQ4_XS mix,
//! one test per type so that each passes or fails by name.
//!
//! The rules are those of arch_reference.rs: the same file written again (checked by sha256),
//! the prompt's tokens, the last prompt position's logits within [`LOGIT_TOL`], greedy ids up
//! to llama.cpp's first near-tie. llama.cpp ran a copy of each file dequantized to F32 (ggml's
//! dequantize; the script says why), so the CPU runs the quantized file in precise mode (f32
//! activations, each weight block dequantized as it is read): both then multiply the same
//! weight values, and a block read wrongly anywhere moves the logits by far more than the
//! tolerance. Other devices run with a precise CPU beside them for the nodes they decline.

mod common;

use std::path::PathBuf;
use std::sync::Arc;

use sha2::{Digest, Sha256};
use tessera::cpu::CpuDevice;
use tessera::Device;
use tessera_llm::synth::{self, Like, SynthType};
use tessera_llm::{Context, ContextParams, Model};

use common::{argmax, floats, ids};

/// Largest difference allowed between one of our last-prompt-position logits and llama.cpp's
/// (as for the architectures' F16 references).
const LOGIT_TOL: f32 = 1.0;

/// Gaps below this are near-ties: greedy ids are compared up to the first one.
const NEAR_TIE: f64 = 0.5;

/// The reference of a type.
fn reference(ty: SynthType) -> serde_json::Value {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/quant")
        .join(format!("{}.json", ty.name()));
    let text =
        std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("reading {}: {e}", p.display()));
    serde_json::from_str(&text).expect("reference JSON parses")
}

/// Writes the model of `ty` into a temporary file, checking that it is the reference's.
fn write_model(ty: SynthType, r: &serde_json::Value) -> PathBuf {
    assert_eq!(r["synth"]["type"].as_str(), Some(ty.name()));
    assert_eq!(r["synth"]["like"].as_str(), Some(Like::QuantSmall.name()));
    let path = std::env::temp_dir().join(format!(
        "tessera-quant-{}-{}.gguf",
        ty.name(),
        std::process::id()
    ));
    synth::synth(Like::QuantSmall, ty, &path, &mut |_, _| {}).unwrap();
    let sum = format!("{:x}", Sha256::digest(std::fs::read(&path).unwrap()));
    assert_eq!(
        sum,
        r["synth"]["sha256"].as_str().unwrap(),
        "{}: synth no longer writes the file llama.cpp's reference was made from; rerun \
         scripts/reference/make_quant_model_references.py",
        ty.name()
    );
    path
}

/// Runs every prompt of `ty`'s reference on `dev`; returns the failures, having printed one
/// line per prompt.
fn compare(ty: SynthType, device: &str, dev: Arc<dyn Device>) -> Vec<String> {
    let r = reference(ty);
    let path = write_model(ty, &r);
    let loaded = Model::load(&path, dev, precise_cpu(), &mut |_, _| {});
    let _ = std::fs::remove_file(&path);
    let model = Arc::new(loaded.unwrap_or_else(|e| panic!("{}: does not load: {e}", ty.name())));
    let n_ctx = r["llama_cpp"]["settings"]["n_ctx"].as_u64().unwrap() as usize;
    let mut failures = Vec::new();
    for p in r["prompts"].as_array().unwrap() {
        let name = p["name"].as_str().unwrap();
        let prompt = ids(&p["prompt_ids"]);
        let text = p["text"].as_str().unwrap();
        if model.tokenizer.encode(text, true, true).unwrap() != prompt {
            failures.push(format!("{name}: tokens differ from llama.cpp's"));
        }
        let params = ContextParams {
            n_ctx,
            ..ContextParams::default()
        };
        let mut ctx = Context::new(model.clone(), params).unwrap();
        let mut logits = ctx.eval(&prompt, false).unwrap();
        let want_logits = floats(&p["last_prompt_logits"]);
        assert_eq!(logits.len(), want_logits.len());
        let worst = logits
            .iter()
            .zip(&want_logits)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        if worst > LOGIT_TOL {
            failures.push(format!(
                "{name}: last prompt logits: max |ours - llama.cpp| {worst:.3} > {LOGIT_TOL}"
            ));
        }
        let want = ids(&p["ids"]);
        let tie = p["gaps"]
            .as_array()
            .unwrap()
            .iter()
            .position(|g| g.as_f64().unwrap() < NEAR_TIE)
            .unwrap_or(want.len());
        let mut got = Vec::new();
        for _ in 0..tie {
            let t = argmax(&logits) as u32;
            got.push(t);
            logits = ctx.eval(&[t], false).unwrap();
        }
        let matched = got.iter().zip(&want).take_while(|(a, b)| a == b).count();
        if matched < tie {
            failures.push(format!(
                "{name}: greedy ids diverge at step {matched}, before the first near-tie at {tie}"
            ));
        }
        println!(
            "{} on {device}, {name}: {} prompt tokens; last-position max |d| {worst:.3}; \
             greedy matched {matched} (first near-tie at {tie})",
            ty.name(),
            prompt.len()
        );
    }
    failures
}

/// The CPU in precise mode.
fn precise_cpu() -> Arc<dyn Device> {
    Arc::new(CpuDevice::new().with_precise(true))
}

/// Compares `ty` on the precise CPU and fails if any prompt differs.
fn check(name: &str) {
    let ty = SynthType::from_name(name).unwrap();
    let failures = compare(ty, "cpu", precise_cpu());
    assert!(failures.is_empty(), "{name}: {failures:#?}");
}

#[test]
fn iq1_s_matches_llama_cpp() {
    check("iq1_s");
}
#[test]
fn iq1_m_matches_llama_cpp() {
    check("iq1_m");
}
#[test]
fn iq2_xxs_matches_llama_cpp() {
    check("iq2_xxs");
}
#[test]
fn iq2_xs_matches_llama_cpp() {
    check("iq2_xs");
}
#[test]
fn iq2_s_matches_llama_cpp() {
    check("iq2_s");
}
#[test]
fn iq3_xxs_matches_llama_cpp() {
    check("iq3_xxs");
}
#[test]
fn iq3_s_matches_llama_cpp() {
    check("iq3_s");
}
#[test]
fn iq4_nl_matches_llama_cpp() {
    check("iq4_nl");
}
#[test]
fn iq4_xs_matches_llama_cpp() {
    check("iq4_xs");
}
#[test]
fn tq1_0_matches_llama_cpp() {
    check("tq1_0");
}
#[test]
fn tq2_0_matches_llama_cpp() {
    check("tq2_0");
}
#[test]
fn mxfp4_matches_llama_cpp() {
    check("mxfp4");
}
#[test]
fn iq4_xs_mix_matches_llama_cpp() {
    check("iq4_xs_mix");
}

/// Every type on every non-CPU device present (CUDA GPUs; wgpu adapters, lavapipe in CI), with
/// the same rules; absent backends are reported as skipped by name. A software adapter (each
/// type costs it half a minute of CI) takes only IQ4_NL, IQ4_XS, MXFP4 and the IQ4_XS mix: wgpu
/// declines the lattice types (their nodes run on the precise CPU, as in the tests above), and
/// its ternary shaders are covered by the conformance suite.
#[test]
fn every_type_on_every_gpu_device_matches_llama_cpp() {
    let mut failures = Vec::new();
    let mut tested = 0;
    for dev in common::non_cpu_devices() {
        let software = dev.kind() == tessera::core::DeviceKind::Software;
        for &name in &SynthType::NAMES[5..] {
            let table = matches!(name, "iq4_nl" | "iq4_xs" | "mxfp4" | "iq4_xs_mix");
            if name == "q4_k_m" || (software && !table) {
                continue;
            }
            let ty = SynthType::from_name(name).unwrap();
            failures.extend(compare(ty, &dev.name(), dev.clone()));
        }
        tested += 1;
    }
    println!("{tested} non-CPU devices tested");
    assert!(failures.is_empty(), "{failures:#?}");
}
