//! Chat prompts: render a conversation with the model's own chat template.
//!
//! GGUF files carry the Hugging Face Jinja template as `tokenizer.chat_template`. It is rendered
//! with minijinja the way Hugging Face and llama-cpp-python render it with jinja2: blocks trim
//! the newline after them and strip the whitespace before them, and the template sees
//! `messages` (a list of `{role, content}` maps), `add_generation_prompt`, `bos_token` and
//! `eos_token`, plus a `raise_exception(msg)` function that templates call to reject input.
//! A model without a template gets plain ChatML.
//!
//! The rendered text contains special tokens as text (`<|im_start|>` ...): tokenize it with
//! `parse_special = true`.

use minijinja::{context, Environment, ErrorKind};
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

/// ChatML, used when a model has no template of its own.
pub const CHATML_TEMPLATE: &str = "{% for message in messages %}\
{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}\
{% endfor %}\
{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

/// A compiled chat template.
#[derive(Debug)]
pub struct ChatTemplate {
    env: Environment<'static>,
    bos_token: String,
    eos_token: String,
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
                Err(minijinja::Error::new(ErrorKind::InvalidOperation, msg))
            },
        );
        env.add_template_owned("chat", template.to_owned())
            .map_err(|e| Error::Model(format!("chat template does not compile: {e:#}")))?;
        Ok(ChatTemplate {
            env,
            bos_token: bos_token.into(),
            eos_token: eos_token.into(),
        })
    }

    /// The model's template when it has one (`tokenizer.chat_template`), else ChatML.
    pub fn or_chatml(
        template: Option<&str>,
        bos_token: impl Into<String>,
        eos_token: impl Into<String>,
    ) -> Result<Self> {
        Self::new(template.unwrap_or(CHATML_TEMPLATE), bos_token, eos_token)
    }

    /// The template of a GGUF file (`tokenizer.chat_template`, else ChatML), with the texts of
    /// its BOS and EOS tokens.
    pub fn from_gguf(f: &GgufFile) -> Result<Self> {
        let template = match f.get("tokenizer.chat_template") {
            Some(_) => Some(f.get_str("tokenizer.chat_template")?),
            None => None,
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
        Self::or_chatml(template, bos, eos)
    }

    /// Plain ChatML.
    pub fn chatml() -> Self {
        // The built-in template is known to compile.
        Self::new(CHATML_TEMPLATE, "", "").expect("built-in ChatML template compiles")
    }

    /// Renders `messages`; with `add_generation_prompt` the text ends with the opening of the
    /// assistant's turn, ready for generation.
    pub fn render(&self, messages: &[Message], add_generation_prompt: bool) -> Result<String> {
        let tmpl = self
            .env
            .get_template("chat")
            .map_err(|e| Error::Model(format!("chat template: {e:#}")))?;
        tmpl.render(context! {
            messages => messages,
            add_generation_prompt => add_generation_prompt,
            bos_token => &self.bos_token,
            eos_token => &self.eos_token,
        })
        .map_err(|e| Error::Invalid(format!("chat template cannot render these messages: {e:#}")))
    }
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
    }

    #[test]
    fn missing_template_falls_back_to_chatml() {
        let t = ChatTemplate::or_chatml(None, "", "").unwrap();
        assert_eq!(
            t.render(&[Message::new("user", "x")], true).unwrap(),
            "<|im_start|>user\nx<|im_end|>\n<|im_start|>assistant\n"
        );
    }

    #[test]
    fn bad_templates_give_errors() {
        assert!(matches!(
            ChatTemplate::new("{% for %}", "", ""),
            Err(Error::Model(_))
        ));
        let t = ChatTemplate::new("{{ raise_exception('no system role') }}", "", "").unwrap();
        let e = t.render(&[], true).unwrap_err();
        assert!(e.to_string().contains("no system role"), "{e}");
    }

    #[test]
    fn bos_and_eos_are_visible() {
        let t = ChatTemplate::new(
            "{{ bos_token }}{{ messages[0].content }}{{ eos_token }}",
            "<s>",
            "</s>",
        )
        .unwrap();
        assert_eq!(
            t.render(&[Message::new("user", "a")], false).unwrap(),
            "<s>a</s>"
        );
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
    }
}
