//! `tessera perplexity` and `tessera models`: the output llama.cpp's tool prints, one-line
//! errors for bad input, and the known models listed with what is cached.

use std::path::PathBuf;
use std::process::Command;

/// Runs the command; returns its exit code, stdout and stderr.
fn tessera(args: &[&str], envs: &[(&str, &str)]) -> (i32, String, String) {
    let mut c = Command::new(env!("CARGO_BIN_EXE_tessera"));
    c.args(args).env("RUST_LOG", "off");
    for (k, v) in envs {
        c.env(k, v);
    }
    let out = c.output().expect("the binary runs");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Runs the command and checks it failed with one `error:` line mentioning `words`.
fn fails(args: &[&str], words: &[&str]) {
    let (code, _, err) = tessera(args, &[]);
    assert_ne!(code, 0, "{args:?} should fail; stderr: {err}");
    assert!(!err.contains("panicked"), "{args:?} panicked: {err}");
    let lines: Vec<&str> = err.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "{args:?}: one error line, got {lines:?}");
    assert!(lines[0].starts_with("error: "), "{lines:?}");
    for w in words {
        assert!(lines[0].contains(w), "{:?} should mention {w:?}", lines[0]);
    }
}

/// A scratch directory of this test process.
fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("tessera-cli-ppl-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d.join(name)
}

fn text() -> String {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../llm/tests/data/perplexity/essays.txt")
        .display()
        .to_string()
}

/// The test model's path (fetched on first use), so that the runs below need no fetch.
fn model() -> String {
    tessera_llm::fetch::test_model(&mut |_| {})
        .expect("the test model is fetched or cached")
        .display()
        .to_string()
}

#[test]
fn perplexity_prints_running_values_and_the_final_estimate() {
    let m = model();
    let t = text();
    let args = [
        "perplexity",
        "--device",
        "cpu",
        "--model",
        &m,
        "--file",
        &t,
        "--ctx",
        "32",
        "--chunks",
        "3",
    ];
    let (code, out, err) = tessera(&args, &[]);
    assert_eq!(code, 0, "{err}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 2, "{out}");
    let running: Vec<f64> = lines[0]
        .trim_end_matches(',')
        .split(',')
        .enumerate()
        .map(|(i, v)| {
            let v = v
                .strip_prefix(&format!("[{}]", i + 1))
                .unwrap_or_else(|| panic!("{v} is not [{}]X", i + 1));
            v.parse().unwrap()
        })
        .collect();
    assert_eq!(running.len(), 3, "{out}");
    let fin = lines[1]
        .strip_prefix("Final estimate: PPL = ")
        .unwrap_or_else(|| panic!("{}", lines[1]));
    let (ppl, error) = fin.split_once(" +/- ").unwrap();
    let (ppl, error): (f64, f64) = (ppl.parse().unwrap(), error.parse().unwrap());
    // The final estimate is the running value after the last chunk.
    assert!((ppl - running[2]).abs() < 1e-4, "{out}");
    assert!(ppl > 1.0 && error > 0.0 && error < ppl, "{out}");

    let mut json_args = args.to_vec();
    json_args.push("--json");
    let (code, out, err) = tessera(&json_args, &[]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(v["n_chunks"], 3);
    assert_eq!(v["n_scored"], 3 * (32 - 16 - 1));
    assert!((v["ppl"].as_f64().unwrap() - ppl).abs() < 1e-4 * ppl);
}

#[test]
fn perplexity_refuses_bad_input_in_one_line() {
    let m = model();
    let t = text();
    let short = tmp("short.txt");
    std::fs::write(&short, "Too short a text to score.\n").unwrap();
    let s = short.display().to_string();
    let base = ["perplexity", "--device", "cpu", "--model", &m];
    let with = |extra: &[&str]| -> Vec<String> {
        base.iter().chain(extra).map(|x| x.to_string()).collect()
    };
    let run = |extra: &[&str], words: &[&str]| {
        let a = with(extra);
        let a: Vec<&str> = a.iter().map(String::as_str).collect();
        fails(&a, words);
    };
    run(&["--file", &s], &["tokens", "needs at least 1024"]);
    run(
        &["--file", "/nonexistent/text.txt"],
        &["/nonexistent/text.txt"],
    );
    run(&["--file", &t, "--ctx", "2"], &["at least 3"]);
    run(&["--file", &t, "--batch", "0"], &["--batch"]);
    run(&["--file", &t, "--chunks", "0"], &["at least one chunk"]);
    fails(
        &["perplexity", "--model", "no-such-model", "--file", &t],
        &["no-such-model not found", "gemma3-270m", "smollm2-135m"],
    );
}

#[test]
fn models_lists_the_known_names_and_what_is_cached() {
    let cache = tmp("cache");
    let c = cache.display().to_string();
    let (code, out, err) = tessera(&["models"], &[("TESSERA_CACHE", &c)]);
    assert_eq!(code, 0, "{err}");
    for name in ["gemma3-270m", "smollm2-135m"] {
        assert!(out.lines().any(|l| l.starts_with(name)), "{out}");
    }
    assert_eq!(out.matches("not cached").count(), 2, "{out}");

    // A file of the model's size where the cache keeps it counts as cached (a fetch only ever
    // renames a checked file there).
    let models = cache.join("models");
    std::fs::create_dir_all(&models).unwrap();
    let f = std::fs::File::create(models.join("SmolLM2-135M-Instruct.Q4_1.gguf")).unwrap();
    f.set_len(98_362_432).unwrap();
    let (code, out, err) = tessera(&["models"], &[("TESSERA_CACHE", &c)]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(out.matches("not cached").count(), 1, "{out}");
    assert!(
        out.contains(&format!(
            "cached: {} (98.4 MB)",
            models.join("SmolLM2-135M-Instruct.Q4_1.gguf").display()
        )),
        "{out}"
    );
    let _ = std::fs::remove_dir_all(&cache);
}
