//! The request parser: valid bodies give the request they say, each kind of fault its 400, and
//! random bodies (mutated valid ones, random JSON values, random bytes) never panic and always
//! give a request or an error with a 4xx status and a message.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};

use super::*;

#[test]
fn a_chat_request_parses() {
    let body = json!({
        "model": "m", "stream": true, "stream_options": {"include_usage": true},
        "temperature": 0.5, "top_p": 0.9, "max_tokens": 12, "stop": "END", "seed": 3,
        "logprobs": true, "top_logprobs": 2, "user": "someone",
        "messages": [
            {"role": "developer", "content": "Be brief."},
            {"role": "user", "content": [{"type": "text", "text": "Hi "}, {"type": "text", "text": "there"}]},
        ],
    });
    let r = parse_chat(body.to_string().as_bytes()).unwrap();
    assert_eq!(r.model.as_deref(), Some("m"));
    assert!(r.stream && r.include_usage);
    assert_eq!((r.temperature, r.top_p, r.max_tokens), (0.5, 0.9, Some(12)));
    assert_eq!(r.stop, vec!["END".to_string()]);
    assert_eq!((r.seed, r.logprobs), (Some(3), Some(2)));
    let msgs = r.messages.unwrap();
    assert_eq!(msgs[0], ("system".to_string(), "Be brief.".to_string()));
    assert_eq!(msgs[1], ("user".to_string(), "Hi there".to_string()));
}

