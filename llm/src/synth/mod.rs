//! Synthetic and trimmed models, so that every backend can be checked and benchmarked where the
//! real models cannot go (a machine that takes small uploads only, a benchmark of a shape nobody
//! has downloaded).
//!
//! [`synth`] writes a Llama GGUF with random weights: [`Like::Smollm2_135m`] copies the test
//! model's layout exactly (every metadata key and value, its tokenizer included, and its tensor
//! list and order), [`Like::Llama1b`] and [`Like::Llama8b`] have Llama 3's shapes and a generated
//! byte-level BPE vocabulary, and [`synth_shape`] takes any [`Shape`]. [`trim`] keeps the first
//! layers of a real model.
//!
//! Weights are drawn from a seeded generator (the same file every time), roughly normal with a
//! standard deviation of 0.02 for matrices and around 1 for norms, so that a forward pass stays
//! finite; they are generated, quantized and written a few rows at a time, on every core, while
//! the file is written, so an 8B-shape model takes little memory. Files are written to a
//! temporary name and renamed into place when complete.

mod vocab;

use std::cell::RefCell;
use std::io::Write;
use std::path::Path;

use rayon::prelude::*;
use tessera_core::gguf::{GgufFile, GgufValue, GgufWriter};
use tessera_core::quant::quantize_row;
use tessera_core::{DType, Error, Result};

use crate::config::LlamaConfig;
use crate::fetch;

pub use vocab::MIN_VOCAB;

/// The types [`synth`] writes the weight matrices in.
pub const SYNTH_TYPES: [DType; 5] = [
    DType::Q4_0,
    DType::Q4_1,
    DType::Q8_0,
    DType::Q4_K,
    DType::F16,
];

/// The seed of every synthetic model.
const SEED: u64 = 0x7e55_e7a0_5eed;

/// Values generated per task (a few rows).
const CHUNK_VALUES: usize = 1 << 16;

/// A model whose shape a synthetic model copies.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Like {
    /// Exactly the test model's layout (SmolLM2-135M-Instruct): its metadata and tokenizer
    /// copied from the file ([`fetch::test_model`]), 30 layers of width 576, feed-forward 1536,
    /// 9 query and 3 KV heads, vocabulary 49152, output tied to the token embedding; the
    /// matrices of the chosen type, `token_embd` Q8_0 when that type is quantized (as in the
    /// real file), norms F32.
    Smollm2_135m,
    /// Llama 3.2 1B's shape ([`Shape::LLAMA_1B`]), every matrix of the chosen type.
    Llama1b,
    /// Llama 3 8B's shape ([`Shape::LLAMA_8B`]), every matrix of the chosen type, the token
    /// embedding and the separate output included.
    Llama8b,
}

impl Like {
    /// Every model, in the order of [`Like::NAMES`].
    pub const ALL: [Like; 3] = [Like::Smollm2_135m, Like::Llama1b, Like::Llama8b];

    /// The names of [`Like::ALL`], as the command line takes them.
    pub const NAMES: [&'static str; 3] = ["smollm2-135m", "llama-1b", "llama-8b"];

    /// The model's name (`smollm2-135m`, `llama-1b`, `llama-8b`).
    pub fn name(self) -> &'static str {
        match self {
            Like::Smollm2_135m => Like::NAMES[0],
            Like::Llama1b => Like::NAMES[1],
            Like::Llama8b => Like::NAMES[2],
        }
    }

    /// The model with this name; an error listing the names otherwise.
    pub fn from_name(name: &str) -> Result<Like> {
        Like::ALL
            .into_iter()
            .find(|l| l.name() == name)
            .ok_or_else(|| {
                Error::Invalid(format!(
                    "no synthetic model '{name}' (choose one of {})",
                    Like::NAMES.join(", ")
                ))
            })
    }
}

/// The shape of a synthetic Llama model with a generated vocabulary ([`synth_shape`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Shape {
    /// Embedding width.
    pub n_embd: usize,
    /// Transformer blocks.
    pub n_layer: usize,
    /// Feed-forward width.
    pub n_ff: usize,
    /// Query heads.
    pub n_head: usize,
    /// Key/value heads.
    pub n_head_kv: usize,
    /// Vocabulary size (at least [`MIN_VOCAB`]).
    pub n_vocab: usize,
    /// Rope frequency base.
    pub rope_base: f32,
    /// Training context length written to the file.
    pub n_ctx_train: usize,
    /// Whether the output projection is the token embedding (no `output.weight`).
    pub tied_output: bool,
}

