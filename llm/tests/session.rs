//! The library API apps hold: sessions sharing one model, generation as an iterator, stop
//! strings, cancellation from another thread, a session saved and restored, log-probabilities,
//! and embeddings.

mod common;

use std::sync::mpsc;

use tessera_llm::batch::{BatchContext, BatchParams};
use tessera_llm::embed::{embed_tokens, Embedder, Pooling};
use tessera_llm::generate::{Cancel, GenOptions, StopMatcher, StopReason};
use tessera_llm::sampling::SamplerConfig;
use tessera_llm::session::Session;
use tessera_llm::{Context, ContextParams};

use common::*;

fn params() -> BatchParams {
    BatchParams {
        n_ctx: 128,
        ..BatchParams::default()
    }
}

fn greedy(max_tokens: usize) -> GenOptions {
    GenOptions {
        max_tokens,
        sampler: SamplerConfig::greedy(),
        stop_at_eog: false,
        ..GenOptions::default()
    }
}

/// Greedy tokens of the one-sequence context, for comparison.
fn context_greedy(prompt: &[u32], n: usize) -> Vec<u32> {
    let mut ctx = Context::new(cpu_model(), ContextParams::default()).unwrap();
    let mut logits = ctx.eval(prompt, false).unwrap();
    let mut out = Vec::new();
    for _ in 0..n {
        let t = argmax(&logits) as u32;
        out.push(t);
        logits = ctx.eval(&[t], false).unwrap();
    }
    out
}

fn prompt() -> Vec<u32> {
    ids(&reference("smollm2-greedy.json")["prompts"][1]["prompt_ids"])
}

#[test]
fn sessions_share_a_model_and_iterate_tokens() {
    let model = cpu_model();
    let p = prompt();
    let want = context_greedy(&p, 8);
    let mut a = Session::new(model.clone(), params()).unwrap();
    let mut b = Session::new(model.clone(), params()).unwrap();
    a.set_tokens(&p).unwrap();
    b.set_tokens(&p[..3]).unwrap();
    // Interleaved: a's generation is not disturbed by b's.
    let mut gen_a = a.generate(greedy(8)).unwrap();
    let first: Vec<u32> = gen_a
        .by_ref()
        .take(4)
        .map(|t| t.unwrap().token.unwrap())
        .collect();
    let got_b: Vec<u32> = b
        .generate(greedy(3))
        .unwrap()
        .filter_map(|t| t.unwrap().token)
        .collect();
    assert_eq!(got_b, context_greedy(&p[..3], 3));
    let rest: Vec<u32> = gen_a.by_ref().filter_map(|t| t.unwrap().token).collect();
    assert_eq!(gen_a.stop_reason(), Some(StopReason::MaxTokens));
    let got: Vec<u32> = first.into_iter().chain(rest).collect();
    assert_eq!(got, want);
    // The last token was shown, not evaluated: the session holds the prompt and 7 tokens.
    assert_eq!(a.tokens().len(), p.len() + 7);
    // Holding a longer prompt that starts with what is held evaluates only the new tokens.
    let mut longer = a.tokens().to_vec();
    longer.push(want[7]);
    a.set_tokens(&longer).unwrap();
    let next: Vec<u32> = a
        .generate(greedy(2))
        .unwrap()
        .filter_map(|t| t.unwrap().token)
        .collect();
    assert_eq!(next, context_greedy(&longer, 2));
}

