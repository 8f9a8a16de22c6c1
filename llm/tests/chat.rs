//! The SmolLM2 chat template, rendered by tessera, against the jinja2 renderings that
//! llama-cpp-python made for the reference (shared/reference/smollm2-tokenize.json).

use std::path::PathBuf;
use tessera_llm::chat::{ChatTemplate, Message};

fn reference() -> Option<serde_json::Value> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../shared/reference/smollm2-tokenize.json");
    match std::fs::read_to_string(&path) {
        Ok(text) => Some(serde_json::from_str(&text).expect("reference JSON parses")),
        Err(e) => {
            println!(
                "SKIPPED: reference file {} not readable: {e}",
                path.display()
            );
            None
        }
    }
}

fn entry_text<'a>(r: &'a serde_json::Value, name: &str) -> &'a str {
    r["entries"]
        .as_array()
        .expect("entries")
        .iter()
        .find(|e| e["name"] == name)
        .and_then(|e| e["text"].as_str())
        .unwrap_or_else(|| panic!("reference entry {name}"))
}

#[test]
fn smollm2_template_matches_jinja2() {
    let Some(r) = reference() else { return };
    let template = r["chat_template"].as_str().expect("chat_template");
    let t = ChatTemplate::new(template, "<|im_start|>", "<|im_end|>").unwrap();

    // No system message: the template inserts its default one.
    let user = [Message::new("user", "What is the capital of France?")];
    assert_eq!(
        t.render(&user, true).unwrap(),
        entry_text(&r, "chat_template_user")
    );

    let multi = [
        Message::new("system", "You are a terse assistant."),
        Message::new("user", "Say hi."),
        Message::new("assistant", "Hi."),
        Message::new("user", "Now in French, with an accent: é?"),
    ];
    assert_eq!(
        t.render(&multi, true).unwrap(),
        entry_text(&r, "chat_template_multi_turn")
    );
}

#[test]
fn chatml_fallback_matches_llama_cpp_builtin() {
    let Some(r) = reference() else { return };
    // llama.cpp's built-in "chatml" handler does not insert a system message.
    let t = ChatTemplate::chatml();
    let user = [Message::new("user", "What is the capital of France?")];
    assert_eq!(
        t.render(&user, true).unwrap(),
        r["chat_template_llamacpp_builtin_output"]
            .as_str()
            .expect("builtin output")
    );
}