impl Shape {
    /// Llama 3.2 1B: width 2048, 16 layers, feed-forward 8192, 32 query and 8 KV heads of 64,
    /// vocabulary 128256, rope base 500000, tied output.
    pub const LLAMA_1B: Shape = Shape {
        n_embd: 2048,
        n_layer: 16,
        n_ff: 8192,
        n_head: 32,
        n_head_kv: 8,
        n_vocab: 128_256,
        rope_base: 500_000.0,
        n_ctx_train: 131_072,
        tied_output: true,
    };

    /// Llama 3 8B: width 4096, 32 layers, feed-forward 14336, 32 query and 8 KV heads of 128,
    /// vocabulary 128256, rope base 500000, separate output.
    pub const LLAMA_8B: Shape = Shape {
        n_embd: 4096,
        n_layer: 32,
        n_ff: 14_336,
        n_head: 32,
        n_head_kv: 8,
        n_vocab: 128_256,
        rope_base: 500_000.0,
        n_ctx_train: 8192,
        tied_output: false,
    };

    /// Width of one attention head.
    pub fn head_dim(&self) -> usize {
        self.n_embd / self.n_head.max(1)
    }

    /// Checks that the shape makes a model the runner can load.
    fn check(&self) -> Result<()> {
        let bad = |why: String| Err(Error::Invalid(format!("synthetic shape {self:?}: {why}")));
        if self.n_layer == 0 || self.n_head == 0 || self.n_head_kv == 0 || self.n_ff == 0 {
            return bad("layers, heads and the feed-forward width must be at least 1".into());
        }
        if !self.n_embd.is_multiple_of(self.n_head) || !self.n_head.is_multiple_of(self.n_head_kv) {
            return bad("the heads must divide the width, and the KV heads the heads".into());
        }
        if !self.head_dim().is_multiple_of(2) {
            return bad(format!(
                "the head width {} must be even for rope",
                self.head_dim()
            ));
        }
        if !(MIN_VOCAB..=1 << 24).contains(&self.n_vocab) {
            return bad(format!(
                "the vocabulary must have {MIN_VOCAB} to {} tokens",
                1 << 24
            ));
        }
        if self.n_ctx_train == 0 || !(self.rope_base.is_finite() && self.rope_base > 0.0) {
            return bad("the context length and rope base must be positive".into());
        }
        Ok(())
    }
}

/// Metadata key/value pairs, in file order.
type Metadata = Vec<(String, GgufValue)>;

/// How one tensor is made: its name, type and shape, and the distribution of its values.
struct Plan {
    name: String,
    dtype: DType,
    ne: Vec<u64>,
    /// Mean and standard deviation of the values.
    mean: f32,
    std: f32,
}

impl Plan {
    /// A weight matrix `[ne0, ne1]` of `dtype` (or its fallback), values with std 0.02.
    fn matrix(name: String, dtype: DType, ne0: u64, ne1: u64) -> Result<Plan> {
        let dtype = row_type(&name, dtype, ne0)?;
        Ok(Plan {
            name,
            dtype,
            ne: vec![ne0, ne1],
            mean: 0.0,
            std: 0.02,
        })
    }

    /// A norm weight `[n]`, F32, values around 1.
    fn norm(name: String, n: u64) -> Plan {
        Plan {
            name,
            dtype: DType::F32,
            ne: vec![n],
            mean: 1.0,
            std: 0.02,
        }
    }
}

/// The type a row of `ne0` values is written in: `dtype`, or where its blocks do not divide
/// the row, llama.cpp's fallback (Q4_K rows that are not whole 256-value blocks become Q5_0).
fn row_type(name: &str, dtype: DType, ne0: u64) -> Result<DType> {
    let fits = |t: DType| ne0.is_multiple_of(t.block_size() as u64);
    if fits(dtype) {
        return Ok(dtype);
    }
    if dtype == DType::Q4_K && fits(DType::Q5_0) {
        return Ok(DType::Q5_0);
    }
    Err(Error::Invalid(format!(
        "tensor '{name}': rows of {ne0} values are not whole {dtype} blocks of {}",
        dtype.block_size()
    )))
}

/// `general.file_type` of a model whose matrices are `dtype` (llama.cpp's `LLAMA_FTYPE_*`).
fn file_type(dtype: DType) -> u32 {
    match dtype {
        DType::F16 => 1,
        DType::Q4_0 => 2,
        DType::Q4_1 => 3,
        DType::Q8_0 => 7,
        // MOSTLY_Q4_K_S: every matrix Q4_K.
        DType::Q4_K => 14,
        _ => 0,
    }
}

