//! tessera-serve: an OpenAI-compatible HTTP server over one model, decoding many requests
//! together.
//!
//! Routes: `POST /v1/chat/completions` and `/v1/completions` (server-sent events with
//! `"stream": true`), `POST /v1/embeddings`, `GET /v1/models`, `GET /health`, `GET /metrics`
//! (Prometheus text). One engine thread ([`engine`]) runs continuous batching over
//! `parallel` slots; requests beyond them wait in a bounded queue, and past it get 503 with
//! `Retry-After`. Every failure answers OpenAI's error object ([`api::ApiError`]) with its
//! status: 400 for malformed JSON, wrong fields or a prompt past the context; 401 without the
//! API key when one is set (`/health` stays open for probes); 404 for an unknown model or route;
//! 413 for a body over the limit. SIGINT or SIGTERM stops accepting, ends running generations
//! (their streams get a last chunk and `[DONE]`), and returns once the connections close.

pub mod api;
pub mod engine;
pub mod metrics;

use std::convert::Infallible;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, SyncSender, TrySendError};
use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, Path, Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use base64::Engine as _;
use serde_json::{json, Value};
use tessera::{Error, Result};
use tessera_llm::batch::{BatchContext, BatchParams};
use tessera_llm::chat::Message;
use tessera_llm::embed::Pooling;
use tessera_llm::generate::{GenOptions, StopReason, TokenEvent};
use tessera_llm::sampling::SamplerConfig;
use tessera_llm::Model;
use tokio::net::TcpListener;
use tokio::sync::{mpsc, oneshot};

use api::{ApiError, EmbedInput, GenRequest};
use engine::{Engine, Event, Job};
use metrics::Metrics;

/// How the server runs.
#[derive(Clone, Debug)]
pub struct ServeOptions {
    /// The model's id in requests and `/v1/models`.
    pub model_id: String,
    /// Sequences decoded together.
    pub parallel: usize,
    /// Positions one request may hold (prompt and completion; 0: the model's, at most 4096).
    pub ctx: usize,
    /// Requests waiting for a slot before 503.
    pub queue: usize,
    /// Most tokens in one engine step (decodes plus prompt chunks).
    pub n_ubatch: usize,
    /// Largest request body in bytes.
    pub body_limit: usize,
    /// When set, every request but `/health` needs `Authorization: Bearer KEY`.
    pub api_key: Option<String>,
}

impl Default for ServeOptions {
    fn default() -> Self {
        ServeOptions {
            model_id: "model".into(),
            parallel: 4,
            ctx: 0,
            queue: 64,
            n_ubatch: 512,
            body_limit: 4 << 20,
            api_key: None,
        }
    }
}

struct Inner {
    jobs: SyncSender<Job>,
    metrics: Arc<Metrics>,
    model: Arc<Model>,
    opts: ServeOptions,
    n_ctx: usize,
    created: u64,
    next_id: AtomicU64,
}

type App = Arc<Inner>;

/// Serves `model` on `host:port` until SIGINT or SIGTERM.
pub fn serve(model: Arc<Model>, opts: ServeOptions, host: &str, port: u16) -> Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| Error::io("starting the server's runtime", e))?;
    rt.block_on(async {
        let listener = TcpListener::bind((host, port))
            .await
            .map_err(|e| Error::io(format!("listening on {host}:{port}"), e))?;
        if let Ok(addr) = listener.local_addr() {
            eprintln!("tessera serve: listening on http://{addr}");
        }
        run(model, opts, listener, signal()).await
    })
}

/// Resolves on SIGINT or SIGTERM.
async fn signal() {
    let int = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = int => {}
                    _ = term.recv() => {}
                }
            }
            Err(_) => {
                let _ = int.await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = int.await;
    }
}

