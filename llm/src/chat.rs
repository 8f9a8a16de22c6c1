//! Chat prompts: render a conversation the way the model was trained to see it.
//!
//! A GGUF file may carry its Hugging Face Jinja template as `tokenizer.chat_template`. It is
//! rendered with minijinja the way llama-cpp-python renders it with jinja2: blocks trim the
//! newline after them and strip the whitespace before them, and the template sees `messages` (a
//! list of `{role, content}` maps), `add_generation_prompt`, `bos_token`, `eos_token`, `tools`
//! (none), and a `raise_exception(msg)` function that templates call to reject input. The Python
//! string and dict methods templates call (`strip`, `split`, `startswith`, `items`, `get` ...)
//! are provided. When the vocabulary adds BOS (or EOS) itself, a BOS text the template prints at
//! the start (an EOS text at the end) is removed, as llama.cpp does, so that the token is not
//! there twice.
//!
//! The template is also matched to one of llama.cpp's built-in [`ChatFormat`]s by the
//! distinctive substrings llama.cpp's detection looks for. The format names the end-of-turn
//! token, and renders the conversation, with a warning, when the template does not compile or
//! render (what llama.cpp does without its Jinja engine). A file without a template gets the
//! built-in format of its architecture (`general.architecture`): Gemma's turns for gemma, gemma2
//! and gemma3, Phi 3's for phi3, Granite's for granite, Harmony's for gpt-oss, ChatML otherwise.
//!
//! The rendered text contains special tokens as text (`<|im_start|>` ...): tokenize it with
//! `parse_special = true`.

use minijinja::value::{from_args, Value, ValueKind};
use minijinja::{context, Environment, ErrorKind, State};
use tessera_core::gguf::GgufFile;
use tessera_core::{Error, Result};

/// One turn of a conversation.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Message {
    /// Who speaks: `system`, `user` or `assistant` (templates may know others, e.g. `tool`).
    pub role: String,
    /// What was said.
    pub content: String,
}

impl Message {
    /// A message with the given role and content.
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        Message {
            role: role.into(),
            content: content.into(),
        }
    }
}

/// A chat format that llama.cpp renders without Jinja (`llm_chat_apply_template`), by the name
/// llama.cpp gives it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChatFormat {
    /// `chatml`: `<|im_start|>role\ncontent<|im_end|>\n` (Qwen, SmolLM, many others).
    ChatMl,
    /// `gemma`: `<start_of_turn>role\ncontent<end_of_turn>\n`, the assistant called `model`,
    /// contents trimmed, system messages joined and put before the first user turn's content.
    Gemma,
    /// `llama3`: `<|start_header_id|>role<|end_header_id|>\n\ncontent<|eot_id|>`, contents
    /// trimmed.
    Llama3,
    /// `phi3`: `<|role|>\ncontent<|end|>\n`.
    Phi3,
    /// `granite`: Granite 3.x, `<|start_of_role|>role<|end_of_role|>content<|end_of_text|>\n`.
    Granite,
    /// `granite-4.0`: Granite 4, whose tool calls are assistant turns.
    Granite4,
    /// `llama2`: `[INST] ... [/INST]` turns; a system message is written as plain text.
    Llama2,
    /// `llama2-sys`: Llama 2 with `<<SYS>>` system messages.
    Llama2Sys,
    /// `llama2-sys-bos`: Llama 2 with `<<SYS>>`, each later turn opened by `<s>`.
    Llama2SysBos,
    /// `llama2-sys-strip`: Llama 2 with `<<SYS>>`, contents trimmed.
    Llama2SysStrip,
    /// `mistral-v1`: Mistral's first `[INST]` format (spaces before the markers).
    MistralV1,
    /// `mistral-v3`: Mistral v3, assistant contents trimmed.
    MistralV3,
    /// `mistral-v3-tekken`: Mistral v3 without the spaces after the markers.
    MistralV3Tekken,
    /// `mistral-v7`: Mistral v7, system prompts in `[SYSTEM_PROMPT]`.
    MistralV7,
    /// `gpt-oss`: OpenAI's Harmony turns, `<|start|>role<|message|>content<|end|>`, an
    /// assistant turn closed by `<|return|>`.
    GptOss,
}

/// Every format, for looking one up by name.
const FORMATS: [ChatFormat; 15] = [
    ChatFormat::ChatMl,
    ChatFormat::Gemma,
    ChatFormat::Llama3,
    ChatFormat::Phi3,
    ChatFormat::Granite,
    ChatFormat::Granite4,
    ChatFormat::Llama2,
    ChatFormat::Llama2Sys,
    ChatFormat::Llama2SysBos,
    ChatFormat::Llama2SysStrip,
    ChatFormat::MistralV1,
    ChatFormat::MistralV3,
    ChatFormat::MistralV3Tekken,
    ChatFormat::MistralV7,
    ChatFormat::GptOss,
];

