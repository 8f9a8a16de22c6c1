//! Every architecture's small random-weight model against llama.cpp's outputs for it
//! (llm/tests/data/arch/NAME.json, made by scripts/reference/make_arch_references.py), one
//! test per model so that each passes or fails by name (`cargo test --test arch_reference --
//! --skip NAME` leaves one out, and cargo lists it as filtered).
//!
//! Each test writes the model with `synth` (the JSON names the command) and checks that it is
//! the very file llama.cpp ran (same sha256), then on the CPU, per prompt:
//! - tokenization: ids equal to llama.cpp's;
//! - the last prompt position's logits: every one within [`LOGIT_TOL`] of llama.cpp's (F16
//!   weights, so that neither side quantizes activations: llama.cpp's own difference between
//!   an F16 and an F32 KV cache is under 0.6 on these models);
//! - greedy generation: ids equal to llama.cpp's up to the first step whose llama.cpp top-2 gap
//!   is below 0.5 (beyond it either choice is within noise).
//!
//! Every prompt is checked and its result printed before the test fails, so one run shows
//! where an architecture stands.

mod common;

use std::path::PathBuf;
use std::sync::Arc;

use sha2::{Digest, Sha256};
use tessera::core::gguf::GgufFile;
use tessera::cpu::CpuDevice;
use tessera::Device;
use tessera_llm::synth::{self, Like, SynthType};
use tessera_llm::tokenizer::Tokenizer;
use tessera_llm::{Context, ContextParams, Model};

use common::{argmax, floats, ids};

/// Largest difference allowed between one of our last-prompt-position logits and llama.cpp's
/// (the logits of these models spread with a standard deviation of about 24; leaving out any
/// architectural feature the controls in the JSON list moves them by at least 1.1, most by
/// far more).
const LOGIT_TOL: f32 = 1.0;

/// Gaps below this are near-ties: greedy ids are compared up to the first one.
const NEAR_TIE: f64 = 0.5;

/// The reference of a small model.
fn arch_reference(like: Like) -> serde_json::Value {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/arch")
        .join(format!("{}.json", like.name()));
    let text =
        std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("reading {}: {e}", p.display()));
    serde_json::from_str(&text).expect("reference JSON parses")
}

/// Writes the model the reference was made from into a temporary file, checking its sha256.
fn write_model(like: Like, r: &serde_json::Value) -> PathBuf {
    let s = &r["synth"];
    let ty = SynthType::from_name(s["type"].as_str().unwrap()).unwrap();
    let path = std::env::temp_dir().join(format!(
        "tessera-arch-{}-{}.gguf",
        like.name(),
        std::process::id()
    ));
    synth::synth(like, ty, &path, &mut |_, _| {}).unwrap();
    let bytes = std::fs::read(&path).unwrap();
    let sum = format!("{:x}", Sha256::digest(&bytes));
    assert_eq!(
        sum,
        s["sha256"].as_str().unwrap(),
        "{}: `{}` no longer writes the file llama.cpp's reference was made from; \
         rerun scripts/reference/make_arch_references.py",
        like.name(),
        s["command"].as_str().unwrap()
    );
    path
}

/// How one prompt compared.
struct PromptResult {
    name: String,
    failures: Vec<String>,
    summary: String,
}

