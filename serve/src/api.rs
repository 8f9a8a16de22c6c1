//! The OpenAI request bodies the server accepts, parsed and checked into what the engine runs,
//! and the error object every failure answers with.
//!
//! Parsing is a pure function of the body's bytes ([`parse_chat`], [`parse_completion`],
//! [`parse_embeddings`]): anything a client can send gives a request or an [`ApiError`] with
//! the status OpenAI uses (400 for malformed JSON and wrong or out-of-range fields), never a
//! panic. Fields this server does not implement with a value other than their default are
//! refused by name rather than ignored.

use serde::Deserialize;
use serde_json::{json, Value};

/// Most stop strings a request may give (OpenAI's limit).
pub const MAX_STOP: usize = 4;
/// Most top alternatives per token (OpenAI's limit for chat; completions allow 5).
pub const MAX_TOP_LOGPROBS: usize = 20;

/// An error answered as OpenAI's error object.
#[derive(Clone, Debug, PartialEq)]
pub struct ApiError {
    /// HTTP status.
    pub status: u16,
    /// OpenAI's `type`: invalid_request_error, authentication_error, server_error, ...
    pub kind: &'static str,
    /// OpenAI's `code` (None: null).
    pub code: Option<&'static str>,
    /// The field at fault (None: null).
    pub param: Option<String>,
    /// What is wrong.
    pub message: String,
}

impl ApiError {
    /// A 400 invalid request, about `param` when given.
    pub fn invalid(param: Option<&str>, message: impl Into<String>) -> Self {
        ApiError {
            status: 400,
            kind: "invalid_request_error",
            code: None,
            param: param.map(str::to_string),
            message: message.into(),
        }
    }

    /// An error with a status, type and code.
    pub fn new(
        status: u16,
        kind: &'static str,
        code: &'static str,
        message: impl Into<String>,
    ) -> Self {
        ApiError {
            status,
            kind,
            code: Some(code),
            param: None,
            message: message.into(),
        }
    }

    /// The JSON body.
    pub fn body(&self) -> Value {
        json!({"error": {
            "message": self.message,
            "type": self.kind,
            "param": self.param,
            "code": self.code,
        }})
    }
}

/// A chat message's content: a string, or parts of which the text ones are read.
#[derive(Deserialize, Debug)]
#[serde(untagged)]
enum Content {
    Text(String),
    Parts(Vec<Part>),
}

#[derive(Deserialize, Debug)]
struct Part {
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    text: Option<String>,
}

#[derive(Deserialize, Debug)]
struct ChatMessage {
    role: String,
    #[serde(default)]
    content: Option<Content>,
}

#[derive(Deserialize, Debug)]
#[serde(untagged)]
enum Stop {
    One(String),
    Many(Vec<String>),
}

/// `prompt` of a completion: a string or one string in an array.
#[derive(Deserialize, Debug)]
#[serde(untagged)]
enum Prompt {
    One(String),
    Many(Vec<String>),
}

/// Fields shared by chat and completions (others, such as `user` or `metadata`, do not change
/// the output and are ignored).
#[derive(Deserialize, Debug)]
struct Body {
    #[serde(default)]
    model: Option<String>,
    #[serde(default)]
    messages: Option<Vec<ChatMessage>>,
    #[serde(default)]
    prompt: Option<Prompt>,
    #[serde(default)]
    stream: Option<bool>,
    #[serde(default)]
    stream_options: Option<Value>,
    #[serde(default)]
    temperature: Option<f64>,
    #[serde(default)]
    top_p: Option<f64>,
    #[serde(default)]
    max_tokens: Option<i64>,
    #[serde(default)]
    max_completion_tokens: Option<i64>,
    #[serde(default)]
    stop: Option<Stop>,
    #[serde(default)]
    seed: Option<i64>,
    #[serde(default)]
    n: Option<i64>,
    /// Chat: a boolean; completions: how many top alternatives (an integer).
    #[serde(default)]
    logprobs: Option<Value>,
    #[serde(default)]
    top_logprobs: Option<i64>,
    #[serde(default)]
    echo: Option<bool>,
    #[serde(default)]
    frequency_penalty: Option<f64>,
    #[serde(default)]
    presence_penalty: Option<f64>,
    #[serde(default)]
    logit_bias: Option<Value>,
    #[serde(default)]
    suffix: Option<String>,
    #[serde(default)]
    best_of: Option<i64>,
    #[serde(default)]
    tools: Option<Value>,
    #[serde(default)]
    tool_choice: Option<Value>,
    #[serde(default)]
    response_format: Option<Value>,
}

