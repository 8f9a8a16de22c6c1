//! Tensor parallelism of every architecture's block on meta devices of CPU parts, with small
//! random-weight models: a synthetic Llama file rewritten as each architecture (its keys
//! renamed, the tensors the architecture adds drawn at random, Phi 3's Q/K/V and gate/up fused
//! into one tensor each). Each model has 4 query and 2 KV heads and a separate output head, so
//! `0.7,0.3` splits by KV heads and `0.4,0.3,0.3` by query heads with K and V on every part;
//! the output head is split by vocabulary rows (under Gemma 2's final soft-cap). In precise mode
//! nothing is quantized twice, so split or not the logits agree to rounding and greedy gives
//! the CPU's tokens.

mod common;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use tessera::cpu::CpuDevice;
use tessera::meta::{MetaDevice, MetaOptions, SplitMode, SplitRatios};
use tessera::Device;
use tessera_core::gguf::{GgufFile, GgufValue, GgufWriter};
use tessera_core::DType;
use tessera_llm::{ContextParams, Model};

use common::{greedy_in, nmse};

const N_EMBD: usize = 256;
const N_HEAD: usize = 4;
const N_HEAD_KV: usize = 2;
const HEAD_DIM: usize = N_EMBD / N_HEAD;
const N_FF: usize = 512;
const N_LAYER: usize = 2;
/// Positions a sliding-window layer sees (shorter than the prompt plus the steps).
const WINDOW: u32 = 8;

/// A deterministic stream of numbers in [-1, 1).
struct Noise(u64);

impl Noise {
    fn next(&mut self) -> f32 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }

    /// `n` f32 values `base + scale * noise`, as bytes.
    fn f32s(&mut self, n: usize, base: f32, scale: f32) -> Vec<u8> {
        (0..n)
            .flat_map(|_| (base + scale * self.next()).to_le_bytes())
            .collect()
    }
}

/// The synthetic Llama model every architecture's file is made from.
fn llama_file(dir: &Path) -> PathBuf {
    let path = dir.join("llama.gguf");
    let shape = tessera_llm::synth::Shape {
        n_embd: N_EMBD,
        n_layer: N_LAYER,
        n_ff: N_FF,
        n_head: N_HEAD,
        n_head_kv: N_HEAD_KV,
        n_vocab: 2000,
        rope_base: 10_000.0,
        n_ctx_train: 2048,
        tied_output: false,
    };
    tessera_llm::synth::synth_shape(&shape, DType::Q8_0, &path, &mut |_, _| {}).unwrap();
    path
}

