//! Many sequences in one graph per step (`BatchContext`): each sequence's greedy tokens equal
//! the tokens it gets decoded alone (the one-sequence `Context`), up to the first near-tie (a
//! step whose top-2 logits are within 0.5), on the CPU, on a meta device of two CPU parts, and
//! on every other device present. A sequence joins late with its prompt cut into chunks beside
//! the running decodes, and every other sequence leaves (is removed) two steps early, as a
//! server's continuous batching does; the cache is handed out in pages smaller than the
//! prompts, so each sequence holds several pages among the others'. Then the cache operations: a
//! shared prefix, truncation, and a sequence saved and restored give the logits of the same
//! tokens evaluated plainly.

mod common;

use std::sync::Arc;

use tessera::cpu::CpuDevice;
use tessera::meta::{MetaDevice, MetaOptions, SplitMode, SplitRatios};
use tessera::Device;
use tessera_llm::batch::{BatchContext, BatchParams, Output, SeqTokens};
use tessera_llm::synth::{self, Like, SynthType};
use tessera_llm::{Context, ContextParams, LoadParams, Model};

use common::*;

/// Tokens generated per sequence (software GPU adapters are slow: fewer tokens and sequences
/// there).
const STEPS: usize = 10;
const STEPS_OTHER: usize = 4;

/// The step at which a late sequence joins, and its prompt chunk size.
const JOIN_AT: usize = 3;
const CHUNK: usize = 4;

/// Greedy tokens of `prompt` decoded alone, and the first step whose top-2 gap is below 0.5.
fn alone(model: &Arc<Model>, prompt: &[u32], steps: usize) -> (Vec<u32>, usize) {
    let params = ContextParams {
        n_ctx: 256,
        ..ContextParams::default()
    };
    let mut ctx = Context::new(model.clone(), params).unwrap();
    let mut logits = ctx.eval(prompt, false).unwrap();
    let (mut toks, mut tie) = (Vec::new(), None);
    for step in 0..steps {
        if tie.is_none() && top2_gap(&logits) < 0.5 {
            tie = Some(step);
        }
        let t = argmax(&logits) as u32;
        toks.push(t);
        logits = ctx.eval(&[t], false).unwrap();
    }
    (toks, tie.unwrap_or(steps))
}

/// Prompts of different lengths: three start together, the last joins at step JOIN_AT.
fn prompts() -> Vec<Vec<u32>> {
    let r = reference("smollm2-greedy.json");
    r["prompts"].as_array().unwrap()[..5]
        .iter()
        .filter(|p| p["name"] != "raw_list")
        .map(|p| ids(&p["prompt_ids"]))
        .collect()
}

/// Cells per page of the batched tests' caches: fewer than a prompt's tokens.
const PAGE: usize = 8;

/// Tokens sequence `i` generates before it leaves, of `steps`.
fn target(i: usize, steps: usize) -> usize {
    steps - 2 * (i % 2)
}