#[test]
fn stop_strings_end_the_text_before_them() {
    let stops = vec!["world".to_string(), "\n\n".to_string()];
    let mut m = StopMatcher::new(&stops);
    let mut shown = String::new();
    let mut hit = false;
    for piece in ["Hello", " wor", "ld", " and more"] {
        let (text, stop) = m.push(piece);
        shown.push_str(&text);
        if stop {
            hit = true;
            break;
        }
    }
    assert!(hit);
    assert_eq!(shown, "Hello ");
    // Text that only looked like a stop string's start is released in the end.
    let mut m = StopMatcher::new(&stops);
    let (a, s1) = m.push("say wo");
    let (b, s2) = m.push("w\n");
    assert!(!s1 && !s2);
    assert_eq!(format!("{a}{b}{}", m.finish()), "say wow\n");

    // In a generation: greedy text up to the first occurrence of a piece of its own text.
    let model = cpu_model();
    let mut s = Session::new(model.clone(), params()).unwrap();
    s.set_tokens(&prompt()).unwrap();
    let full: String = s
        .generate(greedy(12))
        .unwrap()
        .map(|t| t.unwrap().text)
        .collect();
    let words: Vec<&str> = full.split_whitespace().collect();
    assert!(words.len() >= 3, "too little text: {full:?}");
    let stop = words[2].to_string();
    let at = full.find(&stop).unwrap();
    let mut s = Session::new(model, params()).unwrap();
    s.set_tokens(&prompt()).unwrap();
    let mut gen = s
        .generate(GenOptions {
            stop: vec![stop.clone()],
            ..greedy(12)
        })
        .unwrap();
    let text: String = gen.by_ref().map(|t| t.unwrap().text).collect();
    assert_eq!(text, full[..at], "stop string {stop:?}");
    assert_eq!(gen.stop_reason(), Some(StopReason::StopString));
}

#[test]
fn another_thread_cancels_a_generation() {
    let mut s = Session::new(cpu_model(), params()).unwrap();
    s.set_tokens(&prompt()).unwrap();
    let cancel = Cancel::new();
    let (tx, rx) = mpsc::channel::<()>();
    let (done_tx, done_rx) = mpsc::channel::<()>();
    let c = cancel.clone();
    let t = std::thread::spawn(move || {
        rx.recv().unwrap();
        c.cancel();
        done_tx.send(()).unwrap();
    });
    let mut gen = s
        .generate(GenOptions {
            cancel: Some(cancel),
            ..greedy(100)
        })
        .unwrap();
    let mut n = 0;
    for piece in gen.by_ref() {
        piece.unwrap();
        n += 1;
        if n == 3 {
            tx.send(()).unwrap();
            done_rx.recv().unwrap();
        }
    }
    t.join().unwrap();
    assert_eq!(n, 3, "no token after the cancel");
    assert_eq!(gen.stop_reason(), Some(StopReason::Stopped));
}

#[test]
fn a_saved_session_goes_on_as_the_original() {
    let model = cpu_model();
    let mut s = Session::new(model.clone(), params()).unwrap();
    s.set_tokens(&prompt()).unwrap();
    let _: Vec<_> = s.generate(greedy(4)).unwrap().collect();
    let path = std::env::temp_dir().join(format!("tessera-session-{}.bin", std::process::id()));
    s.save_file(&path).unwrap();
    let mut r = Session::restore_file(model.clone(), params(), &path).unwrap();
    std::fs::remove_file(&path).unwrap();
    assert_eq!(r.tokens(), s.tokens());
    let a: Vec<u32> = s
        .generate(greedy(5))
        .unwrap()
        .filter_map(|t| t.unwrap().token)
        .collect();
    let b: Vec<u32> = r
        .generate(greedy(5))
        .unwrap()
        .filter_map(|t| t.unwrap().token)
        .collect();
    assert_eq!(a, b);
    let bytes = s.save().unwrap();
    assert!(Session::restore(model.clone(), params(), &bytes[..bytes.len() / 2]).is_err());
    assert!(Session::restore(model, params(), b"not a session at all").is_err());
}

#[test]
fn logprobs_are_the_models_distribution() {
    let mut s = Session::new(cpu_model(), params()).unwrap();
    s.set_tokens(&prompt()).unwrap();
    let pieces: Vec<_> = s
        .generate(GenOptions {
            logprobs: Some(3),
            ..greedy(4)
        })
        .unwrap()
        .map(|t| t.unwrap())
        .collect();
    for p in pieces.iter().filter(|p| p.token.is_some()) {
        let lp = p.logprob.as_ref().unwrap();
        assert_eq!(lp.top.len(), 3);
        // Greedy: the chosen token is the most likely one.
        assert_eq!(lp.top[0].0, p.token.unwrap());
        assert!((lp.top[0].1 - lp.logprob).abs() < 1e-6);
        assert!(lp.logprob <= 0.0 && lp.top[1].1 <= lp.top[0].1 && lp.top[2].1 <= lp.top[1].1);
    }
}