/// Serves on `listener` until `shutdown` resolves, then ends running generations and returns
/// once every connection is closed.
pub async fn run(
    model: Arc<Model>,
    opts: ServeOptions,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<()> {
    if opts.parallel == 0 || opts.queue == 0 {
        return Err(Error::Invalid(
            "--parallel and the queue must be at least 1".into(),
        ));
    }
    let metrics = Arc::new(Metrics::default());
    let stop = Arc::new(AtomicBool::new(false));
    let (jobs, rx) = sync_channel(opts.queue);
    // The engine's context is made on its own thread (it stays there); its error comes back.
    let (ready_tx, ready_rx) = std::sync::mpsc::channel::<Result<usize>>();
    let engine = {
        let (model, metrics, stop, o) =
            (model.clone(), metrics.clone(), stop.clone(), opts.clone());
        std::thread::Builder::new()
            .name("tessera-engine".into())
            .spawn(move || {
                let params = BatchParams {
                    n_ctx: o.ctx,
                    // One more sequence than slots: embeddings run beside full slots.
                    n_seq: o.parallel + 1,
                    n_ubatch: o.n_ubatch,
                    ..BatchParams::default()
                };
                let made =
                    Pooling::of(&model).and_then(|p| Ok((p, BatchContext::new(model, params)?)));
                match made {
                    Ok((pooling, ctx)) => {
                        let _ = ready_tx.send(Ok(ctx.n_ctx()));
                        Engine::new(ctx, o.parallel, pooling, metrics, stop).run(rx);
                    }
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                    }
                }
            })
            .map_err(|e| Error::io("starting the engine thread", e))?
    };
    let n_ctx = ready_rx
        .recv()
        .map_err(|_| Error::Invalid("the engine thread ended while starting".into()))??;
    let app: App = Arc::new(Inner {
        jobs,
        metrics,
        model,
        opts: opts.clone(),
        n_ctx,
        created: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
        next_id: AtomicU64::new(1),
    });
    let router = router(app);
    let flag = stop.clone();
    let served = axum::serve(listener, router)
        .with_graceful_shutdown(async move {
            shutdown.await;
            flag.store(true, Ordering::Relaxed);
        })
        .await;
    stop.store(true, Ordering::Relaxed);
    // The router (and with it the job sender) is gone: the engine ends once its slots do.
    let _ = tokio::task::spawn_blocking(move || engine.join()).await;
    served.map_err(|e| Error::io("serving", e))
}

fn router(app: App) -> Router {
    let limit = app.opts.body_limit;
    Router::new()
        .route("/v1/chat/completions", post(chat))
        .route("/v1/completions", post(completions))
        .route("/v1/embeddings", post(embeddings))
        .route("/v1/models", get(models))
        .route("/v1/models/{id}", get(model_info))
        .route(
            "/health",
            get(|| async { axum::Json(json!({"status": "ok"})) }),
        )
        .route("/metrics", get(metrics_text))
        .fallback(not_found)
        .layer(DefaultBodyLimit::max(limit))
        .layer(middleware::from_fn_with_state(app.clone(), guard))
        .with_state(app)
}

/// Checks the API key and counts each response's status.
async fn guard(State(app): State<App>, req: Request, next: Next) -> Response {
    if let Some(key) = &app.opts.api_key {
        let given = req
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "));
        if req.uri().path() != "/health"
            && !given.is_some_and(|g| same(g.as_bytes(), key.as_bytes()))
        {
            let e = ApiError::new(
                401,
                "authentication_error",
                "invalid_api_key",
                "a valid API key is needed: Authorization: Bearer KEY",
            );
            app.metrics.status(401);
            return error(e);
        }
    }
    let resp = next.run(req).await;
    app.metrics.status(resp.status().as_u16());
    resp
}

/// Compares secrets in time that does not depend on where they differ.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

fn error(e: ApiError) -> Response {
    let status = StatusCode::from_u16(e.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut resp = (status, axum::Json(e.body())).into_response();
    if e.status == 503 {
        resp.headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    }
    resp
}

async fn not_found(req: Request) -> Response {
    error(ApiError::new(
        404,
        "invalid_request_error",
        "not_found",
        format!("no route {} {}", req.method(), req.uri().path()),
    ))
}

async fn metrics_text(State(app): State<App>) -> Response {
    app.metrics.requests[3].fetch_add(1, Ordering::Relaxed);
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        app.metrics.render(),
    )
        .into_response()
}