/// Greedy tokens of every prompt decoded together in one graph per step (sequence i generates
/// `target(i, steps)` tokens, then is removed).
fn batched(model: &Arc<Model>, prompts: &[Vec<u32>], steps: usize) -> Vec<Vec<u32>> {
    let params = BatchParams {
        n_ctx: 256,
        n_seq: prompts.len(),
        n_ubatch: 64,
        page_cells: PAGE,
        ..BatchParams::default()
    };
    let mut bc = BatchContext::new(model.clone(), params).unwrap();
    let late = prompts.len() - 1;
    let seqs: Vec<u32> = prompts.iter().map(|_| bc.add_seq()).collect();
    let mut out: Vec<Vec<u32>> = vec![Vec::new(); prompts.len()];
    // What each sequence brings next: its prompt (the late one's in chunks), then its token.
    let mut fed = vec![0usize; prompts.len()];
    let mut step = 0;
    let mut left = vec![false; prompts.len()];
    while (0..prompts.len()).any(|i| out[i].len() < target(i, steps)) {
        let mut pending: Vec<(usize, Vec<u32>, Output)> = Vec::new();
        for i in 0..prompts.len() {
            if out[i].len() >= target(i, steps) {
                if !left[i] {
                    bc.remove_seq(seqs[i]).unwrap();
                    left[i] = true;
                }
                continue;
            }
            if i == late && step < JOIN_AT {
                continue;
            }
            if fed[i] < prompts[i].len() {
                let take = if i == late { CHUNK } else { prompts[i].len() };
                let end = (fed[i] + take).min(prompts[i].len());
                let last = end == prompts[i].len();
                let out_kind = if last { Output::Last } else { Output::None };
                pending.push((i, prompts[i][fed[i]..end].to_vec(), out_kind));
                fed[i] = end;
            } else {
                pending.push((i, vec![*out[i].last().unwrap()], Output::Last));
            }
        }
        let batch: Vec<SeqTokens> = pending
            .iter()
            .map(|(i, t, o)| SeqTokens {
                seq: seqs[*i],
                tokens: t,
                output: *o,
            })
            .collect();
        let logits = bc.decode(&batch).unwrap();
        for ((i, _, o), l) in pending.iter().zip(logits) {
            if *o == Output::Last {
                assert!(l.iter().all(|x| x.is_finite()), "non-finite logits");
                out[*i].push(argmax(&l) as u32);
            } else {
                assert!(l.is_empty(), "a chunk without output gave logits");
            }
        }
        step += 1;
    }
    out
}

fn check(name: &str, model: &Arc<Model>, steps: usize, n_prompts: usize) {
    // The first prompts and the late joiner.
    let mut prompts = prompts();
    prompts.drain(n_prompts - 1..prompts.len() - 1);
    check_prompts(name, model, steps, &prompts);
}

fn check_prompts(name: &str, model: &Arc<Model>, steps: usize, prompts: &[Vec<u32>]) {
    let got = batched(model, prompts, steps);
    for (i, p) in prompts.iter().enumerate() {
        let steps = target(i, steps);
        assert_eq!(got[i].len(), steps);
        let (want, tie) = alone(model, p, steps);
        let matched = got[i].iter().zip(&want).take_while(|(a, b)| a == b).count();
        println!("{name}: sequence {i}: matched {matched}/{steps}; first near-tie at {tie}");
        assert!(
            matched >= tie,
            "{name}: sequence {i} diverged at {matched} before its near-tie at {tie}: {:?} vs {want:?}",
            got[i]
        );
    }
}

#[test]
fn batched_greedy_equals_alone_on_the_cpu() {
    check("cpu", &cpu_model(), STEPS, 4);
}

#[test]
fn batched_greedy_equals_alone_on_a_meta_device() {
    let parts: Vec<Arc<dyn Device>> = (0..2)
        .map(|_| Arc::new(CpuDevice::new()) as Arc<dyn Device>)
        .collect();
    let meta: Arc<dyn Device> =
        Arc::new(MetaDevice::new(parts, &SplitRatios::Given(vec![0.5, 0.5])).unwrap());
    let model = Arc::new(
        Model::load(
            model_path(),
            meta,
            Arc::new(CpuDevice::new()),
            &mut |_, _| {},
        )
        .unwrap(),
    );
    check("meta:cpu,cpu", &model, STEPS, 4);
}

#[test]
fn batched_greedy_equals_alone_on_every_other_device() {
    for dev in non_cpu_devices() {
        let name = dev.name();
        let cpu: Arc<dyn Device> = Arc::new(CpuDevice::new());
        let model = Arc::new(Model::load(model_path(), dev, cpu, &mut |_, _| {}).unwrap());
        check(&name, &model, STEPS_OTHER, 2);
    }
}

