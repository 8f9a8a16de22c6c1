//! The Gemma 3 270M tokenizer (a 262,144-token SentencePiece-style `llama` vocabulary with byte
//! fallback) against llama.cpp's ids in shared/reference/gemma3-270m-reference.json (the file
//! is fetched by name on first use).

mod common;

use tessera_core::gguf::GgufFile;
use tessera_llm::chat::{ChatFormat, ChatTemplate, Message};
use tessera_llm::tokenizer::{StreamDecoder, Tokenizer};

use common::{ids, reference};

fn open() -> GgufFile {
    GgufFile::open(common::gemma3_path()).expect("the Gemma file opens")
}

fn load() -> (Tokenizer, serde_json::Value) {
    let tok = Tokenizer::from_gguf(&open()).expect("the Gemma tokenizer loads");
    (tok, reference("gemma3-270m-reference.json"))
}

#[test]
fn gemma3_vocabulary_facts() {
    let (tok, _) = load();
    assert_eq!(tok.n_vocab(), 262_144);
    assert_eq!(
        (tok.bos(), tok.eos(), tok.unk()),
        (Some(2), Some(1), Some(3))
    );
    assert!(tok.add_bos());
    // llama.cpp 0c1e57098 (llama_vocab_is_eog, llama_vocab_get_attr): generation ends at
    // <eos>, <end_of_turn> and </s>, and 6,250 tokens are control tokens.
    assert_eq!(tok.eog_tokens().collect::<Vec<_>>(), [1, 106, 212]);
    assert_eq!(tok.token_text(106).unwrap(), "<end_of_turn>");
    let n_control = (0..tok.n_vocab() as u32)
        .filter(|&i| tok.is_control(i))
        .count();
    assert_eq!(n_control, 6250);
}

#[test]
fn gemma3_matches_llama_cpp_ids() {
    let (tok, r) = load();
    let mut failures = Vec::new();
    let mut count = 0;
    for e in r["tokenize"].as_array().unwrap() {
        let text = e["text"].as_str().unwrap();
        for (key, add_special) in [("ids", false), ("ids_with_bos", true)] {
            let want = ids(&e[key]);
            let got = tok.encode(text, add_special, true).unwrap();
            count += 1;
            if got != want {
                failures.push(format!("{text:?} {key}: got {got:?}, want {want:?}"));
            }
        }
    }
    for g in r["greedy"].as_array().unwrap() {
        let text = g["prompt"].as_str().unwrap();
        let want = ids(&g["prompt_ids"]);
        let got = tok.encode(text, true, true).unwrap();
        count += 1;
        if got != want {
            failures.push(format!(
                "prompt {}: got {} ids {:?}.., want {} ids {:?}..",
                g["name"],
                got.len(),
                &got[..got.len().min(12)],
                want.len(),
                &want[..want.len().min(12)]
            ));
        }
    }
    assert_eq!(count, 36);
    assert!(
        failures.is_empty(),
        "{} mismatches:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn gemma3_decodes_back_to_the_text() {
    let (tok, r) = load();
    let mut failures = Vec::new();
    let prompts = r["greedy"].as_array().unwrap().iter().map(|g| &g["prompt"]);
    let texts = r["tokenize"].as_array().unwrap().iter().map(|e| &e["text"]);
    for text in texts.chain(prompts).map(|t| t.as_str().unwrap()) {
        let ids = tok.encode(text, false, true).unwrap();
        let decoded = tok.decode(&ids).unwrap();
        if decoded != text {
            failures.push(format!("{text:?} decodes to {decoded:?}"));
        }
        let mut stream = StreamDecoder::new();
        let mut streamed = String::new();
        for &i in &ids {
            streamed.push_str(&stream.push(&tok, i).unwrap());
        }
        streamed.push_str(&stream.finish());
        if streamed != text {
            failures.push(format!("{text:?} streams to {streamed:?}"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn gemma3_chat_uses_the_gemma_format() {
    let gguf = open();
    let r = reference("gemma3-270m-reference.json");
    // The file has no template: its architecture picks Gemma's turns.
    assert!(gguf.get("tokenizer.chat_template").is_none());
    let t = ChatTemplate::from_gguf(&gguf).unwrap();
    assert_eq!(t.format(), Some(ChatFormat::Gemma));
    assert_eq!(t.end_of_turn(), Some("<end_of_turn>"));

    let turn = [Message::new("user", "hi")];
    let text = t.render(&turn, false).unwrap();
    assert_eq!(text, "<start_of_turn>user\nhi<end_of_turn>\n");
    let entry = r["tokenize"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["text"] == text.as_str())
        .expect("the reference tokenizes this turn");
    let tok = Tokenizer::from_gguf(&gguf).unwrap();
    assert_eq!(
        tok.encode(&text, true, true).unwrap(),
        ids(&entry["ids_with_bos"])
    );
    let prompt = t.render(&turn, true).unwrap();
    assert_eq!(prompt, format!("{text}<start_of_turn>model\n"));
}