/// llama.cpp's `trim`: drops the ASCII white space (C's `isspace`) at both ends.
fn trim(s: &str) -> &str {
    s.trim_matches(|c: char| matches!(c, ' ' | '\t' | '\n' | '\x0B' | '\x0C' | '\r'))
}

impl ChatFormat {
    /// The name llama.cpp gives the format.
    pub fn name(self) -> &'static str {
        match self {
            ChatFormat::ChatMl => "chatml",
            ChatFormat::Gemma => "gemma",
            ChatFormat::Llama3 => "llama3",
            ChatFormat::Phi3 => "phi3",
            ChatFormat::Granite => "granite",
            ChatFormat::Granite4 => "granite-4.0",
            ChatFormat::Llama2 => "llama2",
            ChatFormat::Llama2Sys => "llama2-sys",
            ChatFormat::Llama2SysBos => "llama2-sys-bos",
            ChatFormat::Llama2SysStrip => "llama2-sys-strip",
            ChatFormat::MistralV1 => "mistral-v1",
            ChatFormat::MistralV3 => "mistral-v3",
            ChatFormat::MistralV3Tekken => "mistral-v3-tekken",
            ChatFormat::MistralV7 => "mistral-v7",
            ChatFormat::GptOss => "gpt-oss",
        }
    }

    /// The format llama.cpp calls `name` (`granite-4.1` renders as `granite-4.0`).
    pub fn from_name(name: &str) -> Option<ChatFormat> {
        if name == "granite-4.1" {
            return Some(ChatFormat::Granite4);
        }
        FORMATS.into_iter().find(|f| f.name() == name)
    }

    /// The format llama.cpp's `llm_chat_detect_template` finds in a Jinja template, by the
    /// substrings it looks for, in its order. `None` when it finds none of these formats,
    /// including when it finds one of its other formats (Phi 4, Zephyr, Command R ...) first.
    pub fn detect(template: &str) -> Option<ChatFormat> {
        use ChatFormat::*;
        if let Some(f) = ChatFormat::from_name(template) {
            return Some(f);
        }
        let has = |s: &str| template.contains(s);
        if has("<|im_start|>") {
            // `<|im_sep|>` is Phi 4's, `<end_of_utterance>` SmolVLM's.
            return (!has("<|im_sep|>") && !has("<end_of_utterance>")).then_some(ChatMl);
        }
        if template.starts_with("mistral") || has("[INST]") {
            if has("[SYSTEM_PROMPT]") {
                return Some(MistralV7);
            }
            if has("' [INST] ' + system_message") || has("[AVAILABLE_TOOLS]") {
                return Some(if has(" [INST]") {
                    MistralV1
                } else if has("\"[INST]\"") {
                    MistralV3Tekken
                } else {
                    MistralV3
                });
            }
            return Some(if has("content.strip()") {
                Llama2SysStrip
            } else if has("bos_token + '[INST]") {
                Llama2SysBos
            } else if has("<<SYS>>") {
                Llama2Sys
            } else {
                Llama2
            });
        }
        if has("<|assistant|>") && has("<|end|>") {
            return Some(Phi3);
        }
        // Formats llama.cpp tests for before Gemma's, Llama 3's and Granite's, and which are
        // none of those: ChatGLM 4, Falcon 3 / GLM-Edge / EXAONE-MoE, GLM-Edge, Zephyr,
        // Monarch.
        let others_before_gemma = has("[gMASK]<sop>")
            || (has("<|assistant|>") && has("<|user|>"))
            || (has("<|{{ item['role'] }}|>") && has("<|begin_of_image|>"))
            || (has("<|user|>") && has("<|endoftext|>"))
            || has("bos_token + message['role']");
        if others_before_gemma {
            return None;
        }
        if has("<start_of_turn>") {
            return Some(Gemma);
        }
        // Orion, OpenChat, Vicuna, DeepSeek, Command R.
        let others_before_llama3 = has("'\\n\\nAssistant: ' + eos_token")
            || has("GPT4 Correct ")
            || (has("USER: ") && has("ASSISTANT: "))
            || (has("### Instruction:") && has("<|EOT|>"))
            || (has("<|START_OF_TURN_TOKEN|>") && has("<|USER_TOKEN|>"));
        if others_before_llama3 {
            return None;
        }
        if has("<|start_header_id|>") && has("<|end_header_id|>") {
            return Some(Llama3);
        }
        // ChatGLM 3, MiniCPM, DeepSeek 2 and 3, EXAONE 3 and 4, RWKV World.
        let others_before_granite = has("[gMASK]sop")
            || has("<用户>")
            || has("'Assistant: ' + message['content'] + eos_token")
            || (has("<｜Assistant｜>") && has("<｜User｜>") && has("<｜end▁of▁sentence｜>"))
            || (has("[|system|]") && has("[|assistant|]") && has("[|endofturn|]"))
            || has("rwkv-world")
            || has("{{- 'User: ' + message['content']|trim + '\\n\\n' -}}");
        if others_before_granite {
            return None;
        }
        if has("<|start_of_role|>") {
            return Some(if has("<tool_call>") || has("<tools>") {
                Granite4
            } else {
                Granite
            });
        }
        // Harmony (gpt-oss): llama.cpp tests for it after formats tessera does not render,
        // whose markers a Harmony template does not hold.
        if has("<|start|>") && has("<|channel|>") {
            return Some(GptOss);
        }
        None
    }

    /// The format for a file of architecture `arch` that carries no template: the format its
    /// models are trained with where one is known, else ChatML.
    pub fn for_architecture(arch: &str) -> ChatFormat {
        match arch {
            "gemma" | "gemma2" | "gemma3" => ChatFormat::Gemma,
            "phi3" => ChatFormat::Phi3,
            "granite" => ChatFormat::Granite,
            "gpt-oss" => ChatFormat::GptOss,
            _ => ChatFormat::ChatMl,
        }
    }

    /// The text of the token that ends a turn in this format.
    pub fn end_of_turn(self) -> &'static str {
        use ChatFormat::*;
        match self {
            ChatMl => "<|im_end|>",
            Gemma => "<end_of_turn>",
            Llama3 => "<|eot_id|>",
            Phi3 => "<|end|>",
            Granite | Granite4 => "<|end_of_text|>",
            GptOss => "<|return|>",
            Llama2 | Llama2Sys | Llama2SysBos | Llama2SysStrip | MistralV1 | MistralV3
            | MistralV3Tekken | MistralV7 => "</s>",
        }
    }

    /// Renders `messages` as llama.cpp's built-in format does; with `add_generation_prompt`
    /// the text ends with the opening of the assistant's turn (the `[INST]` formats have none:
    /// their user turn's end is where the assistant starts).
    pub fn render(self, messages: &[Message], add_generation_prompt: bool) -> String {
        use ChatFormat::*;
        let mut out = String::new();
        let (open_assistant, closes_turns) = match self {
            ChatMl => {
                for m in messages {
                    out += &format!("<|im_start|>{}\n{}<|im_end|>\n", m.role, m.content);
                }
                ("<|im_start|>assistant\n", false)
            }
            Gemma => {
                let mut system = String::new();
                for m in messages {
                    if m.role == "system" {
                        system += trim(&m.content);
                        continue;
                    }
                    let role = if m.role == "assistant" {
                        "model"
                    } else {
                        &m.role
                    };
                    out += &format!("<start_of_turn>{role}\n");
                    if !system.is_empty() && role != "model" {
                        out += &system;
                        out += "\n\n";
                        system.clear();
                    }
                    out += trim(&m.content);
                    out += "<end_of_turn>\n";
                }
                ("<start_of_turn>model\n", false)
            }
            Llama3 => {
                for m in messages {
                    out += &format!(
                        "<|start_header_id|>{}<|end_header_id|>\n\n{}<|eot_id|>",
                        m.role,
                        trim(&m.content)
                    );
                }
                ("<|start_header_id|>assistant<|end_header_id|>\n\n", false)
            }
            Phi3 => {
                for m in messages {
                    out += &format!("<|{}|>\n{}<|end|>\n", m.role, m.content);
                }
                ("<|assistant|>\n", false)
            }
            Granite | Granite4 => {
                for m in messages {
                    let tool_call = m.role == "assistant_tool_call";
                    let role = if tool_call && self == Granite4 {
                        "assistant"
                    } else {
                        &m.role
                    };
                    out += &format!("<|start_of_role|>{role}<|end_of_role|>");
                    if tool_call {
                        out += "<|tool_call|>";
                    }
                    out += &m.content;
                    out += "<|end_of_text|>\n";
                }
                ("<|start_of_role|>assistant<|end_of_role|>", false)
            }
            Llama2 | Llama2Sys | Llama2SysBos | Llama2SysStrip => {
                self.render_llama2(messages, &mut out);
                ("", true)
            }
            MistralV1 | MistralV3 | MistralV3Tekken => {
                self.render_mistral(messages, &mut out);
                ("", true)
            }
            GptOss => {
                for m in messages {
                    let close = if m.role == "assistant" {
                        "<|return|>"
                    } else {
                        "<|end|>"
                    };
                    out += &format!("<|start|>{}<|message|>{}{close}", m.role, m.content);
                }
                ("<|start|>assistant", false)
            }
            MistralV7 => {
                for m in messages {
                    match m.role.as_str() {
                        "system" => {
                            out += &format!("[SYSTEM_PROMPT] {}[/SYSTEM_PROMPT]", m.content)
                        }
                        "user" => out += &format!("[INST] {}[/INST]", m.content),
                        _ => out += &format!(" {}</s>", m.content),
                    }
                }
                ("", true)
            }
        };
        if add_generation_prompt && !closes_turns {
            out += open_assistant;
        }
        out
    }

    /// The Llama 2 formats: one `[INST]` opened at the start and after each assistant turn.
    fn render_llama2(self, messages: &[Message], out: &mut String) {
        let system_tags = self != ChatFormat::Llama2;
        let bos_inside = self == ChatFormat::Llama2SysBos;
        let strip = self == ChatFormat::Llama2SysStrip;
        *out += "[INST] ";
        let mut in_turn = true;
        for m in messages {
            let content = if strip { trim(&m.content) } else { &m.content };
            if !in_turn {
                in_turn = true;
                *out += if bos_inside { "<s>[INST] " } else { "[INST] " };
            }
            match m.role.as_str() {
                "system" if system_tags => *out += &format!("<<SYS>>\n{content}\n<</SYS>>\n\n"),
                "system" => *out += &format!("{content}\n"),
                "user" => *out += &format!("{content} [/INST]"),
                _ => {
                    *out += content;
                    *out += "</s>";
                    in_turn = false;
                }
            }
        }
    }

    /// Mistral v1 / v3 / v3-tekken: `[INST]` opens a turn that a user message closes.
    fn render_mistral(self, messages: &[Message], out: &mut String) {
        let lead = if self == ChatFormat::MistralV1 {
            " "
        } else {
            ""
        };
        let trail = if self == ChatFormat::MistralV3Tekken {
            ""
        } else {
            " "
        };
        let trim_assistant = self == ChatFormat::MistralV3;
        let mut in_turn = false;
        for m in messages {
            if !in_turn {
                *out += &format!("{lead}[INST]{trail}");
                in_turn = true;
            }
            match m.role.as_str() {
                "system" => *out += &format!("{}\n\n", m.content),
                "user" => *out += &format!("{}{lead}[/INST]", m.content),
                _ => {
                    let content = if trim_assistant {
                        trim(&m.content)
                    } else {
                        &m.content
                    };
                    *out += &format!("{trail}{content}</s>");
                    in_turn = false;
                }
            }
        }
    }
}