/// The test model split by layers over `parts` with `ratios` (each part's KV cells for its
/// own layers).
fn layered_model(parts: Vec<Arc<dyn Device>>, ratios: &[f64]) -> Arc<Model> {
    let options = MetaOptions::default().with_split_mode(SplitMode::Layer);
    let meta: Arc<dyn Device> = Arc::new(
        MetaDevice::with_options(parts, &SplitRatios::Given(ratios.to_vec()), options).unwrap(),
    );
    let params = LoadParams {
        gpu_layers: None,
        context: ContextParams {
            n_ctx: 256,
            ..ContextParams::default()
        },
        ..LoadParams::default()
    };
    let model = Model::load_with(
        model_path(),
        meta,
        Arc::new(CpuDevice::new()),
        &params,
        &mut |_, _| {},
    )
    .unwrap();
    let counts = &model.layer_split().expect("a layer split").plan().counts;
    assert!(
        counts.iter().all(|&c| c > 0),
        "a part without layers: {counts:?}"
    );
    Arc::new(model)
}

#[test]
fn batched_greedy_equals_alone_split_by_layers() {
    let cpus: Vec<Arc<dyn Device>> = (0..2)
        .map(|_| Arc::new(CpuDevice::new()) as Arc<dyn Device>)
        .collect();
    check(
        "meta:cpu,cpu by layers",
        &layered_model(cpus, &[0.7, 0.3]),
        STEPS,
        4,
    );
    match tessera::registry().find("wgpu:0") {
        Ok(gpu) => {
            let parts: Vec<Arc<dyn Device>> = vec![Arc::new(CpuDevice::new()), gpu];
            check(
                "meta:cpu,wgpu:0 by layers",
                &layered_model(parts, &[0.5, 0.5]),
                STEPS_OTHER,
                2,
            );
        }
        Err(_) => println!("skipped the CPU + wgpu:0 case: no wgpu:0 device"),
    }
}

/// Two groups of sequences in flight at once over a layer split (`decode_groups`) give each
/// group the logits of decoding the groups one after another: exactly over CPU parts, to
/// rounding over a CPU and a wgpu adapter.
fn groups_equal_one_by_one(name: &str, model: &Arc<Model>, steps: usize, tol: f32) {
    let params = BatchParams {
        n_ctx: 256,
        n_seq: 4,
        n_ubatch: 64,
        ..BatchParams::default()
    };
    let mut together = BatchContext::new(model.clone(), params.clone()).unwrap();
    let mut apart = BatchContext::new(model.clone(), params).unwrap();
    let prompts = prompts();
    let a: Vec<u32> = prompts.iter().map(|_| together.add_seq()).collect();
    let b: Vec<u32> = prompts.iter().map(|_| apart.add_seq()).collect();
    // Each step: sequences 0-1 as one group, the others as the other, each bringing its
    // prompt, then its last greedy token.
    let mut next: Vec<Vec<u32>> = prompts.clone();
    let halves = [0..2, 2..prompts.len()];
    for step in 0..steps {
        let group = |seqs: &[u32], r: &std::ops::Range<usize>| -> Vec<SeqTokens<'_>> {
            r.clone()
                .map(|i| SeqTokens {
                    seq: seqs[i],
                    tokens: &next[i],
                    output: Output::Last,
                })
                .collect()
        };
        let ga: Vec<Vec<SeqTokens>> = halves.iter().map(|r| group(&a, r)).collect();
        let refs: Vec<&[SeqTokens]> = ga.iter().map(|g| g.as_slice()).collect();
        let got = together.decode_groups(&refs).unwrap();
        for (k, r) in halves.iter().enumerate() {
            let want = apart.decode(&group(&b, r)).unwrap();
            for (i, (w, o)) in want.iter().zip(&got[k]).enumerate() {
                let d = max_diff(w, o);
                assert!(
                    d <= tol,
                    "{name}: step {step}, group {k}, sequence {i}: logits differ by {d}"
                );
            }
        }
        next = got
            .iter()
            .flatten()
            .map(|l| vec![argmax(l) as u32])
            .collect();
    }
    println!("{name}: {steps} steps of two groups in flight match the groups one by one");
}

