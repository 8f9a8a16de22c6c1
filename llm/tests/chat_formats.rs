//! llama.cpp's built-in chat formats and its template detection, against what llama.cpp
//! rendered (llm/tests/data/tokenizer/chat_formats.json, made by
//! scripts/reference/chat_formats.py with llama-cpp-python 0.3.36).

use std::path::PathBuf;

use tessera_llm::chat::{ChatFormat, ChatTemplate, Message};

fn data() -> serde_json::Value {
    let path =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/tokenizer/chat_formats.json");
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    serde_json::from_str(&text).expect("the data parses")
}

fn conversation(v: &serde_json::Value) -> Vec<Message> {
    v.as_array()
        .expect("a conversation")
        .iter()
        .map(|m| Message::new(m[0].as_str().unwrap(), m[1].as_str().unwrap()))
        .collect()
}

#[test]
fn builtin_formats_render_as_llama_cpp() {
    let d = data();
    let conversations = d["conversations"].as_object().unwrap();
    let renders = d["renders"].as_object().unwrap();
    assert_eq!(renders.len(), 15);
    let mut failures = Vec::new();
    let mut count = 0;
    for (name, cases) in renders {
        let format = ChatFormat::from_name(name).unwrap_or_else(|| panic!("format {name}"));
        let template = ChatTemplate::builtin(format);
        for (conv, messages) in conversations {
            let messages = conversation(messages);
            for gen in [false, true] {
                let key = format!("{conv}{}", if gen { "_gen" } else { "" });
                let want = cases[&key].as_str().unwrap();
                let got = template.render(&messages, gen).unwrap();
                count += 1;
                if got != want {
                    failures.push(format!("{name} {key}:\n  got  {got:?}\n  want {want:?}"));
                }
            }
        }
    }
    assert_eq!(count, 15 * 4 * 2);
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn templates_are_detected_as_llama_cpp_detects_them() {
    let d = data();
    let cases = d["detect"].as_object().unwrap();
    assert!(cases.len() >= 15);
    for (key, case) in cases {
        let template = case["template"].as_str().unwrap();
        // "other": llama.cpp detects a format tessera has no built-in renderer for.
        let want = match case["format"].as_str() {
            None | Some("other") => None,
            Some(name) => Some(ChatFormat::from_name(name).unwrap()),
        };
        assert_eq!(ChatFormat::detect(template), want, "{key}: {template:?}");
    }
}