/// Python's `str.isspace` characters, which `strip()` and `split()` without arguments remove.
fn py_space(c: char) -> bool {
    c.is_whitespace() || matches!(c, '\x1C'..='\x1F')
}

/// The Python methods that chat templates written for jinja2 call on strings and dicts, which
/// minijinja does not have: `strip`, `lstrip`, `rstrip`, `startswith`, `endswith`, `split`,
/// `upper`, `lower`, `title`, `capitalize`, `replace`, `find`, `count` and `join` on strings;
/// `items`, `keys`, `values` and `get` on dicts. Anything else is an unknown method.
fn python_method(
    state: &State,
    value: &Value,
    method: &str,
    args: &[Value],
) -> std::result::Result<Value, minijinja::Error> {
    let unknown = || Err(minijinja::Error::from(ErrorKind::UnknownMethod));
    if value.kind() == ValueKind::Map {
        return match method {
            "items" => {
                let () = from_args(args)?;
                state.apply_filter("items", std::slice::from_ref(value))
            }
            "keys" => {
                let () = from_args(args)?;
                Ok(Value::from(value.try_iter()?.collect::<Vec<_>>()))
            }
            "values" => {
                let () = from_args(args)?;
                let values = value
                    .try_iter()?
                    .map(|k| value.get_item(&k))
                    .collect::<std::result::Result<Vec<_>, _>>()?;
                Ok(Value::from(values))
            }
            "get" => {
                let (key, default): (Value, Option<Value>) = from_args(args)?;
                let item = value.get_item(&key)?;
                Ok(if item.is_undefined() {
                    default.unwrap_or(Value::from(()))
                } else {
                    item
                })
            }
            _ => unknown(),
        };
    }
    let Some(s) = value.as_str() else {
        return unknown();
    };
    // `chars` as Python's strip argument: None strips white space.
    let stripper = |chars: Option<&str>| {
        let set: Option<Vec<char>> = chars.map(|c| c.chars().collect());
        move |c: char| {
            set.as_ref()
                .map_or_else(|| py_space(c), |set| set.contains(&c))
        }
    };
    let affix =
        |arg: &Value, test: &dyn Fn(&str) -> bool| -> std::result::Result<bool, minijinja::Error> {
            match arg.as_str() {
                Some(a) => Ok(test(a)),
                // A tuple of strings: any of them.
                None => {
                    for a in arg.try_iter()? {
                        if a.as_str().is_some_and(test) {
                            return Ok(true);
                        }
                    }
                    Ok(false)
                }
            }
        };
    Ok(match method {
        "strip" => {
            let (chars,): (Option<&str>,) = from_args(args)?;
            Value::from(s.trim_matches(stripper(chars)))
        }
        "lstrip" => {
            let (chars,): (Option<&str>,) = from_args(args)?;
            Value::from(s.trim_start_matches(stripper(chars)))
        }
        "rstrip" => {
            let (chars,): (Option<&str>,) = from_args(args)?;
            Value::from(s.trim_end_matches(stripper(chars)))
        }
        "startswith" => {
            let (prefix,): (Value,) = from_args(args)?;
            Value::from(affix(&prefix, &|p| s.starts_with(p))?)
        }
        "endswith" => {
            let (suffix,): (Value,) = from_args(args)?;
            Value::from(affix(&suffix, &|p| s.ends_with(p))?)
        }
        "split" => {
            let (sep, maxsplit): (Option<&str>, Option<i64>) = from_args(args)?;
            let limit = maxsplit.filter(|&m| m >= 0).map(|m| m as usize + 1);
            let parts: Vec<Value> = match sep {
                Some("") => {
                    return Err(minijinja::Error::new(
                        ErrorKind::InvalidOperation,
                        "split: empty separator",
                    ))
                }
                Some(sep) => match limit {
                    Some(n) => s.splitn(n, sep).map(Value::from).collect(),
                    None => s.split(sep).map(Value::from).collect(),
                },
                None => {
                    // Runs of white space separate; none are empty. With a limit, the last
                    // part is the rest of the text from its first non-space character.
                    let mut parts = Vec::new();
                    let mut rest = s.trim_start_matches(py_space);
                    while !rest.is_empty() {
                        if limit.is_some_and(|n| parts.len() + 1 == n) {
                            parts.push(Value::from(rest));
                            break;
                        }
                        let end = rest.find(py_space).unwrap_or(rest.len());
                        parts.push(Value::from(&rest[..end]));
                        rest = rest[end..].trim_start_matches(py_space);
                    }
                    parts
                }
            };
            Value::from(parts)
        }
        "upper" => {
            let () = from_args(args)?;
            Value::from(s.to_uppercase())
        }
        "lower" => {
            let () = from_args(args)?;
            Value::from(s.to_lowercase())
        }
        "title" | "capitalize" => {
            let () = from_args(args)?;
            let filter = if method == "title" {
                "title"
            } else {
                "capitalize"
            };
            state.apply_filter(filter, std::slice::from_ref(value))?
        }
        "replace" => {
            let (old, new, count): (&str, &str, Option<i64>) = from_args(args)?;
            match count.filter(|&c| c >= 0) {
                Some(c) => Value::from(s.replacen(old, new, c as usize)),
                None => Value::from(s.replace(old, new)),
            }
        }
        "find" => {
            let (sub,): (&str,) = from_args(args)?;
            // Python counts characters, not bytes.
            Value::from(s.find(sub).map_or(-1, |at| s[..at].chars().count() as i64))
        }
        "count" => {
            let (sub,): (&str,) = from_args(args)?;
            let n = if sub.is_empty() {
                s.chars().count() + 1
            } else {
                s.matches(sub).count()
            };
            Value::from(n as i64)
        }
        "join" => {
            let (items,): (Value,) = from_args(args)?;
            let mut out = String::new();
            for (i, item) in items.try_iter()?.enumerate() {
                if i > 0 {
                    out.push_str(s);
                }
                match item.as_str() {
                    Some(t) => out.push_str(t),
                    None => {
                        return Err(minijinja::Error::new(
                            ErrorKind::InvalidOperation,
                            "join: the items must be strings",
                        ))
                    }
                }
            }
            Value::from(out)
        }
        _ => return unknown(),
    })
}