fn model_object(app: &App) -> Value {
    json!({"id": app.opts.model_id, "object": "model", "created": app.created, "owned_by": "tessera"})
}

async fn models(State(app): State<App>) -> Response {
    axum::Json(json!({"object": "list", "data": [model_object(&app)]})).into_response()
}

async fn model_info(State(app): State<App>, Path(id): Path<String>) -> Response {
    match app.check_model(Some(&id)) {
        Ok(()) => axum::Json(model_object(&app)).into_response(),
        Err(e) => error(e),
    }
}

/// The body, or 413 past the limit (400 when it cannot be read).
fn body(b: std::result::Result<Bytes, BytesRejection>) -> std::result::Result<Bytes, ApiError> {
    b.map_err(|r| {
        if r.status() == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::new(
                413,
                "invalid_request_error",
                "request_too_large",
                "the request body is over the limit",
            )
        } else {
            ApiError::invalid(None, format!("the body cannot be read: {}", r.body_text()))
        }
    })
}

async fn chat(State(app): State<App>, b: std::result::Result<Bytes, BytesRejection>) -> Response {
    app.metrics.requests[0].fetch_add(1, Ordering::Relaxed);
    match body(b).and_then(|b| api::parse_chat(&b)) {
        Ok(req) => app.generate(req, true).await,
        Err(e) => error(e),
    }
}

async fn completions(
    State(app): State<App>,
    b: std::result::Result<Bytes, BytesRejection>,
) -> Response {
    app.metrics.requests[1].fetch_add(1, Ordering::Relaxed);
    match body(b).and_then(|b| api::parse_completion(&b)) {
        Ok(req) => app.generate(req, false).await,
        Err(e) => error(e),
    }
}

async fn embeddings(
    State(app): State<App>,
    b: std::result::Result<Bytes, BytesRejection>,
) -> Response {
    app.metrics.requests[2].fetch_add(1, Ordering::Relaxed);
    let req = match body(b).and_then(|b| api::parse_embeddings(&b)) {
        Ok(r) => r,
        Err(e) => return error(e),
    };
    match app.embed(req).await {
        Ok(r) => r,
        Err(e) => error(e),
    }
}

fn too_long(n: usize, n_ctx: usize, param: &str) -> ApiError {
    ApiError {
        status: 400,
        kind: "invalid_request_error",
        code: Some("context_length_exceeded"),
        param: Some(param.into()),
        message: format!("the input's {n} tokens do not fit the context of {n_ctx} (with room for one generated token)"),
    }
}

fn internal(e: impl std::fmt::Display) -> ApiError {
    ApiError::new(500, "server_error", "internal_error", e.to_string())
}

/// OpenAI's finish_reason.
fn finish(r: StopReason) -> &'static str {
    match r {
        StopReason::MaxTokens | StopReason::ContextFull => "length",
        StopReason::EndOfGeneration | StopReason::StopString | StopReason::Stopped => "stop",
    }
}

/// A logprob as JSON (OpenAI gives finite numbers; an impossible token gets -9999).
fn lp(x: f32) -> f64 {
    f64::from(x).max(-9999.0)
}

impl Inner {
    fn check_model(&self, model: Option<&str>) -> std::result::Result<(), ApiError> {
        match model {
            Some(m) if m != self.opts.model_id => Err(ApiError::new(
                404,
                "invalid_request_error",
                "model_not_found",
                format!(
                    "the model {m:?} does not exist; this server has {:?}",
                    self.opts.model_id
                ),
            )),
            _ => Ok(()),
        }
    }

    fn id(&self, prefix: &str) -> String {
        format!(
            "{prefix}-{:x}",
            self.next_id.fetch_add(1, Ordering::Relaxed)
        )
    }

