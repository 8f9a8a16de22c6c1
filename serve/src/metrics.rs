//! Counters the server keeps, written as Prometheus text at `/metrics`.

use std::fmt::Write;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::time::Duration;

/// The server's counters and gauges.
#[derive(Default)]
pub struct Metrics {
    /// Requests per route: chat, completions, embeddings, other.
    pub requests: [AtomicU64; 4],
    /// Responses per status class: 2xx, 4xx, 5xx.
    pub responses: [AtomicU64; 3],
    /// Requests refused because the queue was full.
    pub rejected: AtomicU64,
    /// Jobs waiting for a slot.
    pub queued: AtomicI64,
    /// Prompt tokens evaluated.
    pub prompt_tokens: AtomicU64,
    /// Tokens generated.
    pub generated_tokens: AtomicU64,
    /// Prompt tokens not evaluated: shared with a cached sequence.
    pub prefix_tokens: AtomicU64,
    /// Generations ended because their client went away.
    pub disconnects: AtomicU64,
    /// Engine steps run, the tokens they carried, and their time in microseconds.
    pub steps: AtomicU64,
    /// Tokens over all steps.
    pub step_tokens: AtomicU64,
    /// Step time in microseconds, summed.
    pub step_us: AtomicU64,
    /// Generations that produced a first token.
    pub first_tokens: AtomicU64,
    /// Time from queueing a generation to its first token in microseconds, summed.
    pub first_token_us: AtomicU64,
}

/// Route labels, in the order of [`Metrics::requests`].
pub const ROUTES: [&str; 4] = ["chat", "completions", "embeddings", "other"];

impl Metrics {
    /// Records one engine step.
    pub fn step(&self, took: Duration, tokens: usize) {
        self.steps.fetch_add(1, Ordering::Relaxed);
        self.step_tokens.fetch_add(tokens as u64, Ordering::Relaxed);
        self.step_us
            .fetch_add(took.as_micros() as u64, Ordering::Relaxed);
    }

    /// Records a generation's time to first token.
    pub fn first_token(&self, took: Duration) {
        self.first_tokens.fetch_add(1, Ordering::Relaxed);
        self.first_token_us
            .fetch_add(took.as_micros() as u64, Ordering::Relaxed);
    }

    /// Records a response's status.
    pub fn status(&self, status: u16) {
        let class = match status {
            0..=399 => 0,
            400..=499 => 1,
            _ => 2,
        };
        self.responses[class].fetch_add(1, Ordering::Relaxed);
    }

    /// Prometheus text exposition.
    pub fn render(&self) -> String {
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let mut s = String::new();
        let mut counter = |name: &str, help: &str, rows: &[(String, u64)]| {
            let _ = writeln!(
                s,
                "# HELP tessera_{name} {help}\n# TYPE tessera_{name} counter"
            );
            for (labels, v) in rows {
                let _ = writeln!(s, "tessera_{name}{labels} {v}");
            }
        };
        let routes: Vec<(String, u64)> = ROUTES
            .iter()
            .zip(&self.requests)
            .map(|(r, a)| (format!("{{route=\"{r}\"}}"), get(a)))
            .collect();
        counter("requests_total", "Requests received, by route.", &routes);
        let classes: Vec<(String, u64)> = ["2xx", "4xx", "5xx"]
            .iter()
            .zip(&self.responses)
            .map(|(c, a)| (format!("{{class=\"{c}\"}}"), get(a)))
            .collect();
        counter(
            "responses_total",
            "Responses sent, by status class.",
            &classes,
        );
        let one = |a: &AtomicU64| vec![(String::new(), get(a))];
        counter(
            "rejected_total",
            "Requests refused with 503: the queue was full.",
            &one(&self.rejected),
        );
        counter(
            "prompt_tokens_total",
            "Prompt tokens evaluated.",
            &one(&self.prompt_tokens),
        );
        counter(
            "generated_tokens_total",
            "Tokens generated.",
            &one(&self.generated_tokens),
        );
        counter(
            "prefix_tokens_total",
            "Prompt tokens taken from a cached prefix, not evaluated again.",
            &one(&self.prefix_tokens),
        );
        counter(
            "disconnects_total",
            "Generations ended because the client went away.",
            &one(&self.disconnects),
        );
        counter(
            "steps_total",
            "Engine steps (one graph over every running sequence).",
            &one(&self.steps),
        );
        counter(
            "step_tokens_total",
            "Tokens carried by engine steps.",
            &one(&self.step_tokens),
        );
        let secs = get(&self.step_us) as f64 / 1e6;
        let _ = writeln!(
            s,
            "# HELP tessera_step_seconds_total Time spent in engine steps.\n# TYPE tessera_step_seconds_total counter\ntessera_step_seconds_total {secs}"
        );
        let _ = writeln!(
            s,
            "# HELP tessera_time_to_first_token_seconds From queueing a generation to its first token.\n# TYPE tessera_time_to_first_token_seconds summary\ntessera_time_to_first_token_seconds_sum {}\ntessera_time_to_first_token_seconds_count {}",
            get(&self.first_token_us) as f64 / 1e6,
            get(&self.first_tokens)
        );
        let _ = writeln!(
            s,
            "# HELP tessera_queue_depth Requests waiting for a slot.\n# TYPE tessera_queue_depth gauge\ntessera_queue_depth {}",
            self.queued.load(Ordering::Relaxed).max(0)
        );
        s
    }
}