/// Reads an optional string key of a GGUF file.
fn gguf_str<'f>(f: &'f GgufFile, key: &str) -> Result<Option<&'f str>> {
    f.get(key).map(|_| f.get_str(key)).transpose()
}

/// A file's template (`tokenizer.chat_template`), and the built-in format it is detected as;
/// without a template, the format of the file's architecture.
pub(crate) fn gguf_template(f: &GgufFile) -> Result<(Option<&str>, Option<ChatFormat>)> {
    match gguf_str(f, "tokenizer.chat_template")? {
        Some(t) => Ok((Some(t), ChatFormat::detect(t))),
        None => {
            let arch = gguf_str(f, "general.architecture")?.unwrap_or_default();
            Ok((None, Some(ChatFormat::for_architecture(arch))))
        }
    }
}

/// How a [`ChatTemplate`] renders.
#[derive(Debug)]
enum Renderer {
    /// A compiled Jinja template.
    Jinja(Box<Environment<'static>>),
    /// A built-in format.
    Builtin(ChatFormat),
}

/// A chat template: a compiled Jinja template or a built-in format.
#[derive(Debug)]
pub struct ChatTemplate {
    renderer: Renderer,
    format: Option<ChatFormat>,
    bos_token: String,
    eos_token: String,
    strip_bos: bool,
    strip_eos: bool,
    /// Whether the fall-back to the built-in format has been reported.
    warned: std::sync::atomic::AtomicBool,
}

impl ChatTemplate {
    /// Compiles a Jinja chat template. `bos_token` and `eos_token` are the texts of the model's
    /// BOS and EOS tokens (empty when it has none); some templates print them.
    pub fn new(
        template: &str,
        bos_token: impl Into<String>,
        eos_token: impl Into<String>,
    ) -> Result<Self> {
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.add_function(
            "raise_exception",
            |msg: String| -> std::result::Result<String, _> {
                Err(minijinja::Error::new(
                    ErrorKind::InvalidOperation,
                    format!("{REJECTION}{msg}"),
                ))
            },
        );
        env.set_unknown_method_callback(python_method);
        env.add_template_owned("chat", template.to_owned())
            .map_err(|e| Error::Model(format!("chat template does not compile: {e:#}")))?;
        Ok(ChatTemplate {
            renderer: Renderer::Jinja(Box::new(env)),
            format: ChatFormat::detect(template),
            bos_token: bos_token.into(),
            eos_token: eos_token.into(),
            strip_bos: false,
            strip_eos: false,
            warned: Default::default(),
        })
    }