    /// Queues a job; 503 when the queue is full.
    fn submit(&self, job: Job) -> std::result::Result<(), ApiError> {
        self.metrics.queued.fetch_add(1, Ordering::Relaxed);
        match self.jobs.try_send(job) {
            Ok(()) => Ok(()),
            Err(e) => {
                self.metrics.queued.fetch_sub(1, Ordering::Relaxed);
                self.metrics.rejected.fetch_add(1, Ordering::Relaxed);
                let why = match e {
                    TrySendError::Full(_) => {
                        "the server is busy: every slot and the queue are full"
                    }
                    TrySendError::Disconnected(_) => "the server is shutting down",
                };
                Err(ApiError::new(503, "server_error", "server_busy", why))
            }
        }
    }

    fn piece(&self, id: u32) -> String {
        String::from_utf8_lossy(self.model.tokenizer.token_to_piece(id).unwrap_or_default())
            .into_owned()
    }

    async fn generate(self: &Arc<Self>, req: GenRequest, is_chat: bool) -> Response {
        match self.start(&req).await {
            Err(e) => error(e),
            Ok(rx) if req.stream => self.stream(req, is_chat, rx),
            Ok(rx) => match self.collect(&req, is_chat, rx).await {
                Ok(v) => axum::Json(v).into_response(),
                Err(e) => error(e),
            },
        }
    }

    /// Tokenizes the request and queues it.
    async fn start(
        &self,
        req: &GenRequest,
    ) -> std::result::Result<mpsc::UnboundedReceiver<Event>, ApiError> {
        self.check_model(req.model.as_deref())?;
        let tok = &self.model.tokenizer;
        let tokens = match &req.messages {
            Some(msgs) => {
                let msgs: Vec<Message> = msgs.iter().map(|(r, c)| Message::new(r, c)).collect();
                let text = self
                    .model
                    .template
                    .render(&msgs, true)
                    .map_err(|e| ApiError::invalid(Some("messages"), e.to_string()))?;
                tok.encode(&text, true, true)
            }
            None => tok.encode(&req.prompt, true, false),
        }
        .map_err(|e| ApiError::invalid(None, e.to_string()))?;
        if tokens.is_empty() {
            return Err(ApiError::invalid(
                Some("prompt"),
                "the prompt has no tokens",
            ));
        }
        if tokens.len() >= self.n_ctx {
            let param = if req.messages.is_some() {
                "messages"
            } else {
                "prompt"
            };
            return Err(too_long(tokens.len(), self.n_ctx, param));
        }
        let opts = GenOptions {
            // Past the context's end the generation stops with finish_reason "length".
            max_tokens: req.max_tokens.unwrap_or(usize::MAX),
            sampler: SamplerConfig {
                temperature: req.temperature,
                top_k: 0,
                top_p: req.top_p,
                min_p: 0.0,
                repeat_penalty: 1.0,
                repeat_last_n: 0,
                seed: req.seed.unwrap_or_else(rand::random),
            },
            stop: req.stop.clone(),
            stop_at_eog: true,
            logprobs: req.logprobs,
            cancel: None,
        };
        let (tx, rx) = mpsc::unbounded_channel();
        self.submit(Job::Generate {
            prompt: tokens,
            opts,
            events: tx,
            queued: std::time::Instant::now(),
        })?;
        Ok(rx)
    }

    /// Logprobs of one token as chat's `content` entry.
    fn chat_logprob(&self, ev: &TokenEvent) -> Option<Value> {
        let l = ev.logprob.as_ref()?;
        let entry = |id: u32, x: f32| {
            let t = self.piece(id);
            json!({"token": t, "logprob": lp(x), "bytes": t.as_bytes()})
        };
        let mut e = entry(ev.id, l.logprob);
        e["top_logprobs"] = l.top.iter().map(|&(id, x)| entry(id, x)).collect();
        Some(e)
    }

    /// Logprobs of tokens in the completions format; `offset` is the text's length before them.
    fn completion_logprobs(&self, evs: &[&TokenEvent], mut offset: usize) -> Value {
        let (mut tokens, mut lps, mut tops, mut offs) = (vec![], vec![], vec![], vec![]);
        for ev in evs {
            let Some(l) = &ev.logprob else { continue };
            let t = self.piece(ev.id);
            offs.push(offset);
            offset += ev.text.len();
            tokens.push(t);
            lps.push(lp(l.logprob));
            let top: serde_json::Map<String, Value> = l
                .top
                .iter()
                .map(|&(id, x)| (self.piece(id), json!(lp(x))))
                .collect();
            tops.push(Value::Object(top));
        }
        json!({"tokens": tokens, "token_logprobs": lps, "top_logprobs": tops, "text_offset": offs})
    }