#[test]
fn groups_in_flight_over_a_layer_split_equal_the_groups_one_by_one() {
    let cpus: Vec<Arc<dyn Device>> = (0..2)
        .map(|_| Arc::new(CpuDevice::new()) as Arc<dyn Device>)
        .collect();
    groups_equal_one_by_one(
        "meta:cpu,cpu by layers",
        &layered_model(cpus, &[0.3, 0.7]),
        4,
        0.0,
    );
    match tessera::registry().find("wgpu:0") {
        Ok(gpu) => {
            let parts: Vec<Arc<dyn Device>> = vec![Arc::new(CpuDevice::new()), gpu];
            groups_equal_one_by_one(
                "meta:cpu,wgpu:0 by layers",
                &layered_model(parts, &[0.5, 0.5]),
                3,
                1e-3,
            );
        }
        Err(_) => println!("skipped the CPU + wgpu:0 case: no wgpu:0 device"),
    }
}

/// A model with sliding-window layers (the synthetic Gemma 3: a window of 16, prompts of 40 to
/// 60 tokens): the window applies per sequence in the shared cache.
#[test]
fn batched_greedy_equals_alone_with_sliding_windows() {
    let path =
        std::env::temp_dir().join(format!("tessera-batch-gemma3-{}.gguf", std::process::id()));
    synth::synth(
        Like::Gemma3Small,
        SynthType::from_name("f16").unwrap(),
        &path,
        &mut |_, _| {},
    )
    .unwrap();
    let dev: Arc<dyn Device> = Arc::new(CpuDevice::new());
    let loaded = Model::load(&path, dev.clone(), dev, &mut |_, _| {});
    std::fs::remove_file(&path).unwrap();
    let model = Arc::new(loaded.unwrap());
    assert!(model.config.max_window().is_some());
    let r: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("tests/data/arch/gemma3-small.json"),
        )
        .unwrap(),
    )
    .unwrap();
    let prompts: Vec<Vec<u32>> = r["prompts"].as_array().unwrap()[..3]
        .iter()
        .map(|p| ids(&p["prompt_ids"]))
        .collect();
    check_prompts("cpu, sliding windows", &model, STEPS, &prompts);
}

/// Largest absolute difference of two logit vectors.
fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

fn last(bc: &mut BatchContext, seq: u32, tokens: &[u32]) -> Vec<f32> {
    bc.decode(&[SeqTokens {
        seq,
        tokens,
        output: Output::Last,
    }])
    .unwrap()
    .remove(0)
}