    /// A built-in format.
    pub fn builtin(format: ChatFormat) -> Self {
        ChatTemplate {
            renderer: Renderer::Builtin(format),
            format: Some(format),
            bos_token: String::new(),
            eos_token: String::new(),
            strip_bos: false,
            strip_eos: false,
            warned: Default::default(),
        }
    }

    /// Plain ChatML.
    pub fn chatml() -> Self {
        Self::builtin(ChatFormat::ChatMl)
    }

    /// Whether a Jinja template's leading BOS text and trailing EOS text are removed from what
    /// it renders: set them when tokenizing adds those tokens itself.
    pub fn with_special_stripped(mut self, bos: bool, eos: bool) -> Self {
        self.strip_bos = bos;
        self.strip_eos = eos;
        self
    }

    /// The template of a GGUF file: its Jinja `tokenizer.chat_template` (with the texts of its
    /// BOS and EOS tokens, removed where tokenizing adds them), or the built-in format that
    /// template is detected as when it does not compile, or the built-in format of the file's
    /// architecture when it has no template.
    pub fn from_gguf(f: &GgufFile) -> Result<Self> {
        let (template, format) = gguf_template(f)?;
        let Some(template) = template else {
            // gguf_template gives a format whenever there is no template.
            let format = format.unwrap_or(ChatFormat::ChatMl);
            log::info!(
                "{}: no chat template in the file; using the built-in '{}' format",
                f.path(),
                format.name()
            );
            return Ok(Self::builtin(format));
        };
        let tokens = f.get_str_array("tokenizer.ggml.tokens").unwrap_or_default();
        let token_text = |key: &str| -> String {
            f.get_u32(key)
                .ok()
                .and_then(|id| tokens.get(id as usize).map(|t| t.to_string()))
                .unwrap_or_default()
        };
        let bos = token_text("tokenizer.ggml.bos_token_id");
        let eos = token_text("tokenizer.ggml.eos_token_id");
        let (add_bos, add_eos) = crate::tokenizer::gguf_add_bos_eos(f)?;
        match (ChatTemplate::new(template, bos, eos), format) {
            (Ok(t), _) => Ok(t.with_special_stripped(add_bos, add_eos)),
            (Err(e), Some(format)) => {
                log::warn!(
                    "{}: {e}; using llama.cpp's built-in '{}' format, which the template is \
                     detected as",
                    f.path(),
                    format.name()
                );
                Ok(Self::builtin(format))
            }
            (Err(e), None) => Err(Error::Model(format!("{}: {e}", f.path()))),
        }
    }

