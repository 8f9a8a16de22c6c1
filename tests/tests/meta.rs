//! The meta layer on CPU parts: the conformance cases that can be split, on meta devices of 2
//! and 3 CPU devices with uneven ratios, against the CPU; sharded buffers; split errors.

use std::sync::Arc;

mod meta_common;
use meta_common::*;

use tessera::meta::{InputPolicy, MetaDevice, SplitRatios};
use tessera_conformance::{test, Options, Reference, Status, Summary};
use tessera_core::Device;

fn meta(ratios: &[f64]) -> Arc<dyn Device> {
    let parts = ratios.iter().map(|_| cpu()).collect();
    let m = MetaDevice::new(parts, &SplitRatios::Given(ratios.to_vec()))
        .expect("a meta device of CPUs");
    Arc::new(m.with_input_policy(InputPolicy::MostSplit))
}

fn conformance(ratios: &[f64]) -> Summary {
    let dev = meta(ratios);
    let start = std::time::Instant::now();
    let summary = test(
        &dev,
        &Reference::Device(cpu()),
        &Options::default(),
        &mut |_| {},
    );
    println!("{summary}");
    println!(
        "{} cases in {:.1} s",
        summary.results.len(),
        start.elapsed().as_secs_f64()
    );
    for r in &summary.results {
        if let Status::Skipped(_) = r.status {
            println!("{r}");
        }
    }
    for f in summary.failures() {
        eprintln!("{f}");
    }
    summary
}

#[test]
fn splittable_cases_match_the_cpu_on_two_cpu_parts() {
    let s = conformance(&[0.7, 0.3]);
    assert_eq!(s.failed(), 0, "{}", s.totals());
}

#[test]
fn splittable_cases_match_the_cpu_on_three_cpu_parts() {
    let s = conformance(&[0.5, 0.3, 0.2]);
    assert_eq!(s.failed(), 0, "{}", s.totals());
    assert!(s.passed() > 700, "{}", s.totals());
}

// ---- hand-built graphs with sharded weights ----

use std::sync::Mutex;

use tessera::meta::{AxisSplit, Segment, ShardedTensor, SplitState};
use tessera_core::{
    Backend, Buffer, BufferType, DType, DeviceKind, Error, Graph, Memory, Result, TensorId,
};

/// Ops and shapes a part computed.
type Log = Arc<Mutex<Vec<(String, [usize; 4])>>>;

/// A CPU device whose backends record the shape of every node they compute.
struct Recording {
    inner: Arc<dyn Device>,
    log: Log,
}

struct RecordingBackend {
    inner: Box<dyn Backend>,
    log: Log,
}

impl Backend for RecordingBackend {
    fn name(&self) -> String {
        self.inner.name()
    }
    fn compute(&mut self, graph: &Graph, nodes: &[TensorId]) -> Result<()> {
        let mut log = self.log.lock().unwrap();
        for &n in nodes {
            let t = graph.get(n);
            log.push((t.op.name().to_string(), t.ne));
        }
        drop(log);
        self.inner.compute(graph, nodes)
    }
    fn synchronize(&mut self) -> Result<()> {
        self.inner.synchronize()
    }
}