#[test]
fn shared_prefix_truncation_and_saved_state_give_the_plain_logits() {
    let model = cpu_model();
    let p = prompts();
    let (a, b) = (&p[1], &p[3]);
    let params = BatchParams {
        n_ctx: 128,
        n_seq: 3,
        ..BatchParams::default()
    };
    let mut bc = BatchContext::new(model.clone(), params).unwrap();
    // The plain logits of a[..6] + b and of a.
    let s0 = bc.add_seq();
    let mut joined = a[..6].to_vec();
    joined.extend_from_slice(b);
    let want_joined = last(&mut bc, s0, &joined);
    bc.remove_seq(s0).unwrap();
    assert_eq!(
        bc.cells().used_end(),
        0,
        "removing the only sequence frees every cell"
    );
    let s1 = bc.add_seq();
    let want_a = last(&mut bc, s1, a);

    // A second sequence shares a's first 6 positions, then continues with b.
    let s2 = bc.add_seq();
    bc.copy_prefix(s1, s2, 6).unwrap();
    assert_eq!(bc.seq_len(s2).unwrap(), 6);
    let free = bc.cells().n_free();
    let got = last(&mut bc, s2, b);
    assert_eq!(
        bc.cells().n_free(),
        free - b.len(),
        "the prefix's cells are shared"
    );
    let d = max_diff(&got, &want_joined);
    assert!(d < 0.05, "shared prefix: logits differ by {d}");

    // Truncating the shared sequence back to the prefix and feeding b again gives the same.
    bc.truncate(s2, 6).unwrap();
    let again = last(&mut bc, s2, b);
    let d = max_diff(&again, &want_joined);
    assert!(d < 0.05, "after truncation: logits differ by {d}");

    // a's cells are untouched by the other sequence's writes: its next step equals a fresh one.
    let t = argmax(&want_a) as u32;
    let next_a = last(&mut bc, s1, &[t]);

    // Saved and restored (into another context), the sequence goes on as it would have.
    bc.truncate(s1, a.len()).unwrap();
    let saved = bc.save_seq(s1).unwrap();
    let mut other = BatchContext::new(
        model.clone(),
        BatchParams {
            n_ctx: 128,
            ..BatchParams::default()
        },
    )
    .unwrap();
    let r = other.restore_seq(&saved).unwrap();
    assert_eq!(other.seq_len(r).unwrap(), a.len());
    let restored = last(&mut other, r, &[t]);
    let d = max_diff(&restored, &next_a);
    assert!(d < 0.05, "restored: logits differ by {d}");
    let mut plain = a.clone();
    plain.push(t);
    let s3 = bc.add_seq();
    let fresh = last(&mut bc, s3, &plain);
    let d = max_diff(&fresh, &next_a);
    assert!(d < 0.05, "continued: logits differ by {d}");

    // A damaged save is refused by name, and a failing step leaves no positions behind.
    let err = other.restore_seq(&saved[..saved.len() - 1]).unwrap_err();
    assert!(err.to_string().contains("saved sequence"), "{err}");
    let len = bc.seq_len(s3).unwrap();
    let bad = bc.decode(&[SeqTokens {
        seq: s3,
        tokens: &[1, u32::MAX],
        output: Output::Last,
    }]);
    assert!(bad.is_err());
    assert_eq!(bc.seq_len(s3).unwrap(), len);
    let long = vec![1u32; 200];
    assert!(bc
        .decode(&[SeqTokens {
            seq: s3,
            tokens: &long,
            output: Output::Last,
        }])
        .is_err());
}

/// Random cell operations keep the free count, the lowest-first allocation and each sequence's
/// cells consistent with a plain model of them.
#[test]
fn cell_bookkeeping_matches_a_plain_model() {
    use rand::{Rng, SeedableRng};
    use std::collections::{BTreeMap, BTreeSet};
    use tessera_llm::kv_cache::Cells;

    let mut rng = rand::rngs::StdRng::seed_from_u64(35);
    let n = 64;
    let mut cells = Cells::new(n);
    // The plain model: each sequence's length.
    let mut lens: BTreeMap<u32, usize> = BTreeMap::new();
    for _ in 0..5000 {
        let seqs: Vec<u32> = lens.keys().copied().collect();
        let pick = |rng: &mut rand::rngs::StdRng| seqs[rng.gen_range(0..seqs.len())];
        match rng.gen_range(0..10) {
            0 if lens.len() < 6 => {
                lens.insert(cells.add_seq(), 0);
            }
            1 if !seqs.is_empty() => {
                let s = pick(&mut rng);
                cells.remove_seq(s).unwrap();
                lens.remove(&s);
            }
            2 if !seqs.is_empty() => {
                let s = pick(&mut rng);
                let k = rng.gen_range(0..=lens[&s]);
                cells.truncate(s, k).unwrap();
                lens.insert(s, k);
            }
            3 if seqs.len() >= 2 => {
                let (a, b) = (pick(&mut rng), pick(&mut rng));
                if a != b {
                    let k = rng.gen_range(0..=lens[&a]);
                    cells.copy_prefix(a, b, k).unwrap();
                    lens.insert(b, k);
                }
            }
            _ if !seqs.is_empty() => {
                let s = pick(&mut rng);
                let lowest_free =
                    (0..n).find(|c| !lens.keys().any(|&q| cells.cells_of(q).contains(c)));
                match cells.push(s) {
                    Ok(c) => {
                        assert_eq!(Some(c), lowest_free, "the lowest free cell is taken");
                        *lens.get_mut(&s).unwrap() += 1;
                    }
                    Err(_) => assert_eq!(lowest_free, None, "a free cell was left"),
                }
            }
            _ => {}
        }
        let mut used = BTreeSet::new();
        for (&s, &len) in &lens {
            let c = cells.cells_of(s);
            assert_eq!(c.len(), len, "sequence {s} holds one cell per position");
            assert_eq!(cells.seq_len(s).unwrap(), len);
            used.extend(c);
        }
        assert_eq!(cells.n_free(), n - used.len());
    }
}