/// What to generate, checked.
#[derive(Clone, Debug, PartialEq)]
pub struct GenRequest {
    /// The `model` field, when given.
    pub model: Option<String>,
    /// Chat messages (role, text), or None for a completion.
    pub messages: Option<Vec<(String, String)>>,
    /// A completion's prompt text.
    pub prompt: String,
    /// Stream as server-sent events.
    pub stream: bool,
    /// Send a last chunk with the token counts when streaming.
    pub include_usage: bool,
    /// Softmax temperature (0: greedy).
    pub temperature: f32,
    /// Nucleus mass.
    pub top_p: f32,
    /// Most tokens (None: up to the context's end).
    pub max_tokens: Option<usize>,
    /// Stop strings.
    pub stop: Vec<String>,
    /// Seed of the draw (None: a random one).
    pub seed: Option<u64>,
    /// Log-probabilities: None off, Some(k) with k top alternatives.
    pub logprobs: Option<usize>,
}

/// The body as JSON, or the 400 that says why not.
fn json_body<T: serde::de::DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    serde_json::from_slice(bytes).map_err(|e| {
        let what = match e.classify() {
            serde_json::error::Category::Data => "a field has the wrong type or value",
            _ => "the body is not valid JSON",
        };
        ApiError::invalid(None, format!("{what}: {e}"))
    })
}

fn non_negative(v: i64, param: &str) -> Result<usize, ApiError> {
    usize::try_from(v)
        .map_err(|_| ApiError::invalid(Some(param), format!("{param} must be at least 0, not {v}")))
}

fn common(b: &Body) -> Result<GenRequest, ApiError> {
    let unsupported =
        |param: &str, why: &str| Err(ApiError::invalid(Some(param), format!("{param} {why}")));
    if let Some(n) = b.n {
        if n != 1 {
            return unsupported("n", "must be 1: one choice per request");
        }
    }
    if b.best_of.is_some_and(|v| v != 1) {
        return unsupported("best_of", "must be 1");
    }
    if b.echo == Some(true) {
        return unsupported("echo", "is not supported");
    }
    if b.suffix.as_deref().is_some_and(|s| !s.is_empty()) {
        return unsupported("suffix", "is not supported");
    }
    for (name, v) in [
        ("frequency_penalty", b.frequency_penalty),
        ("presence_penalty", b.presence_penalty),
    ] {
        if v.is_some_and(|x| x != 0.0) {
            return unsupported(name, "is not supported (only 0)");
        }
    }
    if b.logit_bias
        .as_ref()
        .is_some_and(|v| !v.is_null() && v.as_object().is_none_or(|o| !o.is_empty()))
    {
        return unsupported("logit_bias", "is not supported");
    }
    if b.tools
        .as_ref()
        .is_some_and(|v| !v.is_null() && v.as_array().is_none_or(|a| !a.is_empty()))
    {
        return unsupported("tools", "are not supported");
    }
    if b.tool_choice
        .as_ref()
        .is_some_and(|v| !v.is_null() && v != "none" && v != "auto")
    {
        return unsupported("tool_choice", "is not supported");
    }
    if let Some(rf) = &b.response_format {
        if !rf.is_null() && rf.get("type").and_then(Value::as_str) != Some("text") {
            return unsupported("response_format", "must be {\"type\": \"text\"}");
        }
    }
    let temperature = b.temperature.unwrap_or(1.0);
    if !(0.0..=2.0).contains(&temperature) {
        return unsupported("temperature", "must be between 0 and 2");
    }
    let top_p = b.top_p.unwrap_or(1.0);
    if !(top_p > 0.0 && top_p <= 1.0) {
        return unsupported("top_p", "must be above 0 and at most 1");
    }
    let max_tokens = match b.max_completion_tokens.or(b.max_tokens) {
        Some(v) => Some(non_negative(v, "max_tokens")?),
        None => None,
    };
    if max_tokens == Some(0) {
        return unsupported("max_tokens", "must be at least 1");
    }
    let stop = match &b.stop {
        None => Vec::new(),
        Some(Stop::One(s)) => vec![s.clone()],
        Some(Stop::Many(v)) => v.clone(),
    };
    if stop.len() > MAX_STOP {
        return unsupported("stop", &format!("may hold at most {MAX_STOP} strings"));
    }
    let include_usage = b
        .stream_options
        .as_ref()
        .and_then(|o| o.get("include_usage"))
        .and_then(Value::as_bool)
        .unwrap_or(false);
    Ok(GenRequest {
        model: b.model.clone(),
        messages: None,
        prompt: String::new(),
        stream: b.stream.unwrap_or(false),
        include_usage,
        temperature: temperature as f32,
        top_p: top_p as f32,
        max_tokens,
        stop,
        seed: b.seed.map(|s| s as u64),
        logprobs: None,
    })
}