    /// The built-in format this template is (or is detected as), if any.
    pub fn format(&self) -> Option<ChatFormat> {
        self.format
    }

    /// The text of the token that ends a turn, when the format is known.
    pub fn end_of_turn(&self) -> Option<&'static str> {
        self.format.map(ChatFormat::end_of_turn)
    }

    /// Renders `messages`; with `add_generation_prompt` the text ends with the opening of the
    /// assistant's turn, ready for generation.
    pub fn render(&self, messages: &[Message], add_generation_prompt: bool) -> Result<String> {
        let env = match &self.renderer {
            Renderer::Builtin(format) => return Ok(format.render(messages, add_generation_prompt)),
            Renderer::Jinja(env) => env,
        };
        let rendered = env.get_template("chat").and_then(|tmpl| {
            tmpl.render(context! {
                messages => messages,
                add_generation_prompt => add_generation_prompt,
                bos_token => &self.bos_token,
                eos_token => &self.eos_token,
                // Present but none, as llama-cpp-python and Hugging Face pass them.
                tools => (),
                tool_choice => (),
                functions => (),
                function_call => (),
            })
        });
        let mut text = match rendered {
            Ok(text) => text,
            Err(e) if e.kind() == ErrorKind::InvalidOperation && is_rejection(&e) => {
                return Err(Error::Invalid(format!(
                    "the chat template rejects these messages: {}",
                    e.detail().unwrap_or_default()
                )))
            }
            Err(e) => match self.format {
                // A template that needs what minijinja lacks is rendered as llama.cpp renders
                // the format it is detected as.
                Some(format) => {
                    if !self.warned.swap(true, std::sync::atomic::Ordering::Relaxed) {
                        log::warn!(
                            "the chat template does not render ({e:#}); using llama.cpp's \
                             built-in '{}' format, which it is detected as",
                            format.name()
                        );
                    }
                    return Ok(format.render(messages, add_generation_prompt));
                }
                None => {
                    return Err(Error::Model(format!(
                        "the chat template does not render: {e:#}"
                    )))
                }
            },
        };
        if self.strip_bos && !self.bos_token.is_empty() && text.starts_with(&self.bos_token) {
            text.drain(..self.bos_token.len());
        }
        if self.strip_eos && !self.eos_token.is_empty() && text.ends_with(&self.eos_token) {
            text.truncate(text.len() - self.eos_token.len());
        }
        Ok(text)
    }
}