#[test]
fn embeddings_pool_the_hidden_states() {
    let model = cpu_model();
    // The test model's file names no pooling: the last token's state.
    assert_eq!(Pooling::of(&model).unwrap(), Pooling::Last);
    let mut e = Embedder::new(model.clone(), 128).unwrap();
    let a = e.embed("The cat sat on the mat.").unwrap();
    let b = e.embed("A kitten rested on the rug.").unwrap();
    let c = e.embed("Quarterly revenue grew by four percent.").unwrap();
    let a2 = e.embed("The cat sat on the mat.").unwrap();
    assert_eq!(a.len(), model.config.n_embd);
    let dot = |x: &[f32], y: &[f32]| x.iter().zip(y).map(|(p, q)| p * q).sum::<f32>();
    assert!((dot(&a, &a) - 1.0).abs() < 1e-4, "unit length");
    assert!(dot(&a, &a2) > 0.9999, "the same text gives the same vector");
    assert!(dot(&a, &b) < 0.9999 && dot(&a, &c) < 0.9999, "texts differ");
    // Mean pooling averages the token states: the mean of the states of a text's prefixes'
    // last tokens is its mean (the model is causal).
    let toks = model
        .tokenizer
        .encode("one two three", true, false)
        .unwrap();
    let mut ctx = BatchContext::new(model.clone(), params()).unwrap();
    let mean = embed_tokens(&mut ctx, &toks, Pooling::Mean, false).unwrap();
    let mut sum = vec![0f32; mean.len()];
    for i in 1..=toks.len() {
        let last = embed_tokens(&mut ctx, &toks[..i], Pooling::Last, false).unwrap();
        for (s, x) in sum.iter_mut().zip(last) {
            *s += x / toks.len() as f32;
        }
    }
    let err = mean
        .iter()
        .zip(&sum)
        .map(|(x, y)| (x - y).abs())
        .fold(0f32, f32::max);
    let scale = mean.iter().map(|x| x.abs()).fold(0f32, f32::max);
    assert!(
        err < 0.02 * scale,
        "mean pooling off by {err} (scale {scale})"
    );
    assert_eq!(ctx.cells().used_end(), 0, "embedding sequences are removed");
    assert!(embed_tokens(&mut ctx, &[], Pooling::Last, true).is_err());
}

/// Polls `fut` to completion on this thread, parking between wake-ups.
#[cfg(feature = "async")]
fn block_on<F: std::future::Future>(fut: F) -> F::Output {
    use std::sync::Arc;
    use std::task::{Context, Poll, Wake, Waker};
    struct Unpark(std::thread::Thread);
    impl Wake for Unpark {
        fn wake(self: Arc<Self>) {
            self.0.unpark();
        }
    }
    let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
    let mut cx = Context::from_waker(&waker);
    let mut fut = std::pin::pin!(fut);
    loop {
        if let Poll::Ready(v) = fut.as_mut().poll(&mut cx) {
            return v;
        }
        std::thread::park();
    }
}

#[cfg(feature = "async")]
#[test]
fn a_generation_streams_asynchronously() {
    use std::future::poll_fn;
    use std::pin::Pin;

    use futures_core::Stream;

    let model = cpu_model();
    let text = "Once upon a time";
    // The same greedy tokens as the iterator's.
    let mut s = Session::new(model.clone(), params()).unwrap();
    let want: Vec<u32> = s
        .complete(text, greedy(6))
        .unwrap()
        .filter_map(|p| p.unwrap().token)
        .collect();
    let s = Session::new(model, params()).unwrap();
    let mut stream = s.into_stream(text.to_string(), greedy(6)).unwrap();
    let got: Vec<u32> = block_on(async {
        let mut got = Vec::new();
        while let Some(p) = poll_fn(|cx| Pin::new(&mut stream).poll_next(cx)).await {
            got.extend(p.unwrap().token);
        }
        got
    });
    assert_eq!(got, want);
    let s = stream.into_session().unwrap();
    // The session holds the prompt and the tokens evaluated (the last was shown, not evaluated).
    let n_prompt = s.model().tokenizer.encode(text, true, true).unwrap().len();
    assert_eq!(s.tokens().len(), n_prompt + 5);
    assert_eq!(&s.tokens()[n_prompt..], &want[..5]);
}