/// Parses a `/v1/chat/completions` body.
pub fn parse_chat(bytes: &[u8]) -> Result<GenRequest, ApiError> {
    let b: Body = json_body(bytes)?;
    if b.prompt.is_some() {
        return Err(ApiError::invalid(
            Some("prompt"),
            "a chat request takes messages, not a prompt",
        ));
    }
    let mut r = common(&b)?;
    let Some(msgs) = &b.messages else {
        return Err(ApiError::invalid(Some("messages"), "messages is required"));
    };
    if msgs.is_empty() {
        return Err(ApiError::invalid(
            Some("messages"),
            "messages must not be empty",
        ));
    }
    let mut out = Vec::with_capacity(msgs.len());
    for m in msgs {
        if !matches!(
            m.role.as_str(),
            "system" | "developer" | "user" | "assistant" | "tool"
        ) {
            return Err(ApiError::invalid(
                Some("messages"),
                format!("unknown role {:?}", m.role),
            ));
        }
        let text = match &m.content {
            None => String::new(),
            Some(Content::Text(t)) => t.clone(),
            Some(Content::Parts(parts)) => {
                let mut t = String::new();
                for p in parts {
                    match (p.kind.as_str(), &p.text) {
                        ("text", Some(s)) => t.push_str(s),
                        _ => {
                            return Err(ApiError::invalid(
                                Some("messages"),
                                format!(
                                    "content parts of type {:?} are not supported (text only)",
                                    p.kind
                                ),
                            ))
                        }
                    }
                }
                t
            }
        };
        let role = if m.role == "developer" {
            "system"
        } else {
            m.role.as_str()
        };
        out.push((role.to_string(), text));
    }
    r.messages = Some(out);
    r.logprobs = match &b.logprobs {
        None | Some(Value::Null) | Some(Value::Bool(false)) => {
            if b.top_logprobs.is_some_and(|k| k > 0) {
                return Err(ApiError::invalid(
                    Some("top_logprobs"),
                    "top_logprobs needs logprobs: true",
                ));
            }
            None
        }
        Some(Value::Bool(true)) => Some(top(
            b.top_logprobs.unwrap_or(0),
            "top_logprobs",
            MAX_TOP_LOGPROBS,
        )?),
        Some(_) => {
            return Err(ApiError::invalid(
                Some("logprobs"),
                "logprobs must be a boolean",
            ))
        }
    };
    Ok(r)
}

fn top(k: i64, param: &str, max: usize) -> Result<usize, ApiError> {
    let k = non_negative(k, param)?;
    if k > max {
        return Err(ApiError::invalid(
            Some(param),
            format!("{param} must be at most {max}"),
        ));
    }
    Ok(k)
}

