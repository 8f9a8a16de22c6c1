//! Synthetic and trimmed models: their layout, their tokenizer, and that they load and generate
//! on the CPU with finite logits.

mod common;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use tessera::core::gguf::{GgufFile, GgufWriter};
use tessera::cpu::CpuDevice;
use tessera::{DType, Device};
use tessera_llm::generate::{generate, GenerateParams};
use tessera_llm::sampling::SamplerConfig;
use tessera_llm::synth::{self, ArchShape, Like, Shape, SynthType, SYNTH_TYPES};
use tessera_llm::tokenizer::Tokenizer;
use tessera_llm::{Context, ContextParams, Model};

/// A path in a fresh temporary directory (removed by [`Scratch`]'s drop).
struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str) -> Scratch {
        let d = std::env::temp_dir().join(format!("tessera-synth-{}-{name}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        Scratch(d)
    }

    fn file(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }

    fn entries(&self) -> usize {
        std::fs::read_dir(&self.0).unwrap().count()
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A small Llama shape (fast to write and run).
fn small(tied_output: bool) -> Shape {
    Shape {
        n_embd: 256,
        n_layer: 2,
        n_ff: 512,
        n_head: 4,
        n_head_kv: 2,
        n_vocab: 2000,
        rope_base: 500_000.0,
        n_ctx_train: 2048,
        tied_output,
    }
}

/// Loads a model on the CPU, decodes a few tokens greedily checking that every logit is
/// finite, then runs [`generate`] on it. Returns the model.
fn load_and_generate(path: &Path) -> Arc<Model> {
    let cpu: Arc<dyn Device> = Arc::new(CpuDevice::new());
    let model = Arc::new(Model::load(path, cpu.clone(), cpu, &mut |_, _| {}).unwrap());
    let params = ContextParams {
        n_ctx: 256,
        ..Default::default()
    };
    let mut ctx = Context::new(model.clone(), params).unwrap();
    let prompt = model
        .tokenizer
        .encode("Once upon a time", true, false)
        .unwrap();
    let mut logits = ctx.eval(&prompt, false).unwrap();
    for step in 0..4 {
        assert_eq!(logits.len(), model.config.n_vocab);
        assert!(
            logits.iter().all(|x| x.is_finite()),
            "non-finite logit at step {step}"
        );
        let next = common::argmax(&logits) as u32;
        logits = ctx.eval(&[next], false).unwrap();
    }
    ctx.clear();
    let params = GenerateParams {
        max_tokens: 4,
        sampler: SamplerConfig::greedy(),
        stop_at_eog: false,
    };
    let g = generate(&mut ctx, &prompt, &params, &mut |_| true).unwrap();
    assert_eq!(g.ids.len(), 4);
    model
}

#[test]
fn synth_smollm2_q8_0_copies_the_layout_and_generates() {
    let dir = Scratch::new("smollm2");
    let out = dir.file("smollm2-q8_0.gguf");
    let mut last = (0, 0);
    synth::synth(
        Like::Smollm2_135m,
        SynthType::All(DType::Q8_0),
        &out,
        &mut |d, t| last = (d, t),
    )
    .unwrap();
    assert!(
        last.0 == last.1 && last.1 > 100_000_000,
        "progress ended at {last:?}"
    );

    let real = GgufFile::open(common::model_path()).unwrap();
    let f = GgufFile::open(&out).unwrap();
    assert_eq!(f.metadata.len(), real.metadata.len());
    for ((k, v), (rk, rv)) in f.metadata.iter().zip(&real.metadata) {
        assert_eq!(k, rk);
        if k == "general.file_type" {
            assert_eq!(v.as_u32(), Some(7), "MOSTLY_Q8_0");
        } else {
            assert_eq!(v, rv, "{k}");
        }
    }
    assert_eq!(f.tensors.len(), 272);
    for (t, r) in f.tensors.iter().zip(&real.tensors) {
        assert_eq!((&t.name, t.ne), (&r.name, r.ne));
        let want = match r.dtype {
            DType::Q4_1 => DType::Q8_0,
            other => other,
        };
        assert_eq!(t.dtype, want, "{}", t.name);
    }
    assert!(f.tensor("output.weight").is_err(), "tied output");
    load_and_generate(&out);
}

#[test]
fn synth_llama_shapes_in_every_type_generate() {
    let dir = Scratch::new("shapes");
    for (i, &dtype) in SYNTH_TYPES.iter().enumerate() {
        let tied = i % 2 == 0;
        let out = dir.file(&format!("small-{}.gguf", dtype.name()));
        synth::synth_shape(&small(tied), dtype, &out, &mut |_, _| {}).unwrap();
        let f = GgufFile::open(&out).unwrap();
        assert_eq!(f.tensors.len(), 1 + 2 * 9 + 1 + usize::from(!tied));
        assert_eq!(f.get_u32("llama.block_count").unwrap(), 2);
        for t in &f.tensors {
            let want = if t.n_dims == 1 { DType::F32 } else { dtype };
            assert_eq!(t.dtype, want, "{}", t.name);
        }
        let model = load_and_generate(&out);
        assert_eq!(model.config.n_vocab, 2000);
        assert_eq!(model.config.head_dim, 64);
    }
}

#[test]
fn synth_is_deterministic() {
    let dir = Scratch::new("determinism");
    let (a, b) = (dir.file("a.gguf"), dir.file("b.gguf"));
    synth::synth_shape(&small(true), DType::Q4_0, &a, &mut |_, _| {}).unwrap();
    synth::synth_shape(&small(true), DType::Q4_0, &b, &mut |_, _| {}).unwrap();
    assert!(std::fs::read(&a).unwrap() == std::fs::read(&b).unwrap());
}

#[test]
fn synth_generated_vocab_round_trips() {
    // The full Llama 3 vocabulary size, on a tiny model.
    let dir = Scratch::new("vocab");
    let out = dir.file("vocab.gguf");
    let shape = Shape {
        n_embd: 64,
        n_layer: 1,
        n_ff: 128,
        n_head: 2,
        n_head_kv: 1,
        n_vocab: 128_256,
        ..small(true)
    };
    synth::synth_shape(&shape, DType::Q8_0, &out, &mut |_, _| {}).unwrap();
    let f = GgufFile::open(&out).unwrap();
    let tok = Tokenizer::from_gguf(&f).unwrap();
    assert_eq!(tok.n_vocab(), 128_256);
    assert_eq!((tok.bos(), tok.eos()), (Some(128_000), Some(128_001)));
    assert!(tok.is_eog(tok.token_id("<|eot_id|>").unwrap()));
    for text in [
        "Once upon a time, the little boat left the harbour.",
        "  leading spaces, tabs\tand\nnew lines  ",
        "numbers 1234567 and 3.14159; symbols #@$%^&*()[]{}",
        "ünïcödé, 日本語のテキスト, emoji 😀👍",
        "",
    ] {
        let ids = tok.encode(text, false, false).unwrap();
        assert_eq!(tok.decode(&ids).unwrap(), text);
        if text.contains("boat") {
            assert!(
                ids.len() < text.len() / 2,
                "merges apply: {} tokens",
                ids.len()
            );
        }
    }
    let ids = tok
        .encode("<|start_header_id|>user<|end_header_id|>", true, true)
        .unwrap();
    assert_eq!(ids[0], 128_000, "BOS added");
    assert_eq!(ids[1], tok.token_id("<|start_header_id|>").unwrap());
    assert_eq!(
        *ids.last().unwrap(),
        tok.token_id("<|end_header_id|>").unwrap()
    );
    load_and_generate(&out);
}

#[test]
fn trim_test_model_to_two_layers() {
    let dir = Scratch::new("trim");
    let out = dir.file("trim2.gguf");
    let real = GgufFile::open(common::model_path()).unwrap();
    let mut last = (0, 0);
    synth::trim(&common::model_path(), 2, &out, &mut |d, t| last = (d, t)).unwrap();
    assert_eq!(last.0, last.1);
    let f = GgufFile::open(&out).unwrap();
    assert_eq!(f.get_u32("llama.block_count").unwrap(), 2);
    assert_eq!(f.tensors.len(), 2 * 9 + 2);
    assert_eq!(f.metadata.len(), real.metadata.len());
    for ((k, v), (_, rv)) in f.metadata.iter().zip(&real.metadata) {
        if k != "llama.block_count" {
            assert_eq!(v, rv, "{k}");
        }
    }
    for t in &f.tensors {
        let r = real.tensor(&t.name).unwrap();
        assert_eq!((t.dtype, t.ne), (r.dtype, r.ne));
        assert!(
            f.tensor_data(t) == real.tensor_data(r),
            "{} differs",
            t.name
        );
    }
    let model = load_and_generate(&out);
    assert_eq!(model.config.n_layer, 2);
}

#[test]
fn synth_and_trim_reject_bad_input() {
    let dir = Scratch::new("errors");
    let out = dir.file("out.gguf");
    let model = common::model_path();
    for layers in [0, 31] {
        let e = synth::trim(&model, layers, &out, &mut |_, _| {})
            .unwrap_err()
            .to_string();
        assert!(
            e.contains(&format!("cannot keep {layers} layers")) && e.contains("has 30"),
            "{e}"
        );
    }
    // A GGUF file of another architecture, and a file that is not GGUF.
    let bert = dir.file("bert.gguf");
    let mut w = GgufWriter::new();
    w.add_metadata("general.architecture", "bert").unwrap();
    w.write_file(&bert).unwrap();
    let e = synth::trim(&bert, 1, &out, &mut |_, _| {})
        .unwrap_err()
        .to_string();
    assert!(e.contains("'bert' is not supported"), "{e}");
    let text = dir.file("notes.txt");
    std::fs::write(&text, "not a model").unwrap();
    assert!(synth::trim(&text, 1, &out, &mut |_, _| {}).is_err());
    assert!(synth::trim(&dir.file("missing.gguf"), 1, &out, &mut |_, _| {}).is_err());

    let e = synth::synth_shape(&small(true), DType::Q5_1, &out, &mut |_, _| {})
        .unwrap_err()
        .to_string();
    assert!(e.contains("not q5_1"), "{e}");
    let e = synth::synth(
        Like::Llama8b,
        SynthType::All(DType::BF16),
        &out,
        &mut |_, _| {},
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("not bf16"), "{e}");
    let odd = Shape {
        n_head: 5,
        ..small(true)
    };
    assert!(synth::synth_shape(&odd, DType::Q4_0, &out, &mut |_, _| {}).is_err());
    let ragged = Shape {
        n_embd: 200,
        n_head: 5,
        n_head_kv: 5,
        ..small(true)
    };
    let e = synth::synth_shape(&ragged, DType::Q4_0, &out, &mut |_, _| {})
        .unwrap_err()
        .to_string();
    assert!(e.contains("not whole q4_0 blocks"), "{e}");
    let tiny = Shape {
        n_vocab: 100,
        ..small(true)
    };
    assert!(synth::synth_shape(&tiny, DType::Q4_0, &out, &mut |_, _| {}).is_err());
    assert!(Like::from_name("gpt-5")
        .unwrap_err()
        .to_string()
        .contains("llama-8b"));
    assert_eq!(Like::from_name("llama-1b").unwrap(), Like::Llama1b);
    // Nothing was written but the two inputs.
    assert_eq!(dir.entries(), 2);
}

/// The shape of tensor `name` in `f`, or a panic naming it.
fn ne(f: &GgufFile, name: &str) -> Vec<u64> {
    f.tensor(name)
        .unwrap_or_else(|_| panic!("{}: no tensor {name}", f.path()))
        .shape()
        .to_vec()
}

#[test]
fn synth_small_models_of_every_architecture_have_llama_cpps_layout() {
    let dir = Scratch::new("arch");
    for like in Like::SMALL {
        let shape = like.shape().unwrap();
        let out = dir.file(&format!("{}.gguf", like.name()));
        synth::synth(like, SynthType::All(DType::Q8_0), &out, &mut |_, _| {}).unwrap();
        let f = GgufFile::open(&out).unwrap();
        let arch = shape.arch.name();
        assert_eq!(f.get_str("general.architecture").unwrap(), arch);
        assert_eq!(
            f.get_u32(&format!("{arch}.block_count")).unwrap() as usize,
            shape.n_layer
        );
        let (d, hd) = (shape.n_embd as u64, shape.head_dim as u64);
        let (nq, nkv) = (hd * shape.n_head as u64, hd * shape.n_head_kv as u64);
        let ff = shape.n_ff as u64;
        // What each architecture adds to (or fuses in) a Llama block, by llama.cpp's names.
        let mut per_block: Vec<(&str, Vec<u64>)> = vec![
            ("attn_norm.weight", vec![d]),
            ("attn_output.weight", vec![nq, d]),
            ("ffn_norm.weight", vec![d]),
        ];
        let e = shape.experts;
        if like == Like::Phi3Small {
            per_block.push(("attn_qkv.weight", vec![d, nq + 2 * nkv]));
            per_block.push(("ffn_up.weight", vec![d, 2 * ff]));
            per_block.push(("ffn_down.weight", vec![ff, d]));
        } else if e.n_expert > 0 {
            // A mixture of experts: the router and one matrix per expert and projection.
            let (n, fe) = (e.n_expert as u64, e.n_ff_exp as u64);
            per_block.push(("attn_q.weight", vec![d, nq]));
            per_block.push(("attn_k.weight", vec![d, nkv]));
            per_block.push(("attn_v.weight", vec![d, nkv]));
            per_block.push(("ffn_gate_inp.weight", vec![d, n]));
            per_block.push(("ffn_gate_exps.weight", vec![d, fe, n]));
            per_block.push(("ffn_up_exps.weight", vec![d, fe, n]));
            per_block.push(("ffn_down_exps.weight", vec![fe, d, n]));
        } else {
            per_block.push(("attn_q.weight", vec![d, nq]));
            per_block.push(("attn_k.weight", vec![d, nkv]));
            per_block.push(("attn_v.weight", vec![d, nkv]));
            per_block.push(("ffn_gate.weight", vec![d, ff]));
            per_block.push(("ffn_up.weight", vec![d, ff]));
            per_block.push(("ffn_down.weight", vec![ff, d]));
        }
        match like {
            Like::Qwen2MoeSmall => {
                let fs = e.n_ff_shared as u64;
                per_block.push(("ffn_gate_inp_shexp.weight", vec![d]));
                per_block.push(("ffn_gate_shexp.weight", vec![d, fs]));
                per_block.push(("ffn_up_shexp.weight", vec![d, fs]));
                per_block.push(("ffn_down_shexp.weight", vec![fs, d]));
            }
            Like::Qwen3MoeSmall => {
                per_block.push(("attn_q_norm.weight", vec![hd]));
                per_block.push(("attn_k_norm.weight", vec![hd]));
            }
            Like::OlmoeSmall => {
                per_block.push(("attn_q_norm.weight", vec![nq]));
                per_block.push(("attn_k_norm.weight", vec![nkv]));
            }
            Like::GptOssSmall => {
                // gpt-oss: biases everywhere, sinks, the FFN norm named post_attention_norm.
                let (n, fe) = (e.n_expert as u64, e.n_ff_exp as u64);
                per_block.retain(|(name, _)| *name != "ffn_norm.weight");
                per_block.push(("post_attention_norm.weight", vec![d]));
                per_block.push(("attn_sinks.weight", vec![shape.n_head as u64]));
                per_block.push(("attn_q.bias", vec![nq]));
                per_block.push(("attn_k.bias", vec![nkv]));
                per_block.push(("attn_v.bias", vec![nkv]));
                per_block.push(("attn_output.bias", vec![d]));
                per_block.push(("ffn_gate_inp.bias", vec![n]));
                per_block.push(("ffn_gate_exps.bias", vec![fe, n]));
                per_block.push(("ffn_up_exps.bias", vec![fe, n]));
                per_block.push(("ffn_down_exps.bias", vec![d, n]));
            }
            _ => {}
        }
        match like {
            Like::Qwen2Small => {
                per_block.push(("attn_q.bias", vec![nq]));
                per_block.push(("attn_k.bias", vec![nkv]));
                per_block.push(("attn_v.bias", vec![nkv]));
            }
            Like::Qwen3Small => {
                per_block.push(("attn_q_norm.weight", vec![hd]));
                per_block.push(("attn_k_norm.weight", vec![hd]));
            }
            Like::Gemma2Small | Like::Gemma3Small => {
                per_block.push(("post_attention_norm.weight", vec![d]));
                per_block.push(("post_ffw_norm.weight", vec![d]));
                if like == Like::Gemma3Small {
                    per_block.push(("attn_q_norm.weight", vec![hd]));
                    per_block.push(("attn_k_norm.weight", vec![hd]));
                }
            }
            _ => {}
        }
        let mut global = vec![
            ("token_embd.weight", vec![d, shape.n_vocab as u64]),
            ("output_norm.weight", vec![d]),
        ];
        if !shape.tied_output {
            global.push(("output.weight", vec![d, shape.n_vocab as u64]));
        }
        match like {
            Like::Llama3Small => global.push(("rope_freqs.weight", vec![hd / 2])),
            Like::Phi3Small => {
                global.push(("rope_factors_short.weight", vec![hd / 2]));
                global.push(("rope_factors_long.weight", vec![hd / 2]));
            }
            _ => {}
        }
        assert_eq!(
            f.tensors.len(),
            global.len() + shape.n_layer * per_block.len(),
            "{}: exactly llama.cpp's tensors",
            like.name()
        );
        for (name, want) in &global {
            assert_eq!(&ne(&f, name), want, "{}: {name}", like.name());
        }
        for l in 0..shape.n_layer {
            for (name, want) in &per_block {
                assert_eq!(&ne(&f, &format!("blk.{l}.{name}")), want, "{}", like.name());
            }
        }
        let key = |k: &str| format!("{arch}.{k}");
        match like {
            Like::Gemma2Small => {
                assert_eq!(f.get_u32(&key("attention.sliding_window")).unwrap(), 16);
                assert!(f.get_f32(&key("attn_logit_softcapping")).unwrap() > 0.0);
                assert!(f.get_f32(&key("final_logit_softcapping")).unwrap() > 0.0);
                assert_eq!(f.get_u32(&key("attention.key_length")).unwrap(), 48);
            }
            Like::Gemma3Small => {
                assert_eq!(f.get_u32(&key("attention.sliding_window")).unwrap(), 16);
                assert_eq!(f.get_str(&key("rope.scaling.type")).unwrap(), "linear");
                assert_eq!(f.get_f32(&key("rope.scaling.factor")).unwrap(), 8.0);
            }
            Like::Phi3Small => {
                assert_eq!(
                    f.get_u32(&key("rope.scaling.original_context_length"))
                        .unwrap(),
                    4096
                );
                let a = f.get_f32(&key("rope.scaling.attn_factor")).unwrap();
                assert!((a - 1.190_238).abs() < 1e-5, "{a}");
            }
            Like::Qwen3Small => {
                assert_eq!(f.get_u32(&key("attention.key_length")).unwrap(), 64);
            }
            Like::GptOssSmall => {
                assert_eq!(f.get_u32(&key("attention.sliding_window")).unwrap(), 16);
                assert_eq!(f.get_str(&key("rope.scaling.type")).unwrap(), "yarn");
                assert_eq!(f.get_f32(&key("rope.scaling.factor")).unwrap(), 32.0);
                assert_eq!(f.get_str("tokenizer.ggml.pre").unwrap(), "gpt-4o");
                // The experts are MXFP4 whatever the other matrices are, as OpenAI's files.
                for l in 0..shape.n_layer {
                    for p in ["gate", "up", "down"] {
                        let t = f.tensor(&format!("blk.{l}.ffn_{p}_exps.weight")).unwrap();
                        assert_eq!(t.dtype, DType::MXFP4);
                    }
                    let t = f.tensor(&format!("blk.{l}.attn_q.weight")).unwrap();
                    assert_eq!(t.dtype, DType::Q8_0);
                }
            }
            _ => {}
        }
        if e.n_expert > 0 {
            let count = |k: &str| f.get_u32(&key(k)).unwrap() as usize;
            assert_eq!(count("expert_count"), e.n_expert, "{}", like.name());
            assert_eq!(count("expert_used_count"), e.n_used, "{}", like.name());
        }
        // Llama 3.1's factors for heads of 32 at base 500000: eight fast pairs kept, one
        // blended, seven slow ones divided by 8.
        if like == Like::Llama3Small {
            let t = f.tensor("rope_freqs.weight").unwrap();
            let v: Vec<f32> = f
                .tensor_data(t)
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
                .collect();
            assert!(v[..8].iter().all(|&x| x == 1.0), "{v:?}");
            assert!(v[8] > 1.0 && v[8] < 8.0, "{v:?}");
            assert!(v[9..].iter().all(|&x| x == 8.0), "{v:?}");
        }
    }
}

#[test]
fn synth_q4_k_m_puts_q6_k_where_llama_cpp_does() {
    let t = synth::tensors(Like::Qwen3_8b, SynthType::Q4KM).unwrap();
    let shape = ArchShape::QWEN3_8B;
    let of = |name: &str| t.iter().find(|x| x.0 == name).unwrap().1;
    assert_eq!(of("output.weight"), DType::Q6_K);
    assert_eq!(of("token_embd.weight"), DType::Q4_K);
    // Of 36 layers, 18 take more bits: the first and last eighth and every third between.
    for role in ["attn_v", "ffn_down"] {
        let q6: Vec<usize> = (0..shape.n_layer)
            .filter(|l| of(&format!("blk.{l}.{role}.weight")) == DType::Q6_K)
            .collect();
        assert_eq!(q6.len(), 18, "{role}: {q6:?}");
        assert_eq!(&q6[..5], &[0, 1, 2, 3, 6], "{role}");
    }
    for (name, dtype, ne) in &t {
        let q6 = name == "output.weight" || name.contains("attn_v") || name.contains("ffn_down");
        match ne.len() {
            1 => assert_eq!(*dtype, DType::F32, "{name}"),
            _ if !q6 => assert_eq!(*dtype, DType::Q4_K, "{name}"),
            _ => assert!(matches!(dtype, DType::Q4_K | DType::Q6_K), "{name}"),
        }
    }
    // A small model's rows are not whole 256-value blocks: llama.cpp's fallbacks.
    let g = synth::tensors(Like::Gemma2Small, SynthType::Q4KM).unwrap();
    let of = |name: &str| g.iter().find(|x| x.0 == name).unwrap().1;
    assert_eq!(
        of("token_embd.weight"),
        DType::Q8_0,
        "the tied head, Q6_K's fallback"
    );
    assert_eq!(of("blk.0.attn_q.weight"), DType::Q5_0, "Q4_K's fallback");
    // Of 4 layers, 2 and 3 take more bits.
    assert_eq!(of("blk.2.ffn_down.weight"), DType::Q8_0, "Q6_K's fallback");
    assert_eq!(of("blk.1.ffn_down.weight"), DType::Q5_0);
}

#[test]
fn synth_arch_shapes_are_checked() {
    let dir = Scratch::new("arch-errors");
    let out = dir.file("out.gguf");
    let bad = [
        // Qwen 2's attention output is as wide as the model.
        ArchShape {
            head_dim: 64,
            ..ArchShape::QWEN2_SMALL
        },
        // Gemma 2 takes its head from the token embedding.
        ArchShape {
            tied_output: false,
            ..ArchShape::GEMMA2_SMALL
        },
        ArchShape {
            sliding_window: 0,
            ..ArchShape::GEMMA3_SMALL
        },
        ArchShape {
            arch: synth::Arch::Qwen3,
            ..ArchShape::LLAMA3_SMALL
        },
    ];
    for shape in bad {
        let e = synth::synth_arch(&shape, SynthType::All(DType::F16), &out, &mut |_, _| {});
        assert!(e.is_err(), "{shape:?}");
    }
    assert!(SynthType::from_name("q5_1").is_err());
    assert_eq!(SynthType::from_name("q4_k_m").unwrap(), SynthType::Q4KM);
    assert_eq!(dir.entries(), 0);
}

#[test]
fn synth_llama3_small_loads_and_generates() {
    let dir = Scratch::new("llama3-small");
    let out = dir.file("llama3-small.gguf");
    synth::synth(
        Like::Llama3Small,
        SynthType::All(DType::Q4_K),
        &out,
        &mut |_, _| {},
    )
    .unwrap();
    load_and_generate(&out);
}