/// Runs every prompt of `like`'s reference on `dev`; returns one result per prompt, or the
/// error that kept the model from loading.
fn compare(like: Like, dev: Arc<dyn Device>) -> Result<Vec<PromptResult>, String> {
    let r = arch_reference(like);
    let path = write_model(like, &r);
    let loaded = Model::load(&path, dev, Arc::new(CpuDevice::new()), &mut |_, _| {});
    let _ = std::fs::remove_file(&path);
    let model = Arc::new(loaded.map_err(|e| format!("does not load: {e}"))?);
    let n_ctx = r["llama_cpp"]["settings"]["n_ctx"].as_u64().unwrap() as usize;
    let mut out = Vec::new();
    for p in r["prompts"].as_array().unwrap() {
        let name = p["name"].as_str().unwrap().to_string();
        let mut failures = Vec::new();
        let want_prompt = ids(&p["prompt_ids"]);
        let prompt = model
            .tokenizer
            .encode(p["text"].as_str().unwrap(), true, true)
            .map_err(|e| format!("{name}: tokenizing: {e}"))?;
        if prompt != want_prompt {
            let at = prompt
                .iter()
                .zip(&want_prompt)
                .take_while(|(a, b)| a == b)
                .count();
            failures.push(format!(
                "tokens differ from llama.cpp's at {at} ({} vs {} tokens)",
                prompt.len(),
                want_prompt.len()
            ));
        }
        let params = ContextParams {
            n_ctx,
            ..ContextParams::default()
        };
        let mut ctx = Context::new(model.clone(), params).map_err(|e| format!("context: {e}"))?;
        // The reference's prompt, so that the logits are compared even where tokens differ.
        let mut logits = ctx
            .eval(&want_prompt, false)
            .map_err(|e| format!("{name}: evaluating the prompt: {e}"))?;
        let want_logits = floats(&p["last_prompt_logits"]);
        let (worst, worst_id) = logits
            .iter()
            .zip(&want_logits)
            .map(|(a, b)| (a - b).abs())
            .enumerate()
            .fold(
                (0f32, 0),
                |(m, mi), (i, d)| if d > m { (d, i) } else { (m, mi) },
            );
        if logits.len() != want_logits.len() || worst > LOGIT_TOL {
            failures.push(format!(
                "last prompt logits: max |ours - llama.cpp| {worst:.3} (token {worst_id}: {:.3} vs {:.3}) > {LOGIT_TOL}",
                logits.get(worst_id).copied().unwrap_or(f32::NAN),
                want_logits[worst_id]
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
        for _ in 0..want.len() {
            let t = argmax(&logits) as u32;
            got.push(t);
            logits = ctx
                .eval(&[t], false)
                .map_err(|e| format!("{name}: decoding: {e}"))?;
        }
        let matched = got.iter().zip(&want).take_while(|(a, b)| a == b).count();
        if matched < tie {
            failures.push(format!(
                "greedy ids diverge at step {matched} ({} vs llama.cpp {}), before the first near-tie at {tie}",
                got[matched], want[matched]
            ));
        }
        let summary = format!(
            "{} prompt tokens; last-position max |d| {worst:.3}; greedy matched {matched}/{} (first near-tie at {tie})",
            want_prompt.len(),
            want.len()
        );
        out.push(PromptResult {
            name,
            failures,
            summary,
        });
    }
    Ok(out)
}

/// Compares `like` on `dev` (named `device` in the output), printing every prompt's result,
/// and fails if any prompt does.
fn check(like: Like, device: &str, dev: Arc<dyn Device>) {
    let name = like.name();
    let results = match compare(like, dev) {
        Ok(r) => r,
        Err(e) => panic!("{name} on {device}: {e}"),
    };
    let mut failed = Vec::new();
    for p in &results {
        let verdict = if p.failures.is_empty() {
            "ok"
        } else {
            "FAILED"
        };
        println!("{name} on {device}, {}: {verdict}: {}", p.name, p.summary);
        for f in &p.failures {
            println!("    {f}");
            failed.push(format!("{}: {f}", p.name));
        }
    }
    assert!(
        failed.is_empty(),
        "{name} on {device} differs from llama.cpp:\n  {}",
        failed.join("\n  ")
    );
}

fn cpu() -> Arc<dyn Device> {
    Arc::new(CpuDevice::new())
}

#[test]
fn llama3_small_with_rope_factors_matches_llama_cpp() {
    check(Like::Llama3Small, "cpu", cpu());
}

#[test]
fn qwen2_small_matches_llama_cpp() {
    check(Like::Qwen2Small, "cpu", cpu());
}

#[test]
fn qwen3_small_matches_llama_cpp() {
    check(Like::Qwen3Small, "cpu", cpu());
}

#[test]
fn gemma2_small_matches_llama_cpp() {
    check(Like::Gemma2Small, "cpu", cpu());
}

#[test]
fn gemma3_small_matches_llama_cpp() {
    check(Like::Gemma3Small, "cpu", cpu());
}

#[test]
fn phi3_small_matches_llama_cpp() {
    check(Like::Phi3Small, "cpu", cpu());
}

#[test]
fn mixtral_small_matches_llama_cpp() {
    check(Like::MixtralSmall, "cpu", cpu());
}

#[test]
fn qwen2moe_small_with_shared_expert_matches_llama_cpp() {
    check(Like::Qwen2MoeSmall, "cpu", cpu());
}

#[test]
fn qwen3moe_small_matches_llama_cpp() {
    check(Like::Qwen3MoeSmall, "cpu", cpu());
}

#[test]
fn olmoe_small_matches_llama_cpp() {
    check(Like::OlmoeSmall, "cpu", cpu());
}

#[test]
fn gpt_oss_small_with_sinks_and_mxfp4_experts_matches_llama_cpp() {
    check(Like::GptOssSmall, "cpu", cpu());
}

/// Every small model has a reference of the file synth writes, and its tokenizer (which does
/// not depend on the architecture being supported) cuts every prompt as llama.cpp does.
#[test]
fn every_small_model_has_a_reference_and_tokenizes_as_llama_cpp() {
    let mut failed = Vec::new();
    for like in Like::SMALL {
        let r = arch_reference(like);
        assert_eq!(r["model"].as_str(), Some(like.name()));
        let prompts = r["prompts"].as_array().unwrap();
        assert!(prompts.len() >= 3, "{}: three prompts or more", like.name());
        let path = write_model(like, &r);
        let tok = Tokenizer::from_gguf(&GgufFile::open(&path).unwrap()).unwrap();
        std::fs::remove_file(&path).unwrap();
        for p in prompts {
            let got = tok.encode(p["text"].as_str().unwrap(), true, true).unwrap();
            let same = got == ids(&p["prompt_ids"]);
            println!(
                "{} {}: {} tokens, {}",
                like.name(),
                p["name"].as_str().unwrap(),
                got.len(),
                if same {
                    "as llama.cpp's"
                } else {
                    "DIFFERENT from llama.cpp's"
                }
            );
            if !same {
                failed.push(format!("{} {}", like.name(), p["name"]));
            }
        }
    }
    assert!(failed.is_empty(), "tokens differ: {failed:?}");
}

/// Every small model on every non-CPU device present (wgpu adapters, lavapipe in CI; CUDA GPUs),
/// with the same rules; absent backends are reported as skipped by name.
#[test]
fn every_small_model_on_every_gpu_device_matches_llama_cpp() {
    let mut tested = 0;
    for dev in common::non_cpu_devices() {
        for like in Like::SMALL {
            check(like, &dev.name(), dev.clone());
        }
        tested += 1;
    }
    println!("{tested} non-CPU devices tested");
}
