//! Jinja chat templates rendered by minijinja against jinja2's renderings, made the way
//! llama-cpp-python renders a GGUF file's template (llm/tests/data/tokenizer/chat_jinja.json,
//! from scripts/reference/chat_jinja.py): Python string and dict methods, namespace(), loop
//! variables and controls, `tools` given as none, and a template's own rejection of its input.

use std::path::PathBuf;

use tessera_core::Error;
use tessera_llm::chat::{ChatTemplate, Message};

fn data() -> serde_json::Value {
    let path =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/tokenizer/chat_jinja.json");
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    serde_json::from_str(&text).expect("the data parses")
}

#[test]
fn templates_render_as_jinja2_renders_them() {
    let d = data();
    let messages: Vec<Message> = d["conversation"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| Message::new(m[0].as_str().unwrap(), m[1].as_str().unwrap()))
        .collect();
    let (bos, eos) = (
        d["bos_token"].as_str().unwrap(),
        d["eos_token"].as_str().unwrap(),
    );
    let templates = d["templates"].as_object().unwrap();
    assert_eq!(templates.len(), 4);
    let mut failures = Vec::new();
    for (name, case) in templates {
        let t = ChatTemplate::new(case["template"].as_str().unwrap(), bos, eos).unwrap();
        for (key, gen) in [("render", false), ("render_gen", true)] {
            let got = t.render(&messages, gen);
            match (&case[key]["error"], got) {
                (serde_json::Value::String(want), Err(Error::Invalid(e))) if e.contains(want) => {}
                (serde_json::Value::Null, Ok(text)) if text == case[key] => {}
                (_, got) => failures.push(format!("{name} {key}: got {got:?}, want {}", case[key])),
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