impl Device for Recording {
    fn name(&self) -> String {
        self.inner.name()
    }
    fn description(&self) -> String {
        self.inner.description()
    }
    fn kind(&self) -> DeviceKind {
        self.inner.kind()
    }
    fn memory(&self) -> Memory {
        self.inner.memory()
    }
    fn buffer_type(&self) -> Arc<dyn BufferType> {
        self.inner.buffer_type()
    }
    fn new_backend(&self) -> Result<Box<dyn Backend>> {
        Ok(Box::new(RecordingBackend {
            inner: self.inner.new_backend()?,
            log: self.log.clone(),
        }))
    }
    fn supports_op(&self, graph: &Graph, id: TensorId) -> bool {
        self.inner.supports_op(graph, id)
    }
    fn can_use_buffer(&self, buffer: &dyn Buffer) -> bool {
        self.inner.can_use_buffer(buffer)
    }
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

/// A meta device of recording CPU parts, and each part's log.
fn recording_meta(ratios: &[f64]) -> (Arc<dyn Device>, Vec<Log>) {
    let logs: Vec<_> = ratios
        .iter()
        .map(|_| Arc::new(Mutex::new(Vec::new())))
        .collect();
    let parts: Vec<Arc<dyn Device>> = logs
        .iter()
        .map(|l| {
            Arc::new(Recording {
                inner: cpu(),
                log: l.clone(),
            }) as Arc<dyn Device>
        })
        .collect();
    let m = MetaDevice::new(parts, &SplitRatios::Given(ratios.to_vec())).unwrap();
    (Arc::new(m), logs)
}

#[test]
fn column_then_row_parallel_matches_the_cpu_and_computes_slices() {
    for dtype in [DType::F32, DType::Q8_0, DType::Q4_0] {
        let ratios = [0.7, 0.3];
        let want = eval(&cpu(), &mlp_weights(&ratios, dtype), &[64, 5], &mlp, 2).unwrap();
        let (dev, logs) = recording_meta(&ratios);
        let got = eval(&dev, &mlp_weights(&ratios, dtype), &[64, 5], &mlp, 2).unwrap();
        assert_close("column then row parallel", &want, &got, 1e-10);
        // Part 1 computed its 32 hidden rows of the first mul_mat, and a full-shape partial of the second.
        let log = logs[1].lock().unwrap();
        let mm: Vec<[usize; 4]> = log
            .iter()
            .filter(|(op, _)| op == "MUL_MAT")
            .map(|(_, ne)| *ne)
            .collect();
        assert_eq!(mm[..2], [[32, 5, 1, 1], [64, 5, 1, 1]], "{dtype}: {mm:?}");
    }
}

#[test]
fn a_part_with_an_empty_slice_adds_nothing() {
    let ratios = [0.6, 0.4, 0.0];
    let want = eval(
        &cpu(),
        &mlp_weights(&ratios, DType::Q8_0),
        &[64, 3],
        &mlp,
        2,
    )
    .unwrap();
    let (dev, logs) = recording_meta(&ratios);
    let got = eval(&dev, &mlp_weights(&ratios, DType::Q8_0), &[64, 3], &mlp, 2).unwrap();
    assert_close("an empty slice", &want, &got, 1e-10);
    let log = logs[2].lock().unwrap();
    assert!(
        !log.iter().any(|(op, _)| op == "MUL_MAT"),
        "the empty part ran a mul_mat: {log:?}"
    );
}

#[test]
fn a_fused_qkv_weight_splits_each_segment() {
    // Q of 16 rows, K and V of 8: part 0 takes 12 of Q and 6 of K and of V.
    let seg = AxisSplit::with_segments(
        1,
        vec![
            Segment {
                counts: vec![12, 4],
                repeat: 1,
            },
            Segment {
                counts: vec![6, 2],
                repeat: 2,
            },
        ],
    )
    .unwrap();
    let ws = || {
        vec![weight(
            DType::F32,
            [32, 32, 1, 1],
            SplitState::Split(seg.clone()),
            7,
        )]
    };
    let build = |g: &mut Graph, w: &[TensorId], x: TensorId| -> Result<Vec<TensorId>> {
        let qkv = g.mul_mat(w[0], x)?;
        let row = g.get(qkv).nb[1];
        let q = g.view(qkv, &[16, 4], &[row], 0)?;
        let k = g.view(qkv, &[8, 4], &[row], 16 * 4)?;
        let v = g.view(qkv, &[8, 4], &[row], 24 * 4)?;
        let q = g.scale(q, 2.0)?;
        let k = g.unary(k, tessera_core::UnaryOp::Neg)?;
        let v = g.cont(v)?;
        Ok(vec![q, k, v])
    };
    let want = eval(&cpu(), &ws(), &[32, 4], &build, 2).unwrap();
    let (dev, logs) = recording_meta(&[0.75, 0.25]);
    let got = eval(&dev, &ws(), &[32, 4], &build, 2).unwrap();
    assert_close("fused qkv", &want, &got, 0.0);
    let log = logs[1].lock().unwrap();
    let shapes: Vec<(String, [usize; 4])> = log
        .iter()
        .filter(|(op, _)| op != "MUL_MAT")
        .cloned()
        .collect();
    assert_eq!(
        shapes[..3],
        [
            ("SCALE".into(), [4, 4, 1, 1]),
            ("NEG".into(), [2, 4, 1, 1]),
            ("CONT".into(), [2, 4, 1, 1])
        ]
    );
}

#[test]
fn a_graph_that_cannot_be_split_names_the_tensor_and_op() {
    let ratios = [0.5, 0.5];
    let ws = mlp_weights(&ratios, DType::F32);
    let build = |g: &mut Graph, w: &[TensorId], x: TensorId| -> Result<Vec<TensorId>> {
        let h = g.mul_mat(w[0], x)?;
        let n = g.rms_norm(h, 1e-5)?;
        g.set_name(n, "normed_hidden");
        Ok(vec![n])
    };
    let err = eval(
        &meta(&ratios).as_ref().clone_meta(),
        &ws,
        &[64, 2],
        &build,
        2,
    )
    .unwrap_err();
    match &err {
        Error::Split { tensor, op, reason } => {
            assert_eq!(tensor, "normed_hidden");
            assert_eq!(*op, "RMS_NORM");
            assert!(reason.contains("whole rows"), "{reason}");
        }
        other => panic!("expected a split error, got {other}"),
    }
}

trait CloneMeta {
    fn clone_meta(&self) -> Arc<dyn Device>;
}

impl CloneMeta for dyn Device {
    /// The same meta device with the default (mirrored) input policy, as the model runner uses it.
    fn clone_meta(&self) -> Arc<dyn Device> {
        Arc::new(
            MetaDevice::from_device(self)
                .unwrap()
                .with_input_policy(InputPolicy::Mirrored),
        )
    }
}

#[test]
fn the_scheduler_runs_a_meta_device_and_checks_its_splits() {
    let ratios = [0.25, 0.75];
    scheduled_mlp_matches_the_cpu(&meta(&ratios).clone_meta(), &ratios, 4, 1);
}

#[test]
fn sharded_buffers_scatter_and_gather_whole_tensors() {
    let dev = meta(&[0.5, 0.5]);
    let m = MetaDevice::from_device(dev.as_ref()).unwrap();
    let ws = [
        weight(
            DType::Q4_0,
            [128, 3, 1, 1],
            SplitState::split(0, vec![96, 32]),
            1,
        ),
        weight(
            DType::F16,
            [4, 6, 2, 1],
            SplitState::split(2, vec![1, 1]),
            2,
        ),
        weight(DType::F32, [5, 3, 1, 1], SplitState::Mirrored, 3),
    ];
    let (buf, offs) = place(&dev, &ws).unwrap();
    for (w, &o) in ws.iter().zip(&offs) {
        let mut back = vec![0u8; w.data.len()];
        buf.get(o, &mut back).unwrap();
        assert_eq!(back, w.data);
    }
    // Part 1 holds one Q4_0 block per row of the first tensor.
    let meta_buf = buf
        .as_any()
        .downcast_ref::<tessera::meta::MetaBuffer>()
        .unwrap();
    assert!(meta_buf.part_buffers()[1].size() < meta_buf.part_buffers()[0].size());
    // Cutting a quantization block, a part count that does not match, overlapping tensors.
    let bad = |state: SplitState, ne: [usize; 4], dtype: DType| {
        m.alloc_sharded(
            1 << 16,
            &[ShardedTensor {
                offset: 0,
                dtype,
                ne,
                state,
            }],
        )
        .err()
        .map(|e| e.to_string())
    };
    assert!(bad(
        SplitState::split(0, vec![80, 48]),
        [128, 3, 1, 1],
        DType::Q4_0
    )
    .unwrap()
    .contains("cut"));
    assert!(bad(
        SplitState::split(1, vec![1, 1, 1]),
        [128, 3, 1, 1],
        DType::F32
    )
    .is_some());
    assert!(
        bad(SplitState::split(1, vec![1, 1]), [128, 3, 1, 1], DType::F32)
            .unwrap()
            .contains("add up")
    );
    // A partial write of a sharded tensor is refused.
    assert!(buf.set(offs[0], &ws[0].data[..10]).is_err());
}

#[test]
fn bad_meta_specs_and_ratios_give_clear_errors() {
    let options = tessera::Options::default();
    let e = tessera::device(&options, "meta:cpu,nosuch:3")
        .err()
        .unwrap();
    assert!(
        matches!(e, Error::NoSuchDevice(_)) && e.to_string().contains("nosuch:3"),
        "{e}"
    );
    let e = tessera::device(&options, "meta:cpu,,cpu").err().unwrap();
    assert!(e.to_string().contains("empty part"), "{e}");
    let e = tessera::meta_device(
        &options,
        "meta:cpu,cpu",
        &SplitRatios::Given(vec![0.5, 0.3, 0.2]),
    )
    .err()
    .unwrap();
    assert!(
        e.to_string().contains("3 entries") && e.to_string().contains("2 parts"),
        "{e}"
    );
    let e = tessera::meta_device(
        &options,
        "meta:cpu,cpu",
        &SplitRatios::Given(vec![0.5, -0.5]),
    )
    .err()
    .unwrap();
    assert!(e.to_string().contains("negative"), "{e}");
    assert!(SplitRatios::parse("0.6,x").is_err());
    assert_eq!(SplitRatios::parse("auto").unwrap(), SplitRatios::Auto);
    assert_eq!(
        SplitRatios::parse("3,1").unwrap(),
        SplitRatios::Given(vec![3.0, 1.0])
    );
    // Automatic ratios of two identical parts are even; a meta device lists its parts.
    let d = tessera::device(&options, "meta:cpu,cpu").unwrap();
    assert_eq!(d.name(), "meta:cpu,cpu");
    assert_eq!(d.kind(), DeviceKind::Meta);
    assert_eq!(d.parts().len(), 2);
    assert_eq!(
        MetaDevice::from_device(d.as_ref()).unwrap().ratios(),
        &[0.5, 0.5]
    );
}

/// A CPU and a wgpu adapter (lavapipe in CI) as one meta device; skipped, saying so, when the
/// facade has no wgpu device (built without the `wgpu` feature).
#[test]
fn splittable_cases_match_the_cpu_on_cpu_and_wgpu_parts() {
    let Ok(gpu) = tessera::registry().find("wgpu:0") else {
        println!("skipped: no wgpu:0 device (build with the wgpu feature)");
        return;
    };
    let m = MetaDevice::new(vec![cpu(), gpu], &SplitRatios::Given(vec![0.6, 0.4])).unwrap();
    let dev: Arc<dyn Device> = Arc::new(m.with_input_policy(InputPolicy::MostSplit));
    let mut options = Options::default();
    options.filter.skip_large = true;
    let s = test(&dev, &Reference::Device(cpu()), &options, &mut |_| {});
    println!("{s}");
    for f in s.failures() {
        eprintln!("{f}");
    }
    assert_eq!(s.failed(), 0, "{}", s.totals());
    assert!(s.passed() > 700, "{}", s.totals());
}

#[test]
fn partial_results_can_be_summed_in_bf16() {
    let ratios = [0.7, 0.3];
    let want = eval(
        &cpu(),
        &mlp_weights(&ratios, DType::Q8_0),
        &[64, 5],
        &mlp,
        2,
    )
    .unwrap();
    let (dev, logs) = recording_meta(&ratios);
    let dev: Arc<dyn Device> = Arc::new(
        MetaDevice::from_device(dev.as_ref())
            .unwrap()
            .with_bf16_reduce(0),
    );
    let got = eval(&dev, &mlp_weights(&ratios, DType::Q8_0), &[64, 5], &mlp, 2).unwrap();
    // bf16 keeps 8 significant bits: about 4e-3 relative per value.
    assert_close("bf16 sums", &want, &got, 1e-4);
    let e = nmse(&want[0], &got[0]);
    assert!(e > 0.0, "the bf16 path ran as f32");
    let log = logs[0].lock().unwrap();
    assert!(
        log.iter().filter(|(op, _)| op == "CPY").count() >= 2,
        "no casts around the all-reduce: {log:?}"
    );
}

// ---- expert parallelism ----

/// A MoE layer's weights: the router (mirrored), and gate, up and down of 8 experts, split
/// whole over the parts by `ratios` (along the expert axis).
fn moe_weights(ratios: &[f64], dtype: DType) -> Vec<W> {
    let (d, ff, n_expert) = (64, 64, 8);
    let experts = SplitState::split(2, tessera::meta::partition(n_expert, ratios));
    vec![
        weight(DType::F32, [d, n_expert, 1, 1], SplitState::Mirrored, 11),
        weight(dtype, [d, ff, n_expert, 1], experts.clone(), 12),
        weight(dtype, [d, ff, n_expert, 1], experts.clone(), 13),
        weight(dtype, [ff, d, n_expert, 1], experts, 14),
    ]
}

/// A MoE feed-forward as the model runner builds it (soft-max router, top 2 renormalized,
/// SwiGLU experts, weighted sum of the slots) with the residual add and a norm after it.
fn moe_layer(g: &mut Graph, w: &[TensorId], x: TensorId) -> Result<Vec<TensorId>> {
    let (d, n, n_used) = (g.get(x).ne[0], g.get(x).ne[1], 2);
    let n_expert = g.get(w[0]).ne[1];
    let logits = g.mul_mat(w[0], x)?;
    let probs = g.soft_max_ext(logits, None, 1.0, 0.0)?;
    let ids = g.top_k(probs, n_used)?;
    let probs = g.reshape(probs, &[1, n_expert, n])?;
    let p = g.get_rows(probs, ids)?;
    let p = g.reshape(p, &[n_used, n])?;
    let sum = g.sum_rows(p)?;
    let p = g.div(p, sum)?;
    let p = g.reshape(p, &[1, n_used, n])?;
    let x3 = g.reshape(x, &[d, 1, n])?;
    let gate = g.mul_mat_id(w[1], x3, ids)?;
    let up = g.mul_mat_id(w[2], x3, ids)?;
    let act = g.swiglu_split(gate, up)?;
    let down = g.mul_mat_id(w[3], act, ids)?;
    let y = g.mul(down, p)?;
    let nb = g.get(y).nb;
    let mut out = g.view(y, &[d, n], &[nb[2]], 0)?;
    for e in 1..n_used {
        let slot = g.view(y, &[d, n], &[nb[2]], e * nb[1])?;
        out = g.add(out, slot)?;
    }
    let z = g.add(x, out)?;
    Ok(vec![g.rms_norm(z, 1e-5)?])
}

#[test]
fn whole_experts_on_each_part_match_the_cpu() {
    for (ratios, dtype) in [
        (vec![0.5, 0.5], DType::F32),
        (vec![0.7, 0.3], DType::Q8_0),
        (vec![0.5, 0.3, 0.2], DType::Q4_0),
        (vec![0.6, 0.4, 0.0], DType::Q8_0),
    ] {
        let want = eval(
            &cpu(),
            &moe_weights(&ratios, dtype),
            &[64, 7],
            &moe_layer,
            2,
        )
        .unwrap();
        let (dev, logs) = recording_meta(&ratios);
        let got = eval(&dev, &moe_weights(&ratios, dtype), &[64, 7], &moe_layer, 2).unwrap();
        assert_close(&format!("experts split {ratios:?}"), &want, &got, 1e-10);
        // Every part that holds experts ran the three products of each of the two runs; a
        // part holding none ran none.
        let held = tessera::meta::partition(8, &ratios);
        for (j, log) in logs.iter().enumerate() {
            let n = log
                .lock()
                .unwrap()
                .iter()
                .filter(|(op, _)| op == "MUL_MAT_ID")
                .count();
            let want = if held[j] > 0 { 3 * 2 } else { 0 };
            assert_eq!(n, want, "part {j} ({} experts): {n} mul_mat_id", held[j]);
        }
    }
}
