//! The server in process on a loopback port, spoken to over plain HTTP/1.1: a chat answer
//! streamed equals the one not streamed, completions, embeddings, errors (401, 400, 404), and a
//! shutdown that returns. The `openai` package's test (openai_client.py) covers the rest.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::Arc;

use serde_json::{json, Value};
use tessera::cpu::CpuDevice;
use tessera::Device;
use tessera_llm::{fetch, Model};
use tessera_serve::{run, ServeOptions};

/// One request on its own connection: the status and the body.
fn request(port: u16, method: &str, path: &str, body: &str, key: Option<&str>) -> (u16, String) {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    let auth = key.map_or(String::new(), |k| format!("Authorization: Bearer {k}\r\n"));
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n{auth}Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut out = Vec::new();
    s.read_to_end(&mut out).unwrap();
    let text = String::from_utf8_lossy(&out).into_owned();
    let status = text[9..12].parse().unwrap();
    let (head, rest) = text.split_once("\r\n\r\n").unwrap();
    let body = if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        dechunk(rest)
    } else {
        rest.to_string()
    };
    (status, body)
}

/// The body of a chunked response.
fn dechunk(mut s: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = s.split_once("\r\n") {
        let n = usize::from_str_radix(size.trim(), 16).unwrap();
        if n == 0 {
            break;
        }
        out.push_str(&rest[..n]);
        s = &rest[n + 2..];
    }
    out
}

#[test]
fn the_server_answers_streams_and_refuses() {
    let path = fetch::test_model(&mut |_| {}).unwrap();
    let cpu: Arc<dyn Device> = Arc::new(CpuDevice::new());
    let model = Arc::new(Model::load(&path, cpu.clone(), cpu, &mut |_, _| {}).unwrap());
    let rt = tokio::runtime::Runtime::new().unwrap();
    let listener = rt
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .unwrap();
    let port = listener.local_addr().unwrap().port();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let opts = ServeOptions {
        model_id: "test".into(),
        parallel: 2,
        ctx: 256,
        api_key: Some("k".into()),
        ..ServeOptions::default()
    };
    let server = rt.spawn(run(model, opts, listener, async {
        let _ = stop_rx.await;
    }));
    let key = Some("k");

    let (s, b) = request(port, "GET", "/health", "", None);
    assert_eq!((s, b.contains("ok")), (200, true));
    let (s, b) = request(port, "GET", "/v1/models", "", key);
    assert_eq!(s, 200);
    assert_eq!(
        serde_json::from_str::<Value>(&b).unwrap()["data"][0]["id"],
        "test"
    );

    let chat = json!({"model": "test", "messages": [{"role": "user", "content": "Name a color."}],
        "temperature": 0, "max_tokens": 8});
    let (s, b) = request(port, "POST", "/v1/chat/completions", &chat.to_string(), key);
    assert_eq!(s, 200, "{b}");
    let v: Value = serde_json::from_str(&b).unwrap();
    let text = v["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(!text.is_empty());
    assert_eq!(v["usage"]["completion_tokens"], 8);
    let mut streamed = chat.clone();
    streamed["stream"] = json!(true);
    let (s, b) = request(
        port,
        "POST",
        "/v1/chat/completions",
        &streamed.to_string(),
        key,
    );
    assert_eq!(s, 200);
    assert!(b.trim_end().ends_with("data: [DONE]"), "{b}");
    let joined: String = b
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter(|d| *d != "[DONE]")
        .filter_map(|d| {
            let v: Value = serde_json::from_str(d).unwrap();
            v["choices"][0]["delta"]["content"]
                .as_str()
                .map(str::to_string)
        })
        .collect();
    assert_eq!(joined, text);

    let comp = json!({"prompt": "Once upon a time", "temperature": 0, "max_tokens": 4});
    let (s, b) = request(port, "POST", "/v1/completions", &comp.to_string(), key);
    assert_eq!(s, 200, "{b}");
    let (s, b) = request(port, "POST", "/v1/embeddings", r#"{"input": "hello"}"#, key);
    assert_eq!(s, 200, "{b}");
    let v: Value = serde_json::from_str(&b).unwrap();
    assert!(!v["data"][0]["embedding"].as_array().unwrap().is_empty());

    for (path, body, k, status) in [
        ("/v1/models", "", None, 401),
        ("/v1/completions", "{oops", key, 400),
        (
            "/v1/completions",
            r#"{"prompt": "x", "model": "other"}"#,
            key,
            404,
        ),
        ("/v1/nowhere", "", key, 404),
    ] {
        let method = if body.is_empty() { "GET" } else { "POST" };
        let (s, b) = request(port, method, path, body, k);
        assert_eq!(s, status, "{path}: {b}");
        let v: Value = serde_json::from_str(&b).unwrap();
        assert!(v["error"]["message"].is_string(), "{b}");
    }
    let (_, metrics) = request(port, "GET", "/metrics", "", key);
    assert!(
        metrics.contains("tessera_requests_total{route=\"chat\"} 2"),
        "{metrics}"
    );
    // Two chats and a completion produced first tokens.
    assert!(
        metrics.contains("tessera_time_to_first_token_seconds_count 3"),
        "{metrics}"
    );

    stop_tx.send(()).unwrap();
    rt.block_on(server).unwrap().unwrap();
}
