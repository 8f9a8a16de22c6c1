//! Small synthetic vocabularies against llama.cpp's ids for them
//! (llm/tests/data/tokenizer/vocabs.json, made by scripts/reference/tokenizer_vocabs.py with
//! llama-cpp-python 0.3.36): byte-level BPE with the `qwen2`, `llama-bpe` and `gpt-4o` pre-tokenizers,
//! whose merges make each word one token and join neighbouring words (so every word boundary
//! shows in the ids), and a SentencePiece-style vocabulary named like a Phi 3 file (whose
//! special tokens drop the white space after them). Each vocabulary is written as a GGUF file
//! in memory and read back as a model's file is.

use std::path::PathBuf;

use serde_json::Value;
use tessera_core::gguf::{GgufFile, GgufValue, GgufWriter};
use tessera_llm::tokenizer::Tokenizer;

fn data() -> Value {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/tokenizer/vocabs.json");
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    serde_json::from_str(&text).expect("the data parses")
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .expect("an array")
        .iter()
        .map(|s| s.as_str().expect("a string").to_owned())
        .collect()
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .expect("an array")
        .iter()
        .map(|x| x.as_u64().expect("an id") as u32)
        .collect()
}

/// GPT-2's byte encoder: printable Latin-1 bytes stand for themselves, the others for U+0100
/// on, in byte order.
fn byte_chars() -> Vec<String> {
    let mut next = 0x100;
    (0..=255u32)
        .map(|b| {
            let printable = matches!(b, 0x21..=0x7E | 0xA1..=0xAC | 0xAE..=0xFF);
            let cp = if printable {
                b
            } else {
                next += 1;
                next - 1
            };
            char::from_u32(cp).unwrap().to_string()
        })
        .collect()
}

/// A GGUF file of the given metadata, in memory.
fn gguf(metadata: Vec<(&str, GgufValue)>) -> GgufFile {
    let mut w = GgufWriter::new();
    for (k, v) in metadata {
        w.add_metadata(k, v).unwrap();
    }
    GgufFile::from_bytes(w.to_bytes().unwrap()).unwrap()
}

/// Checks a tokenizer against the cases' ids (special tokens parsed and not) and llama.cpp's
/// decoding of them.
fn check(tok: &Tokenizer, cases: &Value, what: &str) {
    let mut failures = Vec::new();
    for case in cases.as_array().unwrap() {
        let text = case["text"].as_str().unwrap();
        let keys = [
            ("ids", "decoded", false),
            ("ids_parse_special", "decoded_parse_special", true),
        ];
        for (key, decoded_key, parse_special) in keys {
            let got = tok.encode(text, false, parse_special).unwrap();
            let want = ids(&case[key]);
            if got != want {
                failures.push(format!("{what} {text:?} {key}: got {got:?}, want {want:?}"));
            }
            let decoded = tok.decode(&want).unwrap();
            let want_decoded = case[decoded_key].as_str().unwrap();
            if decoded != want_decoded {
                failures.push(format!(
                    "{what} {text:?} {key}: decodes to {decoded:?}, want {want_decoded:?}"
                ));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn bpe_pre_tokenizers_match_llama_cpp() {
    let d = data();
    let bpe = &d["bpe"];
    let merges = strings(&bpe["merges"]);
    let specials = strings(&bpe["specials"]);
    let mut tokens = byte_chars();
    for m in &merges {
        let joined = m.replacen(' ', "", 1);
        if !tokens.contains(&joined) {
            tokens.push(joined);
        }
    }
    let n_normal = tokens.len();
    tokens.extend(specials.iter().cloned());
    let n = tokens.len() as u32;
    let mut types = vec![1i32; n_normal];
    types.extend(std::iter::repeat_n(3, specials.len()));
    let cases = bpe["cases"].as_object().unwrap();
    assert_eq!(cases.len(), 3);
    for (pre, cases) in cases {
        let f = gguf(vec![
            ("general.architecture", "qwen2".into()),
            ("tokenizer.ggml.model", "gpt2".into()),
            ("tokenizer.ggml.pre", pre.as_str().into()),
            ("tokenizer.ggml.tokens", tokens.clone().into()),
            ("tokenizer.ggml.token_type", types.clone().into()),
            ("tokenizer.ggml.merges", merges.clone().into()),
            ("tokenizer.ggml.bos_token_id", (n - 3).into()),
            ("tokenizer.ggml.eos_token_id", (n - 1).into()),
            ("tokenizer.ggml.add_bos_token", false.into()),
        ]);
        let tok = Tokenizer::from_gguf(&f).unwrap();
        assert_eq!(tok.n_vocab(), tokens.len());
        check(&tok, cases, pre);
    }
}

#[test]
fn phi3_special_tokens_strip_the_space_after_them_as_in_llama_cpp() {
    let d = data();
    let phi3 = &d["phi3"];
    let mut tokens: Vec<String> = vec!["<unk>".into(), "<s>".into(), "</s>".into()];
    tokens.extend((0..=255u8).map(|b| format!("<0x{b:02X}>")));
    let mut types = vec![2i32, 3, 3];
    types.extend(std::iter::repeat_n(6, 256));
    let mut scores = vec![0f32; tokens.len()];
    for p in phi3["pieces"].as_array().unwrap() {
        tokens.push(p[0].as_str().unwrap().to_owned());
        types.push(1);
        scores.push(p[1].as_f64().unwrap() as f32);
    }
    for s in strings(&phi3["specials"]) {
        tokens.push(s);
        types.push(3);
        scores.push(0.0);
    }
    let metadata = |name: &str| {
        vec![
            ("general.architecture", "llama".into()),
            ("general.name", name.into()),
            ("tokenizer.ggml.model", "llama".into()),
            ("tokenizer.ggml.tokens", tokens.clone().into()),
            ("tokenizer.ggml.token_type", types.clone().into()),
            ("tokenizer.ggml.scores", scores.clone().into()),
            ("tokenizer.ggml.bos_token_id", 1u32.into()),
            ("tokenizer.ggml.eos_token_id", 2u32.into()),
            ("tokenizer.ggml.unknown_token_id", 0u32.into()),
        ]
    };
    let tok = Tokenizer::from_gguf(&gguf(metadata(phi3["name"].as_str().unwrap()))).unwrap();
    check(&tok, &phi3["cases"], "phi3");

    // Under another name the space after `<|end|>` stays.
    let other = Tokenizer::from_gguf(&gguf(metadata("Some model"))).unwrap();
    let text = "<|end|>  x";
    assert_ne!(
        other.encode(text, false, true).unwrap(),
        tok.encode(text, false, true).unwrap()
    );
}