fn check_type(dtype: DType) -> Result<()> {
    if SYNTH_TYPES.contains(&dtype) {
        return Ok(());
    }
    let names: Vec<&str> = SYNTH_TYPES.iter().map(|t| t.name()).collect();
    Err(Error::Invalid(format!(
        "synthetic models are written in {}, not {dtype}",
        names.join(", ")
    )))
}

/// Writes a random-weight model shaped like `like`, its matrices of `dtype` (one of
/// [`SYNTH_TYPES`]), to `out`; `progress(done, total)` reports bytes of tensor data written.
///
/// [`Like::Smollm2_135m`] reads the test model ([`fetch::test_model`], fetched when it is not
/// cached). The file is deterministic: the same arguments give the same bytes.
pub fn synth(
    like: Like,
    dtype: DType,
    out: &Path,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<()> {
    match like {
        Like::Smollm2_135m => {
            check_type(dtype)?;
            let template = GgufFile::open(fetch::test_model(&mut |_| {})?)?;
            let (metadata, plans) = copy_layout(&template, dtype)?;
            write_model(metadata, plans, out, progress)
        }
        Like::Llama1b => synth_shape(&Shape::LLAMA_1B, dtype, out, progress),
        Like::Llama8b => synth_shape(&Shape::LLAMA_8B, dtype, out, progress),
    }
}

/// Writes a random-weight Llama model of any [`Shape`] with a generated byte-level BPE
/// vocabulary (256 byte tokens, merges, filler tokens, and Llama 3's control tokens at the end:
/// `<|begin_of_text|>` is BOS, `<|end_of_text|>` EOS); every matrix, the token embedding and
/// the output included, is of `dtype` (one of [`SYNTH_TYPES`]).
pub fn synth_shape(
    shape: &Shape,
    dtype: DType,
    out: &Path,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<()> {
    check_type(dtype)?;
    shape.check()?;
    let (d, ff, nv) = (shape.n_embd as u64, shape.n_ff as u64, shape.n_vocab as u64);
    let hd = shape.head_dim() as u64;
    let (nq, nkv) = (hd * shape.n_head as u64, hd * shape.n_head_kv as u64);

    let mut plans = vec![Plan::matrix("token_embd.weight".into(), dtype, d, nv)?];
    for l in 0..shape.n_layer {
        let p = |s: &str| format!("blk.{l}.{s}.weight");
        plans.push(Plan::norm(p("attn_norm"), d));
        plans.push(Plan::matrix(p("attn_q"), dtype, d, nq)?);
        plans.push(Plan::matrix(p("attn_k"), dtype, d, nkv)?);
        plans.push(Plan::matrix(p("attn_v"), dtype, d, nkv)?);
        plans.push(Plan::matrix(p("attn_output"), dtype, nq, d)?);
        plans.push(Plan::norm(p("ffn_norm"), d));
        plans.push(Plan::matrix(p("ffn_gate"), dtype, d, ff)?);
        plans.push(Plan::matrix(p("ffn_up"), dtype, d, ff)?);
        plans.push(Plan::matrix(p("ffn_down"), dtype, ff, d)?);
    }
    plans.push(Plan::norm("output_norm.weight".into(), d));
    if !shape.tied_output {
        plans.push(Plan::matrix("output.weight".into(), dtype, d, nv)?);
    }

    let v = vocab::byte_level_bpe(shape.n_vocab)?;
    let u = |n: usize| GgufValue::U32(n as u32);
    let metadata: Metadata = vec![
        ("general.architecture".into(), "llama".into()),
        ("general.type".into(), "model".into()),
        (
            "general.name".into(),
            format!(
                "tessera synthetic Llama, {} layers x {}",
                shape.n_layer, shape.n_embd
            )
            .into(),
        ),
        ("general.file_type".into(), file_type(dtype).into()),
        ("general.quantization_version".into(), 2u32.into()),
        ("llama.block_count".into(), u(shape.n_layer)),
        ("llama.context_length".into(), u(shape.n_ctx_train)),
        ("llama.embedding_length".into(), u(shape.n_embd)),
        ("llama.feed_forward_length".into(), u(shape.n_ff)),
        ("llama.attention.head_count".into(), u(shape.n_head)),
        ("llama.attention.head_count_kv".into(), u(shape.n_head_kv)),
        ("llama.rope.freq_base".into(), shape.rope_base.into()),
        (
            "llama.attention.layer_norm_rms_epsilon".into(),
            1e-5f32.into(),
        ),
        ("llama.attention.key_length".into(), u(shape.head_dim())),
        ("llama.attention.value_length".into(), u(shape.head_dim())),
        ("llama.vocab_size".into(), u(shape.n_vocab)),
        ("llama.rope.dimension_count".into(), u(shape.head_dim())),
        ("tokenizer.ggml.model".into(), "gpt2".into()),
        ("tokenizer.ggml.pre".into(), "llama-bpe".into()),
        ("tokenizer.ggml.tokens".into(), v.tokens.into()),
        ("tokenizer.ggml.token_type".into(), v.types.into()),
        ("tokenizer.ggml.merges".into(), v.merges.into()),
        ("tokenizer.ggml.bos_token_id".into(), v.bos.into()),
        ("tokenizer.ggml.eos_token_id".into(), v.eos.into()),
        ("tokenizer.ggml.add_bos_token".into(), true.into()),
        ("tokenizer.chat_template".into(), CHAT_TEMPLATE.into()),
    ];
    write_model(metadata, plans, out, progress)
}

/// The chat template of the generated vocabulary: Llama 3's turn markers.
const CHAT_TEMPLATE: &str =
    "{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n\
    {{ m['content'] | trim }}<|eot_id|>{% endfor %}{% if add_generation_prompt %}\
    <|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}";

/// The metadata and tensor plans of a random copy of `template`: every key and value kept
/// (`general.file_type` set for `dtype`), the same tensors in the same order, 1-D tensors F32
/// norms, `token_embd` Q8_0 when `dtype` is quantized, the other matrices `dtype`.
fn copy_layout(template: &GgufFile, dtype: DType) -> Result<(Metadata, Vec<Plan>)> {
    LlamaConfig::from_gguf(template)?;
    let metadata = template
        .metadata
        .iter()
        .map(|(k, v)| {
            let v = if k == "general.file_type" {
                file_type(dtype).into()
            } else {
                v.clone()
            };
            (k.clone(), v)
        })
        .collect();
    let plans = template
        .tensors
        .iter()
        .map(|t| {
            let name = t.name.clone();
            match t.shape() {
                [n] => Ok(Plan::norm(name, *n)),
                [ne0, ne1] => {
                    let embd = name == "token_embd.weight" && dtype.is_quantized();
                    Plan::matrix(name, if embd { DType::Q8_0 } else { dtype }, *ne0, *ne1)
                }
                other => Err(Error::Model(format!(
                    "{}: tensor '{name}' has shape {other:?}; only 1-D and 2-D tensors are copied",
                    template.path()
                ))),
            }
        })
        .collect::<Result<_>>()?;
    Ok((metadata, plans))
}

/// Bytes of tensor data written so far, reported as they grow.
struct Progress<'p> {
    done: u64,
    total: u64,
    report: &'p mut dyn FnMut(u64, u64),
}

impl Progress<'_> {
    fn advance(&mut self, bytes: usize) {
        self.done += bytes as u64;
        (self.report)(self.done, self.total);
    }
}