/// Cells handed out in pages: while a wholly free page is left, a sequence's new cell lies in a
/// page handed to it, so a step's mask hides whole pages from the other sequences; once none
/// is, any free cell is taken (pages then mix), and the cache is full only when no cell is
/// free.
#[test]
fn cells_in_pages_stay_with_their_sequence() {
    use rand::{Rng, SeedableRng};
    use std::collections::BTreeMap;
    use tessera_llm::kv_cache::Cells;

    let mut rng = rand::rngs::StdRng::seed_from_u64(36);
    let (n, page) = (60, 8);
    let mut cells = Cells::with_pages(n, page);
    assert_eq!(cells.page(), page);
    let mut lens: BTreeMap<u32, usize> = BTreeMap::new();
    // Which sequence holds each cell (no prefix is shared here, so one at most).
    let holder = |cells: &Cells, lens: &BTreeMap<u32, usize>| {
        let mut h = vec![None; n];
        for &s in lens.keys() {
            for c in cells.cells_of(s) {
                assert_eq!(h[c], None, "cell {c} held twice");
                h[c] = Some(s);
            }
        }
        h
    };
    let mut mixed = 0;
    for _ in 0..4000 {
        let seqs: Vec<u32> = lens.keys().copied().collect();
        let pick = |rng: &mut rand::rngs::StdRng| seqs[rng.gen_range(0..seqs.len())];
        match rng.gen_range(0..12) {
            0 if lens.len() < 5 => {
                lens.insert(cells.add_seq(), 0);
            }
            1 if !seqs.is_empty() => {
                let s = pick(&mut rng);
                cells.remove_seq(s).unwrap();
                lens.remove(&s);
            }
            2 if !seqs.is_empty() => {
                let s = pick(&mut rng);
                let k = rng.gen_range(0..=lens[&s]);
                cells.truncate(s, k).unwrap();
                lens.insert(s, k);
            }
            _ if !seqs.is_empty() => {
                let s = pick(&mut rng);
                let h = holder(&cells, &lens);
                let pages: Vec<&[Option<u32>]> = h.chunks(page).collect();
                let free_page = pages.iter().any(|p| p.iter().all(Option::is_none));
                let any_free = h.iter().any(Option::is_none);
                match cells.push(s) {
                    Ok(c) => {
                        assert_eq!(h[c], None, "cell {c} was taken");
                        if free_page {
                            assert_eq!(
                                cells.page_owner(c / page),
                                Some(s),
                                "while a page was free, a cell outside the sequence's pages was taken"
                            );
                        }
                        if pages[c / page].iter().any(|&x| x.is_some_and(|x| x != s)) {
                            mixed += 1;
                        }
                        *lens.get_mut(&s).unwrap() += 1;
                    }
                    Err(e) => {
                        assert!(!any_free, "a free cell was left");
                        assert!(e.to_string().contains("in use"), "{e}");
                    }
                }
            }
            _ => {}
        }
        let h = holder(&cells, &lens);
        for (&s, &len) in &lens {
            assert_eq!(cells.cells_of(s).len(), len);
            assert_eq!(cells.seq_len(s).unwrap(), len);
        }
        assert_eq!(cells.n_free(), h.iter().filter(|x| x.is_none()).count());
    }
    assert!(
        mixed > 0,
        "the cache never filled its pages: the test did not reach the fallback"
    );
}
