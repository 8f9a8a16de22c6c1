//! The SmolLM2 tokenizer, read from the GGUF file, against llama.cpp's token ids for the 30
//! strings of shared/reference/smollm2-tokenize.json. The model is fetched on first use.

mod common;

use tessera_core::gguf::GgufFile;
use tessera_llm::chat::{ChatTemplate, Message};
use tessera_llm::tokenizer::{StreamDecoder, Tokenizer};

use common::{ids, model_path, reference};

/// The model's GGUF file (fetched and cached as the CLI does) and the reference JSON.
fn load() -> (GgufFile, serde_json::Value) {
    let gguf = GgufFile::open(model_path()).expect("model opens");
    (gguf, reference("smollm2-tokenize.json"))
}

#[test]
fn smollm2_matches_llama_cpp_ids() {
    let (gguf, r) = load();
    let tok = Tokenizer::from_gguf(&gguf).unwrap();
    assert_eq!(tok.n_vocab() as u64, r["info"]["n_vocab"].as_u64().unwrap());
    assert_eq!(tok.bos(), Some(1));
    assert_eq!(tok.eos(), Some(2));
    assert_eq!(tok.eog_tokens().collect::<Vec<_>>(), [0, 2, 4]);

    let entries = r["entries"].as_array().unwrap();
    assert_eq!(entries.len(), 30);
    let mut failures = Vec::new();
    for e in entries {
        let name = e["name"].as_str().unwrap();
        let text = e["text"].as_str().unwrap();
        let cases = [
            ("ids_no_bos", false, false),
            ("ids_with_bos", true, false),
            ("ids_no_bos_parse_special", false, true),
            ("ids_with_bos_parse_special", true, true),
        ];
        for (key, add_special, parse_special) in cases {
            let got = tok.encode(text, add_special, parse_special).unwrap();
            if got != ids(&e[key]) {
                failures.push(format!(
                    "{name} {key}: got {got:?}, want {:?}",
                    ids(&e[key])
                ));
            }
        }
        // Pieces, and decoding back to the text.
        let special = ids(&e["ids_no_bos_parse_special"]);
        let hex: Vec<String> = special
            .iter()
            .map(|&i| {
                tok.token_to_piece(i)
                    .unwrap()
                    .iter()
                    .map(|b| format!("{b:02x}"))
                    .collect()
            })
            .collect();
        let want_hex: Vec<String> = e["pieces_hex_parse_special"]
            .as_array()
            .unwrap()
            .iter()
            .map(|h| h.as_str().unwrap().to_owned())
            .collect();
        if hex != want_hex {
            failures.push(format!("{name}: pieces {hex:?}, want {want_hex:?}"));
        }
        for key in ["ids_no_bos", "ids_no_bos_parse_special"] {
            let decoded = tok.decode(&ids(&e[key])).unwrap();
            if decoded != text {
                failures.push(format!("{name} {key}: decodes to {decoded:?}"));
            }
        }
        let mut stream = StreamDecoder::new();
        let mut streamed = String::new();
        for &i in &special {
            streamed.push_str(&stream.push(&tok, i).unwrap());
        }
        streamed.push_str(&stream.finish());
        if streamed != text {
            failures.push(format!("{name}: streams to {streamed:?}"));
        }
    }
    assert!(
        failures.is_empty(),
        "{} mismatches:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn smollm2_chat_template_from_gguf() {
    let (gguf, r) = load();
    let t = ChatTemplate::from_gguf(&gguf).unwrap();
    let user = [Message::new("user", "What is the capital of France?")];
    let text = t.render(&user, true).unwrap();
    let entry = r["entries"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["name"] == "chat_template_user")
        .unwrap();
    assert_eq!(text, entry["text"].as_str().unwrap());
    let tok = Tokenizer::from_gguf(&gguf).unwrap();
    assert_eq!(
        tok.encode(&text, true, true).unwrap(),
        ids(&entry["ids_with_bos_parse_special"])
    );
}