/// Writes a model whose tensors are made as the file is written.
fn write_model(
    metadata: Metadata,
    plans: Vec<Plan>,
    out: &Path,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<()> {
    let mut total = 0u64;
    for p in &plans {
        let rows: u64 = p.ne[1..].iter().product();
        total += p.dtype.row_size(p.ne[0] as usize)? as u64 * rows;
    }
    let progress = RefCell::new(Progress {
        done: 0,
        total,
        report: progress,
    });
    let mut w = GgufWriter::new();
    for (k, v) in metadata {
        w.add_metadata(k, v)?;
    }
    for (i, p) in plans.iter().enumerate() {
        let seed = Rng::new(SEED ^ i as u64).next_u64();
        let progress = &progress;
        w.add_tensor_with(p.name.clone(), p.dtype, &p.ne, move |w| {
            produce(p, seed, w, &mut progress.borrow_mut())
        })?;
    }
    w.write_file(out)
}

/// Writes one tensor's random rows, a wave of chunks at a time, each wave made on every core.
fn produce(p: &Plan, seed: u64, w: &mut dyn Write, progress: &mut Progress) -> Result<()> {
    let row_len = p.ne[0] as usize;
    let n_rows: usize = p.ne[1..].iter().product::<u64>() as usize;
    let row_bytes = p.dtype.row_size(row_len)?;
    let rows_per_chunk = (CHUNK_VALUES / row_len.max(1)).max(1);
    let n_chunks = n_rows.div_ceil(rows_per_chunk);
    let wave = rayon::current_num_threads() * 4;
    let mut c0 = 0;
    while c0 < n_chunks {
        let c1 = (c0 + wave).min(n_chunks);
        let parts = (c0..c1)
            .into_par_iter()
            .map(|c| {
                let rows = rows_per_chunk.min(n_rows - c * rows_per_chunk);
                let mut rng = Rng::new(seed ^ (c as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15));
                let mut out = vec![0u8; rows * row_bytes];
                let mut vals = vec![0f32; row_len];
                for dst in out.chunks_exact_mut(row_bytes) {
                    for v in vals.iter_mut() {
                        *v = p.mean + p.std * rng.normal();
                    }
                    quantize_row(p.dtype, &vals, dst)?;
                }
                Ok(out)
            })
            .collect::<Result<Vec<Vec<u8>>>>()?;
        for part in &parts {
            w.write_all(part)
                .map_err(|e| Error::io(format!("writing tensor '{}'", p.name), e))?;
            progress.advance(part.len());
        }
        c0 = c1;
    }
    Ok(())
}

/// Writes the first `layers` layers of the Llama-family model `input` to `out`: the tensors of
/// later blocks (`blk.N.*`, N >= `layers`) are dropped and `{arch}.block_count` set to
/// `layers`; every other key and tensor is kept as it is, its data copied from the mapping.
/// `progress(done, total)` reports bytes of tensor data written.
///
/// Errors when `layers` is 0 or more than the model has, or when `input` is not a GGUF file
/// of an architecture the runner knows.
pub fn trim(
    input: &Path,
    layers: usize,
    out: &Path,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<()> {
    let f = GgufFile::open(input)?;
    let cfg = LlamaConfig::from_gguf(&f)?;
    if layers == 0 || layers > cfg.n_layer {
        return Err(Error::Invalid(format!(
            "cannot keep {layers} layers of {}: it has {} (keep 1 to {})",
            input.display(),
            cfg.n_layer,
            cfg.n_layer
        )));
    }
    let kept: Vec<_> = f
        .tensors
        .iter()
        .filter(|t| layer_of(&t.name).is_none_or(|l| l < layers))
        .collect();
    let total = kept.iter().map(|t| t.size).sum();
    let progress = RefCell::new(Progress {
        done: 0,
        total,
        report: progress,
    });
    let key = format!("{}.block_count", cfg.arch);
    let mut w = GgufWriter::new();
    for (k, v) in &f.metadata {
        let v = if *k == key {
            same_width(v, layers)
        } else {
            v.clone()
        };
        w.add_metadata(k.clone(), v)?;
    }
    for t in kept {
        let data = f.tensor_data(t);
        let progress = &progress;
        w.add_tensor_with(t.name.clone(), t.dtype, t.shape(), move |w| {
            for piece in data.chunks(8 << 20) {
                w.write_all(piece)
                    .map_err(|e| Error::io(format!("writing tensor '{}'", t.name), e))?;
                progress.borrow_mut().advance(piece.len());
            }
            Ok(())
        })?;
    }
    w.write_file(out)
}

/// The block a tensor name belongs to (`blk.N.…`).
fn layer_of(name: &str) -> Option<usize> {
    name.strip_prefix("blk.")?.split_once('.')?.0.parse().ok()
}

/// `n` as an integer value of the same type as `v` where it is a wide one, else u32.
fn same_width(v: &GgufValue, n: usize) -> GgufValue {
    match v {
        GgufValue::U64(_) => GgufValue::U64(n as u64),
        GgufValue::I64(_) => GgufValue::I64(n as i64),
        GgufValue::I32(_) => GgufValue::I32(n as i32),
        _ => GgufValue::U32(n as u32),
    }
}

/// SplitMix64: a small, fast, seedable generator, plenty for random weights.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A uniform integer below `n` (`n` < 2^32).
    fn below(&mut self, n: usize) -> usize {
        (((self.next_u64() >> 32) * n as u64) >> 32) as usize
    }

    /// A roughly standard normal value: the sum of four uniform 16-bit values, centred and
    /// scaled to unit variance (Irwin-Hall; bounded by ±3.46).
    fn normal(&mut self) -> f32 {
        let r = self.next_u64();
        let sum = (r & 0xFFFF) + ((r >> 16) & 0xFFFF) + ((r >> 32) & 0xFFFF) + (r >> 48);
        // Four uniforms on 0..65536 have mean 4 * 32767.5 and variance 4 * (65536^2 - 1) / 12.
        (sum as f32 - 131_070.0) * (1.0 / 37_837.2)
    }
}