    async fn collect(
        &self,
        req: &GenRequest,
        is_chat: bool,
        mut rx: mpsc::UnboundedReceiver<Event>,
    ) -> std::result::Result<Value, ApiError> {
        let mut text = String::new();
        let mut events: Vec<TokenEvent> = Vec::new();
        let (reason, prompt_tokens, completion_tokens) = loop {
            match rx.recv().await {
                Some(Event::Token(ev)) => {
                    text.push_str(&ev.text);
                    events.push(ev);
                }
                Some(Event::Done {
                    reason,
                    text: rest,
                    prompt_tokens,
                    completion_tokens,
                }) => {
                    text.push_str(&rest);
                    break (reason, prompt_tokens, completion_tokens);
                }
                Some(Event::Error(e)) => return Err(internal(e)),
                None => return Err(internal("the engine stopped")),
            }
        };
        let usage = json!({"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens});
        let want_lp = req.logprobs.is_some();
        Ok(if is_chat {
            let logprobs = want_lp.then(|| {
                json!({"content": events.iter().filter_map(|e| self.chat_logprob(e)).collect::<Vec<_>>()})
            });
            json!({"id": self.id("chatcmpl"), "object": "chat.completion", "created": self.created,
                "model": self.opts.model_id,
                "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                    "logprobs": logprobs, "finish_reason": finish(reason)}],
                "usage": usage})
        } else {
            let refs: Vec<&TokenEvent> = events.iter().collect();
            let logprobs = want_lp.then(|| self.completion_logprobs(&refs, 0));
            json!({"id": self.id("cmpl"), "object": "text_completion", "created": self.created,
                "model": self.opts.model_id,
                "choices": [{"index": 0, "text": text, "logprobs": logprobs, "finish_reason": finish(reason)}],
                "usage": usage})
        })
    }

    /// The generation as server-sent events.
    fn stream(
        self: &Arc<Self>,
        req: GenRequest,
        is_chat: bool,
        rx: mpsc::UnboundedReceiver<Event>,
    ) -> Response {
        let id = self.id(if is_chat { "chatcmpl" } else { "cmpl" });
        let app = self.clone();
        struct St {
            app: App,
            rx: mpsc::UnboundedReceiver<Event>,
            req: GenRequest,
            is_chat: bool,
            id: String,
            started: bool,
            done: bool,
            offset: usize,
        }
        let st = St {
            app,
            rx,
            req,
            is_chat,
            id,
            started: false,
            done: false,
            offset: 0,
        };
        let chunk = |st: &St,
                     delta_text: Option<&str>,
                     lps: Option<Value>,
                     reason: Option<&str>|
         -> Value {
            let a = &st.app;
            if st.is_chat {
                let delta = match delta_text {
                    Some(t) => json!({"content": t}),
                    None => json!({}),
                };
                json!({"id": st.id, "object": "chat.completion.chunk", "created": a.created,
                    "model": a.opts.model_id,
                    "choices": [{"index": 0, "delta": delta, "logprobs": lps, "finish_reason": reason}]})
            } else {
                json!({"id": st.id, "object": "text_completion", "created": a.created,
                    "model": a.opts.model_id,
                    "choices": [{"index": 0, "text": delta_text.unwrap_or(""), "logprobs": lps, "finish_reason": reason}]})
            }
        };
        let sse = |v: &Value| format!("data: {v}\n\n");
        let events = futures_util::stream::unfold(st, move |mut st| async move {
            if st.done {
                return None;
            }
            if !st.started && st.is_chat {
                st.started = true;
                let a = &st.app;
                let v = json!({"id": st.id, "object": "chat.completion.chunk", "created": a.created,
                    "model": a.opts.model_id,
                    "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                        "logprobs": null, "finish_reason": null}]});
                return Some((Ok::<_, Infallible>(Bytes::from(sse(&v))), st));
            }
            let out = match st.rx.recv().await {
                Some(Event::Token(ev)) => {
                    let lps = if st.req.logprobs.is_none() {
                        None
                    } else if st.is_chat {
                        st.app.chat_logprob(&ev).map(|e| json!({"content": [e]}))
                    } else {
                        Some(st.app.completion_logprobs(&[&ev], st.offset))
                    };
                    st.offset += ev.text.len();
                    if ev.text.is_empty() && lps.is_none() {
                        String::new()
                    } else {
                        sse(&chunk(&st, Some(&ev.text), lps, None))
                    }
                }
                Some(Event::Done {
                    reason,
                    text,
                    prompt_tokens,
                    completion_tokens,
                }) => {
                    st.done = true;
                    let mut s = String::new();
                    if !text.is_empty() {
                        s += &sse(&chunk(&st, Some(&text), None, None));
                    }
                    s += &sse(&chunk(&st, None, None, Some(finish(reason))));
                    if st.req.include_usage {
                        let a = &st.app;
                        let v = json!({"id": st.id, "object": if st.is_chat { "chat.completion.chunk" } else { "text_completion" },
                            "created": a.created, "model": a.opts.model_id, "choices": [],
                            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                                "total_tokens": prompt_tokens + completion_tokens}});
                        s += &sse(&v);
                    }
                    s + "data: [DONE]\n\n"
                }
                Some(Event::Error(e)) => {
                    st.done = true;
                    sse(&internal(e).body()) + "data: [DONE]\n\n"
                }
                None => {
                    st.done = true;
                    sse(&internal("the engine stopped").body()) + "data: [DONE]\n\n"
                }
            };
            Some((Ok(Bytes::from(out)), st))
        });
        Response::builder()
            .header(header::CONTENT_TYPE, "text/event-stream")
            .header(header::CACHE_CONTROL, "no-cache")
            .body(Body::from_stream(events))
            .unwrap_or_else(|e| error(internal(e)))
    }

    async fn embed(
        self: &Arc<Self>,
        req: api::EmbedRequest,
    ) -> std::result::Result<Response, ApiError> {
        self.check_model(req.model.as_deref())?;
        let tok = &self.model.tokenizer;
        let n_vocab = self.model.config.n_vocab;
        let mut inputs = Vec::with_capacity(req.inputs.len());
        for i in &req.inputs {
            let t = match i {
                EmbedInput::Text(s) => tok
                    .encode(s, true, false)
                    .map_err(|e| ApiError::invalid(Some("input"), e.to_string()))?,
                EmbedInput::Tokens(t) => t.clone(),
            };
            if let Some(bad) = t.iter().find(|&&x| x as usize >= n_vocab) {
                return Err(ApiError::invalid(
                    Some("input"),
                    format!("token {bad} is past the vocabulary of {n_vocab}"),
                ));
            }
            if t.is_empty() {
                return Err(ApiError::invalid(Some("input"), "an input has no tokens"));
            }
            if t.len() > self.n_ctx {
                return Err(too_long(t.len(), self.n_ctx, "input"));
            }
            inputs.push(t);
        }
        let n_tokens: usize = inputs.iter().map(Vec::len).sum();
        let (tx, rx) = oneshot::channel();
        self.submit(Job::Embed { inputs, reply: tx })?;
        let vecs = rx
            .await
            .map_err(|_| internal("the engine stopped"))?
            .map_err(internal)?;
        let data: Vec<Value> = vecs
            .iter()
            .enumerate()
            .map(|(i, v)| {
                let e = if req.base64 {
                    let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
                    json!(base64::engine::general_purpose::STANDARD.encode(bytes))
                } else {
                    json!(v)
                };
                json!({"object": "embedding", "index": i, "embedding": e})
            })
            .collect();
        Ok(axum::Json(
            json!({"object": "list", "data": data, "model": self.opts.model_id,
            "usage": {"prompt_tokens": n_tokens, "total_tokens": n_tokens}}),
        )
        .into_response())
    }
}