/// The start of the detail of every error `raise_exception` gives.
const REJECTION: &str = "raise_exception: ";

/// Whether a render error is the template's own `raise_exception`.
fn is_rejection(e: &minijinja::Error) -> bool {
    e.detail().is_some_and(|d| d.starts_with(REJECTION))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chatml_renders_turns_and_generation_prompt() {
        let t = ChatTemplate::chatml();
        let msgs = [
            Message::new("system", "Be brief."),
            Message::new("user", "Hi"),
        ];
        assert_eq!(
            t.render(&msgs, true).unwrap(),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n\
             <|im_start|>assistant\n"
        );
        assert_eq!(
            t.render(&msgs[1..], false).unwrap(),
            "<|im_start|>user\nHi<|im_end|>\n"
        );
        assert_eq!(t.render(&[], false).unwrap(), "");
        assert_eq!(t.end_of_turn(), Some("<|im_end|>"));
    }

    #[test]
    fn bad_templates_give_errors() {
        assert!(matches!(
            ChatTemplate::new("{% for %}", "", ""),
            Err(Error::Model(_))
        ));
        let t = ChatTemplate::new("{{ raise_exception('no system role') }}", "", "").unwrap();
        let e = t.render(&[], true).unwrap_err();
        assert!(matches!(e, Error::Invalid(_)), "{e}");
        assert!(e.to_string().contains("no system role"), "{e}");
        // A template that needs what minijinja lacks, and matches no built-in format.
        let t = ChatTemplate::new("{{ messages[0].content.zfill(3) }}", "", "").unwrap();
        let msgs = [Message::new("user", "a")];
        assert!(matches!(t.render(&msgs, true), Err(Error::Model(_))));
    }

    #[test]
    fn a_template_that_does_not_render_falls_back_to_its_format() {
        let t =
            ChatTemplate::new("<|im_start|>{{ messages[0].content.zfill(3) }}", "", "").unwrap();
        assert_eq!(t.format(), Some(ChatFormat::ChatMl));
        let msgs = [Message::new("user", "a")];
        for _ in 0..2 {
            assert_eq!(
                t.render(&msgs, true).unwrap(),
                "<|im_start|>user\na<|im_end|>\n<|im_start|>assistant\n"
            );
        }
        // Its own rejection is not a failure to render.
        let t = ChatTemplate::new("<|im_start|>{{ raise_exception('no') }}", "", "").unwrap();
        assert!(matches!(t.render(&msgs, true), Err(Error::Invalid(_))));
    }

    #[test]
    fn bos_and_eos_are_visible_and_stripped_where_tokenizing_adds_them() {
        let src = "{{ bos_token }}{{ messages[0].content }}{{ eos_token }}";
        let msgs = [Message::new("user", "a")];
        let t = ChatTemplate::new(src, "<s>", "</s>").unwrap();
        assert_eq!(t.render(&msgs, false).unwrap(), "<s>a</s>");
        let t = t.with_special_stripped(true, false);
        assert_eq!(t.render(&msgs, false).unwrap(), "a</s>");
        let t = t.with_special_stripped(true, true);
        assert_eq!(t.render(&msgs, false).unwrap(), "a");
        // Nothing is stripped from the middle, nor when the token has no text.
        let t = ChatTemplate::new("x{{ bos_token }}", "<s>", "")
            .unwrap()
            .with_special_stripped(true, true);
        assert_eq!(t.render(&msgs, false).unwrap(), "x<s>");
    }

    #[test]
    fn trim_blocks_like_hugging_face() {
        let t = ChatTemplate::new(
            "{% for m in messages %}\n  {{ m.content }}\n{% endfor %}",
            "",
            "",
        )
        .unwrap();
        let msgs = [Message::new("user", "a"), Message::new("user", "b")];
        assert_eq!(t.render(&msgs, false).unwrap(), "  a\n  b\n");
        assert_eq!(t.format(), None);
    }

    #[test]
    fn formats_by_name_and_architecture() {
        for f in FORMATS {
            assert_eq!(ChatFormat::from_name(f.name()), Some(f));
            assert_eq!(ChatFormat::detect(f.name()), Some(f));
        }
        assert_eq!(
            ChatFormat::from_name("granite-4.1"),
            Some(ChatFormat::Granite4)
        );
        assert_eq!(ChatFormat::from_name("zephyr"), None);
        for (arch, f) in [
            ("gemma3", ChatFormat::Gemma),
            ("gemma2", ChatFormat::Gemma),
            ("qwen2", ChatFormat::ChatMl),
            ("qwen3", ChatFormat::ChatMl),
            ("phi3", ChatFormat::Phi3),
            ("llama", ChatFormat::ChatMl),
            ("granite", ChatFormat::Granite),
            ("", ChatFormat::ChatMl),
        ] {
            assert_eq!(ChatFormat::for_architecture(arch), f, "{arch}");
        }
    }

    #[test]
    fn detection_follows_llama_cpp_order() {
        // Phi 4 and SmolVLM use `<|im_start|>` but are not ChatML.
        assert_eq!(ChatFormat::detect("<|im_start|><|im_sep|>"), None);
        assert_eq!(
            ChatFormat::detect("<|im_start|><start_of_turn>"),
            Some(ChatFormat::ChatMl)
        );
        // Vicuna's markers come before Llama 3's in llama.cpp's checks.
        assert_eq!(
            ChatFormat::detect("USER: ASSISTANT: <|start_header_id|><|end_header_id|>"),
            None
        );
        assert_eq!(
            ChatFormat::detect("<|start_header_id|><|end_header_id|><start_of_turn>"),
            Some(ChatFormat::Gemma)
        );
        assert_eq!(ChatFormat::detect("mistral-like"), Some(ChatFormat::Llama2));
        assert_eq!(ChatFormat::detect("not mistral"), None);
    }

    #[test]
    fn gemma_joins_system_messages_into_the_first_user_turn() {
        let msgs = [
            Message::new("system", " Be brief. "),
            Message::new("assistant", "Hello."),
            Message::new("user", "\tHi\n"),
        ];
        assert_eq!(
            ChatFormat::Gemma.render(&msgs, true),
            "<start_of_turn>model\nHello.<end_of_turn>\n\
             <start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\n"
        );
    }
}