#[test]
fn a_completion_and_embeddings_parse() {
    let r =
        parse_completion(br#"{"prompt": ["Once"], "logprobs": 3, "stop": ["a", "b"]}"#).unwrap();
    assert_eq!(r.prompt, "Once");
    assert_eq!(r.logprobs, Some(3));
    assert_eq!(r.stop.len(), 2);
    assert_eq!(r.max_tokens, None);
    assert!(!r.stream);
    let e = parse_embeddings(br#"{"input": ["a", "b"], "encoding_format": "base64"}"#).unwrap();
    assert_eq!(
        e.inputs,
        vec![EmbedInput::Text("a".into()), EmbedInput::Text("b".into())]
    );
    assert!(e.base64);
    let e = parse_embeddings(br#"{"input": [[1, 2], [3]]}"#).unwrap();
    assert_eq!(
        e.inputs,
        vec![EmbedInput::Tokens(vec![1, 2]), EmbedInput::Tokens(vec![3])]
    );
}

#[test]
fn faults_get_400_naming_the_field() {
    let chat = |extra: Value| {
        let mut b = json!({"messages": [{"role": "user", "content": "hi"}]});
        for (k, v) in extra.as_object().unwrap() {
            b[k] = v.clone();
        }
        parse_chat(b.to_string().as_bytes()).unwrap_err()
    };
    let cases = [
        (json!({"max_tokens": -1}), "max_tokens"),
        (json!({"max_tokens": 0}), "max_tokens"),
        (json!({"n": 3}), "n"),
        (json!({"temperature": 3.0}), "temperature"),
        (json!({"top_p": 0.0}), "top_p"),
        (json!({"stop": ["a", "b", "c", "d", "e"]}), "stop"),
        (json!({"top_logprobs": 2}), "top_logprobs"),
        (
            json!({"logprobs": true, "top_logprobs": 21}),
            "top_logprobs",
        ),
        (json!({"frequency_penalty": 0.5}), "frequency_penalty"),
        (json!({"tools": [{"type": "function"}]}), "tools"),
        (json!({"messages": []}), "messages"),
        (
            json!({"messages": [{"role": "wizard", "content": "x"}]}),
            "messages",
        ),
        (json!({"prompt": "x"}), "prompt"),
    ];
    for (extra, param) in cases {
        let e = chat(extra.clone());
        assert_eq!(e.status, 400, "{extra}");
        assert_eq!(e.param.as_deref(), Some(param), "{extra}: {}", e.message);
    }
    for bad in [
        &b"{"[..],
        b"",
        b"[]",
        b"null",
        b"{\"messages\": 5}",
        b"\xff\xfe",
    ] {
        let e = parse_chat(bad).unwrap_err();
        assert_eq!(e.status, 400);
        assert!(!e.message.is_empty());
    }
    assert_eq!(
        parse_completion(b"{}").unwrap_err().param.as_deref(),
        Some("prompt")
    );
    assert_eq!(
        parse_embeddings(br#"{"input": []}"#).unwrap_err().status,
        400
    );
    assert_eq!(
        parse_embeddings(br#"{"input": [""]}"#).unwrap_err().status,
        400
    );
    let body = ApiError::invalid(Some("n"), "no").body();
    assert_eq!(body["error"]["param"], "n");
    assert_eq!(body["error"]["type"], "invalid_request_error");
}

/// A random JSON value, nested to `depth`.
fn random_value(rng: &mut StdRng, depth: u32) -> Value {
    let keys = [
        "model",
        "messages",
        "prompt",
        "stream",
        "temperature",
        "top_p",
        "max_tokens",
        "stop",
        "seed",
        "n",
        "logprobs",
        "top_logprobs",
        "role",
        "content",
        "input",
        "type",
        "text",
        "stream_options",
        "include_usage",
        "encoding_format",
    ];
    match rng.gen_range(0..if depth == 0 { 6 } else { 8 }) {
        0 => Value::Null,
        1 => json!(rng.gen::<bool>()),
        2 => json!(rng.gen_range(-1_000_000_000i64..1_000_000_000)),
        3 => json!(rng.gen_range(-1e12..1e12)),
        4 => json!(
            ["user", "system", "assistant", "text", "", "float", "base64"][rng.gen_range(0..7)]
        ),
        5 => json!(rng.gen::<u64>()),
        6 => Value::Array(
            (0..rng.gen_range(0..4))
                .map(|_| random_value(rng, depth - 1))
                .collect(),
        ),
        _ => Value::Object(
            (0..rng.gen_range(0..5))
                .map(|_| {
                    (
                        keys[rng.gen_range(0..keys.len())].to_string(),
                        random_value(rng, depth - 1),
                    )
                })
                .collect(),
        ),
    }
}

/// Replaces a random node of `v` (objects and arrays included) with a random value.
fn mutate(rng: &mut StdRng, v: &mut Value) {
    let children: usize = match v {
        Value::Object(o) => o.len(),
        Value::Array(a) => a.len(),
        _ => 0,
    };
    if children == 0 || rng.gen_bool(0.3) {
        *v = random_value(rng, 2);
        return;
    }
    let i = rng.gen_range(0..children);
    match v {
        Value::Object(o) => {
            if let Some((_, child)) = o.iter_mut().nth(i) {
                mutate(rng, child);
            }
        }
        Value::Array(a) => mutate(rng, &mut a[i]),
        _ => {}
    }
}

fn check_outcome<T>(r: Result<T, ApiError>, input: &[u8]) {
    if let Err(e) = r {
        assert!(
            (400..500).contains(&e.status) && !e.message.is_empty(),
            "{e:?} for {:?}",
            String::from_utf8_lossy(input)
        );
    }
}

#[test]
fn random_bodies_give_a_request_or_a_4xx_never_a_panic() {
    let mut rng = StdRng::seed_from_u64(0x5e27e);
    let valid = [
        json!({"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4,
               "stop": ["x"], "logprobs": true, "top_logprobs": 1, "stream": true}),
        json!({"prompt": "Once", "temperature": 0.7, "top_p": 0.5, "seed": 1, "logprobs": 2}),
        json!({"input": ["a", "b"], "encoding_format": "float"}),
    ];
    let mut parsed = 0;
    for i in 0..20_000 {
        let bytes: Vec<u8> = match i % 4 {
            // A valid body with a few nodes replaced.
            0 | 1 => {
                let mut v = valid[i % valid.len()].clone();
                for _ in 0..rng.gen_range(1..4) {
                    mutate(&mut rng, &mut v);
                }
                v.to_string().into_bytes()
            }
            // A random JSON value.
            2 => random_value(&mut rng, 3).to_string().into_bytes(),
            // A valid body's text with bytes flipped, cut or inserted.
            _ => {
                let mut b = valid[i % valid.len()].to_string().into_bytes();
                for _ in 0..rng.gen_range(1..4) {
                    let at = rng.gen_range(0..b.len());
                    match rng.gen_range(0..3) {
                        0 => b[at] = rng.gen(),
                        1 => b.truncate(at),
                        _ => b.insert(at, rng.gen()),
                    }
                    if b.is_empty() {
                        break;
                    }
                }
                b
            }
        };
        let (c, p, e) = (
            parse_chat(&bytes),
            parse_completion(&bytes),
            parse_embeddings(&bytes),
        );
        parsed += usize::from(c.is_ok()) + usize::from(p.is_ok()) + usize::from(e.is_ok());
        if let Ok(r) = &c {
            assert!(r.messages.as_ref().is_some_and(|m| !m.is_empty()));
            assert!(r.max_tokens != Some(0) && r.stop.len() <= MAX_STOP);
            assert!((0.0..=2.0).contains(&r.temperature) && r.top_p > 0.0 && r.top_p <= 1.0);
        }
        check_outcome(c, &bytes);
        check_outcome(p, &bytes);
        check_outcome(e, &bytes);
    }
    // The mutations keep some bodies valid: the accepting paths are exercised too.
    assert!(parsed > 200, "only {parsed} bodies parsed");
}