/// Parses a `/v1/completions` body.
pub fn parse_completion(bytes: &[u8]) -> Result<GenRequest, ApiError> {
    let b: Body = json_body(bytes)?;
    if b.messages.is_some() {
        return Err(ApiError::invalid(
            Some("messages"),
            "a completion takes a prompt, not messages",
        ));
    }
    let mut r = common(&b)?;
    r.prompt = match &b.prompt {
        None => return Err(ApiError::invalid(Some("prompt"), "prompt is required")),
        Some(Prompt::One(s)) => s.clone(),
        Some(Prompt::Many(v)) if v.len() == 1 => v[0].clone(),
        Some(Prompt::Many(_)) => {
            return Err(ApiError::invalid(
                Some("prompt"),
                "prompt must be one string (one choice per request)",
            ))
        }
    };
    if b.top_logprobs.is_some() {
        return Err(ApiError::invalid(
            Some("top_logprobs"),
            "completions take logprobs: N",
        ));
    }
    r.logprobs = match &b.logprobs {
        None | Some(Value::Null) => None,
        Some(Value::Number(n)) => Some(top(n.as_i64().unwrap_or(-1), "logprobs", 5)?),
        Some(_) => {
            return Err(ApiError::invalid(
                Some("logprobs"),
                "logprobs must be an integer",
            ))
        }
    };
    Ok(r)
}

/// An embeddings request, checked.
#[derive(Clone, Debug, PartialEq)]
pub struct EmbedRequest {
    /// The `model` field, when given.
    pub model: Option<String>,
    /// The texts, or token id lists.
    pub inputs: Vec<EmbedInput>,
    /// Vectors as base64 of little-endian f32s (true) or JSON numbers.
    pub base64: bool,
}

/// One input of an embeddings request.
#[derive(Clone, Debug, PartialEq)]
pub enum EmbedInput {
    /// A text.
    Text(String),
    /// Token ids.
    Tokens(Vec<u32>),
}

#[derive(Deserialize, Debug)]
#[serde(untagged)]
enum EmbedInputs {
    One(String),
    Many(Vec<String>),
    Tokens(Vec<u32>),
    TokenLists(Vec<Vec<u32>>),
}

#[derive(Deserialize, Debug)]
struct EmbedBody {
    #[serde(default)]
    model: Option<String>,
    input: EmbedInputs,
    #[serde(default)]
    encoding_format: Option<String>,
    #[serde(default)]
    dimensions: Option<i64>,
}

/// Most inputs in one embeddings request (OpenAI's limit).
pub const MAX_EMBED_INPUTS: usize = 2048;

/// Parses a `/v1/embeddings` body.
pub fn parse_embeddings(bytes: &[u8]) -> Result<EmbedRequest, ApiError> {
    let b: EmbedBody = json_body(bytes)?;
    let base64 = match b.encoding_format.as_deref() {
        None | Some("float") => false,
        Some("base64") => true,
        Some(f) => {
            return Err(ApiError::invalid(
                Some("encoding_format"),
                format!("encoding_format must be \"float\" or \"base64\", not {f:?}"),
            ))
        }
    };
    if b.dimensions.is_some() {
        return Err(ApiError::invalid(Some("dimensions"), "is not supported"));
    }
    let inputs: Vec<EmbedInput> = match b.input {
        EmbedInputs::One(s) => vec![EmbedInput::Text(s)],
        EmbedInputs::Many(v) => v.into_iter().map(EmbedInput::Text).collect(),
        EmbedInputs::Tokens(t) => vec![EmbedInput::Tokens(t)],
        EmbedInputs::TokenLists(v) => v.into_iter().map(EmbedInput::Tokens).collect(),
    };
    if inputs.is_empty() || inputs.len() > MAX_EMBED_INPUTS {
        return Err(ApiError::invalid(
            Some("input"),
            format!("input must hold 1 to {MAX_EMBED_INPUTS} items"),
        ));
    }
    if inputs.iter().any(|i| match i {
        EmbedInput::Text(s) => s.is_empty(),
        EmbedInput::Tokens(t) => t.is_empty(),
    }) {
        return Err(ApiError::invalid(Some("input"), "an input is empty"));
    }
    Ok(EmbedRequest {
        model: b.model,
        inputs,
        base64,
    })
}

#[cfg(test)]
mod tests;