/// `src` (a Llama file) rewritten as architecture `arch` at `out`.
fn rewrite_as(src: &Path, arch: &str, out: &Path) {
    let f = GgufFile::open(src).unwrap();
    let mut w = GgufWriter::new();
    for (k, v) in &f.metadata {
        let (k, v) = match k.strip_prefix("llama.") {
            Some(rest) => (format!("{arch}.{rest}"), v.clone()),
            None if k == "general.architecture" => (k.clone(), GgufValue::from(arch)),
            None => (k.clone(), v.clone()),
        };
        w.add_metadata(k, v).unwrap();
    }
    let key = |k: &str| format!("{arch}.{k}");
    match arch {
        "granite" => {
            w.add_metadata(key("embedding_scale"), 6.0f32).unwrap();
            w.add_metadata(key("residual_scale"), 0.5f32).unwrap();
            w.add_metadata(key("logit_scale"), 4.0f32).unwrap();
        }
        "gemma2" | "gemma3" => {
            w.add_metadata(key("attention.sliding_window"), WINDOW)
                .unwrap();
            // Layer 0 sees a window, layer 1 everything.
            w.add_metadata(key("attention.sliding_window_pattern"), 2u32)
                .unwrap();
        }
        _ => {}
    }
    let bytes = f.bytes();
    let data = |name: &str| -> &[u8] {
        let t = f.tensors.iter().find(|t| t.name == name).unwrap();
        let start = f.data_offset as usize + t.offset as usize;
        &bytes[start..start + t.size as usize]
    };
    let fused: &[&str] = if arch == "phi3" {
        &["attn_q", "attn_k", "attn_v", "ffn_gate", "ffn_up"]
    } else {
        &[]
    };
    let mut noise = Noise(0x9e37_79b9_7f4a_7c15);
    for t in &f.tensors {
        let kind = t
            .name
            .strip_prefix("blk.")
            .and_then(|r| r.split_once('.'))
            .map(|(_, k)| k.trim_end_matches(".weight"));
        if kind.is_some_and(|k| fused.contains(&k)) {
            continue;
        }
        let ne = &t.ne[..t.n_dims as usize];
        w.add_tensor(t.name.clone(), t.dtype, ne, data(&t.name).to_vec())
            .unwrap();
    }
    if arch == "llama" {
        // Llama 3's rope frequency factors.
        w.add_tensor(
            "rope_freqs.weight",
            DType::F32,
            &[HEAD_DIM as u64 / 2],
            noise.f32s(HEAD_DIM / 2, 4.0, 3.0),
        )
        .unwrap();
    }
    let (q, kv) = ((N_HEAD * HEAD_DIM) as u64, (N_HEAD_KV * HEAD_DIM) as u64);
    for l in 0..N_LAYER {
        let name = |k: &str| format!("blk.{l}.{k}");
        let mut vec = |w: &mut GgufWriter, k: &str, n: u64, base: f32, scale: f32| {
            w.add_tensor(
                name(k),
                DType::F32,
                &[n],
                noise.f32s(n as usize, base, scale),
            )
            .unwrap();
        };
        match arch {
            "qwen2" => {
                vec(&mut w, "attn_q.bias", q, 0.0, 0.5);
                vec(&mut w, "attn_k.bias", kv, 0.0, 0.5);
                vec(&mut w, "attn_v.bias", kv, 0.0, 0.05);
            }
            "qwen3" | "gemma3" => {
                vec(&mut w, "attn_q_norm.weight", HEAD_DIM as u64, 1.0, 0.5);
                vec(&mut w, "attn_k_norm.weight", HEAD_DIM as u64, 1.0, 0.5);
            }
            _ => {}
        }
        if arch.starts_with("gemma") {
            vec(
                &mut w,
                "post_attention_norm.weight",
                N_EMBD as u64,
                1.0,
                0.5,
            );
            vec(&mut w, "post_ffw_norm.weight", N_EMBD as u64, 1.0, 0.5);
        }
        if arch == "phi3" {
            let join = |parts: &[&str]| -> Vec<u8> {
                parts.iter().flat_map(|k| data(&name(k)).to_vec()).collect()
            };
            let dt = f
                .tensors
                .iter()
                .find(|t| t.name == name("attn_q.weight"))
                .unwrap()
                .dtype;
            let qkv = join(&["attn_q.weight", "attn_k.weight", "attn_v.weight"]);
            w.add_tensor(
                name("attn_qkv.weight"),
                dt,
                &[N_EMBD as u64, q + 2 * kv],
                qkv,
            )
            .unwrap();
            let dt = f
                .tensors
                .iter()
                .find(|t| t.name == name("ffn_up.weight"))
                .unwrap()
                .dtype;
            let up = join(&["ffn_gate.weight", "ffn_up.weight"]);
            w.add_tensor(
                name("ffn_up.weight"),
                dt,
                &[N_EMBD as u64, 2 * N_FF as u64],
                up,
            )
            .unwrap();
        }
    }
    w.write_file(out).unwrap();
}

fn load(path: &Path, dev: Arc<dyn Device>) -> Arc<Model> {
    Arc::new(Model::load(path, dev, Arc::new(CpuDevice::new()), &mut |_, _| {}).unwrap())
}

fn meta(ratios: &[f64]) -> Arc<dyn Device> {
    let parts = ratios
        .iter()
        .map(|_| Arc::new(CpuDevice::new().with_precise(true)) as Arc<dyn Device>)
        .collect();
    Arc::new(MetaDevice::new(parts, &SplitRatios::Given(ratios.to_vec())).unwrap())
}

/// Greedy tokens and the logits before each.
fn greedy(model: &Arc<Model>, prompt: &[u32], steps: usize) -> (Vec<u32>, Vec<Vec<f32>>) {
    greedy_in(
        model,
        ContextParams {
            n_ctx: 256,
            ..ContextParams::default()
        },
        prompt,
        steps,
    )
}

