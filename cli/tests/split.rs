//! The layer split from the command line: `--split-mode`, `--gpu-layers` and the plan that
//! `tessera devices --model` prints; bad settings are one-line errors.

use std::process::Command;

fn tessera(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_tessera"))
        .args(args)
        .env("RUST_LOG", "off")
        .output()
        .expect("the binary runs");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn model() -> String {
    tessera_llm::fetch::test_model(&mut |_| {})
        .expect("the test model is fetched or cached")
        .display()
        .to_string()
}

#[test]
fn devices_prints_the_layer_plan_with_a_part_that_gets_none() {
    let m = model();
    let (code, out, err) = tessera(&[
        "devices",
        "--meta",
        "cpu,cpu,cpu",
        "--split-mode",
        "layer",
        "--split",
        "2,1,0",
        "--model",
        &m,
        "--ctx",
        "512",
    ]);
    assert_eq!(code, 0, "{err}");
    println!("{out}");
    assert!(
        out.contains("layer split over cpu 67%, cpu 33%, cpu 0%"),
        "{out}"
    );
    assert!(
        out.contains("30 layers split by layers, context 512"),
        "{out}"
    );
    assert!(out.contains("layers   0..20  ( 20)"), "{out}");
    assert!(out.contains("layers  20..30  ( 10) + output head"), "{out}");
    assert!(out.contains("part 2: cpu          no layers"), "{out}");
}

#[test]
fn generate_split_by_layers_gives_the_single_cpus_text() {
    let m = model();
    let run = |extra: &[&str]| {
        let mut args = vec![
            "generate",
            "--model",
            &m,
            "--prompt",
            "The capital of France is",
            "--temp",
            "0",
            "--max-tokens",
            "8",
        ];
        args.extend_from_slice(extra);
        let (code, out, err) = tessera(&args);
        assert_eq!(code, 0, "{extra:?}: {err}");
        // The text, without the speed line.
        out.lines()
            .filter(|l| !l.contains("tokens/s"))
            .collect::<Vec<_>>()
            .join("\n")
    };
    let want = run(&["--device", "cpu"]);
    let got = run(&[
        "--device",
        "meta:cpu,cpu",
        "--split-mode",
        "layer",
        "--split",
        "1,3",
    ]);
    assert_eq!(got, want);
}

#[test]
fn bad_split_settings_are_one_line_errors() {
    let m = model();
    for (args, words) in [
        (
            vec![
                "generate",
                "--device",
                "cpu",
                "--split-mode",
                "layer",
                "--prompt",
                "x",
            ],
            vec!["--split-mode", "--gpu-layers"],
        ),
        (
            vec![
                "generate",
                "--device",
                "meta:cpu,cpu",
                "--split-mode",
                "rows",
                "--prompt",
                "x",
            ],
            vec!["rows", "tensor, layer or auto"],
        ),
        (
            vec![
                "generate",
                "--device",
                "cpu",
                "--gpu-layers",
                "4",
                "--prompt",
                "x",
            ],
            vec!["4 GPU layers", "cpu"],
        ),
        (
            vec![
                "generate",
                "--device",
                "meta:cpu,cpu",
                "--split-mode",
                "tensor",
                "--gpu-layers",
                "4",
                "--prompt",
                "x",
            ],
            vec!["layer split mode"],
        ),
        (
            vec![
                "generate",
                "--device",
                "meta:cpu,cpu",
                "--split",
                "1,2,3",
                "--prompt",
                "x",
            ],
            vec!["3 entries", "2 parts"],
        ),
        (
            vec!["generate", "--device", "meta:[cpu,cpu", "--prompt", "x"],
            vec!["bracket"],
        ),
    ] {
        let mut args = args.clone();
        args.extend_from_slice(&["--model", &m]);
        let (code, _, err) = tessera(&args);
        assert_ne!(code, 0, "{args:?} should fail");
        assert!(!err.contains("panicked"), "{args:?}: {err}");
        let lines: Vec<&str> = err.lines().filter(|l| !l.trim().is_empty()).collect();
        assert_eq!(lines.len(), 1, "{args:?}: {lines:?}");
        for w in words {
            assert!(lines[0].contains(w), "{:?} should mention {w:?}", lines[0]);
        }
    }
}

/// With layers on the CPU beside a GPU part, the plan says whether prompts offload the CPU
/// layers' mat-muls and how much it reserves for them. Skipped, saying so, where the binary
/// has no wgpu:0 device.
#[test]
fn devices_prints_whether_prompts_offload_the_cpu_layers() {
    let m = model();
    let plan = |offload: &str| {
        tessera(&[
            "devices",
            "--meta",
            "wgpu:0,cpu",
            "--split-mode",
            "layer",
            "--split",
            "1,1",
            "--model",
            &m,
            "--ctx",
            "512",
            "--op-offload",
            offload,
        ])
    };
    let (code, out, err) = plan("64");
    if code != 0 && err.contains("wgpu") {
        println!("skipped: no wgpu:0 device here ({err})");
        return;
    }
    assert_eq!(code, 0, "{err}");
    println!("{out}");
    assert!(
        out.contains(
            "op offload: steps of 64 tokens or more compute the CPU layers' mat-muls on wgpu:0"
        ),
        "{out}"
    );
    let reserved: f64 = out
        .split("MiB reserved")
        .next()
        .and_then(|s| s.rsplit('(').next())
        .and_then(|s| s.trim().parse().ok())
        .expect("the reserved size is printed");
    assert!(reserved > 0.0, "{out}");
    let (code, out, err) = plan("0");
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("op offload: off"), "{out}");
}