#[test]
fn every_architecture_splits_and_matches_the_precise_cpu() {
    let dir = std::env::temp_dir().join(format!("tessera-meta-arch-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let llama = llama_file(&dir);
    let prompt = [1u32, 50, 300, 1200, 7, 99, 640, 12, 1500, 33];
    for arch in [
        "llama", "granite", "qwen2", "qwen3", "gemma2", "gemma3", "phi3",
    ] {
        let path = dir.join(format!("{arch}.gguf"));
        rewrite_as(&llama, arch, &path);
        let cpu = load(&path, Arc::new(CpuDevice::new().with_precise(true)));
        assert_eq!(cpu.config.arch.name(), arch);
        let (toks, want) = greedy(&cpu, &prompt, 4);
        for (ratios, by_kv) in [(vec![0.7, 0.3], true), (vec![0.4, 0.3, 0.3], false)] {
            let model = load(&path, meta(&ratios));
            let sh = model.sharding().expect("a sharded model");
            assert_eq!(sh.kv_heads().is_some(), by_kv, "{arch} {ratios:?}");
            let (got_toks, got) = greedy(&model, &prompt, 4);
            for (i, (w, g)) in want.iter().zip(&got).enumerate() {
                let e = nmse(w, g);
                println!("{arch} {ratios:?} step {i}: logits nmse {e:.1e}");
                assert!(
                    e < 1e-6,
                    "{arch} {ratios:?} step {i}: logits differ from the CPU's (nmse {e:e})"
                );
            }
            assert_eq!(got_toks, toks, "{arch} {ratios:?}");
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A CPU and a wgpu adapter (lavapipe in CI) as one meta device, both ways of splitting the
/// heads: the logits are as close to the precise CPU's as those of the wgpu adapter alone
/// (whose kernels round differently from the CPU's), within a factor of 4 (a part reading the
/// wrong heads would be off by orders of magnitude). Skipped, saying so, when
/// the facade has no wgpu device (built without the `wgpu` feature).
#[test]
fn every_architecture_on_cpu_and_wgpu_parts() {
    let Ok(gpu) = tessera::registry().find("wgpu:0") else {
        println!("skipped: no wgpu:0 device (build with the wgpu feature)");
        return;
    };
    let dir = std::env::temp_dir().join(format!("tessera-meta-arch-wgpu-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let llama = llama_file(&dir);
    let prompt = [1u32, 50, 300, 1200, 7, 99, 640, 12, 1500, 33];
    for arch in [
        "llama", "granite", "qwen2", "qwen3", "gemma2", "gemma3", "phi3",
    ] {
        let path = dir.join(format!("{arch}.gguf"));
        rewrite_as(&llama, arch, &path);
        let (_, want) = greedy(
            &load(&path, Arc::new(CpuDevice::new().with_precise(true))),
            &prompt,
            2,
        );
        let (_, alone) = greedy(&load(&path, gpu.clone()), &prompt, 2);
        let base = want
            .iter()
            .zip(&alone)
            .map(|(w, a)| nmse(w, a))
            .fold(0.0, f64::max);
        // By KV heads; by query heads with the wgpu part's one query head reading KV head 0.
        for ratios in [vec![0.5, 0.5], vec![0.3, 0.3, 0.4]] {
            let mut parts: Vec<Arc<dyn Device>> = vec![gpu.clone()];
            parts.extend((1..ratios.len()).map(|_| Arc::new(CpuDevice::new()) as Arc<dyn Device>));
            let dev: Arc<dyn Device> = Arc::new(
                MetaDevice::with_options(
                    parts,
                    &SplitRatios::Given(ratios.clone()),
                    MetaOptions::default().with_split_mode(SplitMode::Tensor),
                )
                .unwrap(),
            );
            let (_, got) = greedy(&load(&path, dev), &prompt, 2);
            let e = want
                .iter()
                .zip(&got)
                .map(|(w, g)| nmse(w, g))
                .fold(0.0, f64::max);
            println!("{arch} {ratios:?}: logits nmse {e:.1e} (wgpu alone {base:.1e})");
            assert!(
                e < 4.0 * base.max(1e-6),
                "{arch} {ratios:?}: logits nmse {e:e}, the wgpu adapter alone {base:e}"
            );
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}
