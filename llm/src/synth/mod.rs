//! Synthetic and trimmed models, so that every backend can be checked and benchmarked where the
//! real models cannot go (a machine that takes small uploads only, a benchmark of a shape nobody
//! has downloaded), and so that every architecture can be checked against llama.cpp on small
//! random-weight files.
//!
//! [`synth`] writes a GGUF with random weights shaped like a known model ([`Like`]):
//! [`Like::Smollm2_135m`] copies the test model's layout exactly (every metadata key and value,
//! its tokenizer included, and its tensor list and order); the others have a generated
//! byte-level BPE vocabulary and the tensors and metadata llama.cpp reads for their
//! architecture ([`Arch`]: Llama with or without Llama 3.1 rope factors, Qwen 2, Qwen 3,
//! Gemma 2, Gemma 3, Phi 3), in a real model's shape or a small one for tests. [`synth_arch`]
//! takes any [`ArchShape`], [`synth_shape`] any Llama [`Shape`]. [`trim`] keeps the first
//! layers of a real model.
//!
//! Weights are drawn from a seeded generator (the same file every time). The Llama benchmark
//! shapes ([`Like::Llama1b`] ... and [`synth_shape`]) have matrices of standard deviation 0.02
//! and norms around 1; the other generated shapes are scaled so that a random model picks its
//! next token by a clear margin (see `arch::Weights::Scaled`). Values are generated, quantized
//! and written a few rows at a time, on every core, while the file is written, so an 8B-shape
//! model takes little memory. Files are written to a temporary name and renamed into place when
//! complete.

mod arch;
mod vocab;

use std::cell::RefCell;
use std::io::Write;
use std::path::Path;

use rayon::prelude::*;
use tessera_core::gguf::{GgufFile, GgufValue, GgufWriter};
use tessera_core::quant::{can_quantize, fit_random_block, quantize_row};
use tessera_core::{DType, Error, Result};

use crate::config::ModelConfig;
use crate::fetch;

pub use arch::{Arch, ArchShape, Experts, RopeScaling, SynthType, SYNTH_TYPES};
pub use vocab::MIN_VOCAB;

use arch::{Place, Role, Weights};

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
    /// Llama 3 70B's shape ([`Shape::LLAMA_70B`]), as [`Like::Llama8b`] (40 GB in Q4_0).
    Llama70b,
    /// [`ArchShape::LLAMA3_SMALL`]: a small Llama with Llama 3.1 rope factors.
    Llama3Small,
    /// [`ArchShape::LLAMA31_8B`]: Llama 3.1 8B, rope factors included.
    Llama31_8b,
    /// [`ArchShape::QWEN2_SMALL`].
    Qwen2Small,
    /// [`ArchShape::QWEN2_7B`].
    Qwen2_7b,
    /// [`ArchShape::QWEN3_SMALL`].
    Qwen3Small,
    /// [`ArchShape::QWEN3_8B`].
    Qwen3_8b,
    /// [`ArchShape::GEMMA2_SMALL`].
    Gemma2Small,
    /// [`ArchShape::GEMMA2_9B`].
    Gemma2_9b,
    /// [`ArchShape::GEMMA3_SMALL`].
    Gemma3Small,
    /// [`ArchShape::GEMMA3_4B`].
    Gemma3_4b,
    /// [`ArchShape::PHI3_SMALL`].
    Phi3Small,
    /// [`ArchShape::PHI3_MINI`].
    Phi3Mini,
    /// [`ArchShape::QUANT_SMALL`]: a small Llama whose rows are whole 256-value blocks, for
    /// the per-quant-type references.
    QuantSmall,
    /// [`ArchShape::MIXTRAL_SMALL`].
    MixtralSmall,
    /// [`ArchShape::MIXTRAL_8X7B`].
    Mixtral8x7b,
    /// [`ArchShape::QWEN2MOE_SMALL`].
    Qwen2MoeSmall,
    /// [`ArchShape::QWEN3MOE_SMALL`].
    Qwen3MoeSmall,
    /// [`ArchShape::QWEN3_30B_A3B`].
    Qwen3_30bA3b,
    /// [`ArchShape::OLMOE_SMALL`].
    OlmoeSmall,
    /// [`ArchShape::GPT_OSS_SMALL`].
    GptOssSmall,
    /// [`ArchShape::GPT_OSS_20B`].
    GptOss20b,
}

impl Like {
    /// Every model, in the order of [`Like::NAMES`].
    pub const ALL: [Like; 25] = [
        Like::Smollm2_135m,
        Like::Llama1b,
        Like::Llama8b,
        Like::Llama70b,
        Like::Llama3Small,
        Like::Llama31_8b,
        Like::Qwen2Small,
        Like::Qwen2_7b,
        Like::Qwen3Small,
        Like::Qwen3_8b,
        Like::Gemma2Small,
        Like::Gemma2_9b,
        Like::Gemma3Small,
        Like::Gemma3_4b,
        Like::Phi3Small,
        Like::Phi3Mini,
        Like::QuantSmall,
        Like::MixtralSmall,
        Like::Mixtral8x7b,
        Like::Qwen2MoeSmall,
        Like::Qwen3MoeSmall,
        Like::Qwen3_30bA3b,
        Like::OlmoeSmall,
        Like::GptOssSmall,
        Like::GptOss20b,
    ];

    /// The names of [`Like::ALL`], as the command line takes them.
    pub const NAMES: [&'static str; 25] = [
        "smollm2-135m",
        "llama-1b",
        "llama-8b",
        "llama-70b",
        "llama3-small",
        "llama3.1-8b",
        "qwen2-small",
        "qwen2-7b",
        "qwen3-small",
        "qwen3-8b",
        "gemma2-small",
        "gemma2-9b",
        "gemma3-small",
        "gemma3-4b",
        "phi3-small",
        "phi3-mini",
        "quant-small",
        "mixtral-small",
        "mixtral-8x7b",
        "qwen2moe-small",
        "qwen3moe-small",
        "qwen3-30b-a3b",
        "olmoe-small",
        "gpt-oss-small",
        "gpt-oss-20b",
    ];

    /// The small models, each of its own architecture (or rope scaling), for the tests that
    /// compare every architecture with llama.cpp.
    pub const SMALL: [Like; 11] = [
        Like::Llama3Small,
        Like::Qwen2Small,
        Like::Qwen3Small,
        Like::Gemma2Small,
        Like::Gemma3Small,
        Like::Phi3Small,
        Like::MixtralSmall,
        Like::Qwen2MoeSmall,
        Like::Qwen3MoeSmall,
        Like::OlmoeSmall,
        Like::GptOssSmall,
    ];

    /// The model's name (`smollm2-135m`, `llama-1b`, ..., `phi3-mini`).
    pub fn name(self) -> &'static str {
        let i = Like::ALL
            .iter()
            .position(|&l| l == self)
            .expect("every model is listed");
        Like::NAMES[i]
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

    /// The generated shape of this model: `None` for [`Like::Smollm2_135m`] (a copy of a real
    /// file's layout), and for the Llama benchmark shapes their [`Shape`] as an [`ArchShape`].
    pub fn shape(self) -> Option<ArchShape> {
        Some(match self {
            Like::Smollm2_135m => return None,
            Like::Llama1b => Shape::LLAMA_1B.arch_shape(),
            Like::Llama8b => Shape::LLAMA_8B.arch_shape(),
            Like::Llama70b => Shape::LLAMA_70B.arch_shape(),
            Like::Llama3Small => ArchShape::LLAMA3_SMALL,
            Like::Llama31_8b => ArchShape::LLAMA31_8B,
            Like::Qwen2Small => ArchShape::QWEN2_SMALL,
            Like::Qwen2_7b => ArchShape::QWEN2_7B,
            Like::Qwen3Small => ArchShape::QWEN3_SMALL,
            Like::Qwen3_8b => ArchShape::QWEN3_8B,
            Like::Gemma2Small => ArchShape::GEMMA2_SMALL,
            Like::Gemma2_9b => ArchShape::GEMMA2_9B,
            Like::Gemma3Small => ArchShape::GEMMA3_SMALL,
            Like::Gemma3_4b => ArchShape::GEMMA3_4B,
            Like::Phi3Small => ArchShape::PHI3_SMALL,
            Like::Phi3Mini => ArchShape::PHI3_MINI,
            Like::QuantSmall => ArchShape::QUANT_SMALL,
            Like::MixtralSmall => ArchShape::MIXTRAL_SMALL,
            Like::Mixtral8x7b => ArchShape::MIXTRAL_8X7B,
            Like::Qwen2MoeSmall => ArchShape::QWEN2MOE_SMALL,
            Like::Qwen3MoeSmall => ArchShape::QWEN3MOE_SMALL,
            Like::Qwen3_30bA3b => ArchShape::QWEN3_30B_A3B,
            Like::OlmoeSmall => ArchShape::OLMOE_SMALL,
            Like::GptOssSmall => ArchShape::GPT_OSS_SMALL,
            Like::GptOss20b => ArchShape::GPT_OSS_20B,
        })
    }

    /// Whether the values are the benchmark shapes' flat ones (see [`synth`]).
    fn weights(self) -> Weights {
        match self {
            Like::Smollm2_135m | Like::Llama1b | Like::Llama8b | Like::Llama70b => Weights::Flat,
            _ => Weights::Scaled,
        }
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

    /// Llama 3 70B: width 8192, 80 layers, feed-forward 28672, 64 query and 8 KV heads of
    /// 128, vocabulary 128256, rope base 500000, separate output.
    pub const LLAMA_70B: Shape = Shape {
        n_embd: 8192,
        n_layer: 80,
        n_ff: 28_672,
        n_head: 64,
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

    /// The same model as an [`ArchShape`] (a Llama without rope scaling, RMS epsilon 1e-5).
    pub fn arch_shape(&self) -> ArchShape {
        ArchShape {
            arch: Arch::Llama,
            n_embd: self.n_embd,
            n_layer: self.n_layer,
            n_ff: self.n_ff,
            n_head: self.n_head,
            n_head_kv: self.n_head_kv,
            head_dim: self.head_dim(),
            n_vocab: self.n_vocab,
            n_ctx_train: self.n_ctx_train,
            rope_base: self.rope_base,
            rope_scaling: RopeScaling::None,
            rms_eps: 1e-5,
            sliding_window: 0,
            attn_softcap: 0.0,
            final_softcap: 0.0,
            tied_output: self.tied_output,
            experts: Experts::NONE,
        }
    }

    /// Checks that the heads divide the width (the rest is [`ArchShape`]'s check).
    fn check(&self) -> Result<()> {
        if self.n_head == 0 || !self.n_embd.is_multiple_of(self.n_head) {
            return Err(Error::Invalid(format!(
                "synthetic shape {self:?}: the heads must divide the width"
            )));
        }
        Ok(())
    }
}

/// Metadata key/value pairs, in file order.
type Metadata = Vec<(String, GgufValue)>;

/// How one tensor is made: its name, type and shape, and its values.
struct Plan {
    name: String,
    dtype: DType,
    ne: Vec<u64>,
    values: Values,
}

/// A tensor's values.
enum Values {
    /// Drawn from the seeded generator with this mean and standard deviation.
    Random { mean: f32, std: f32 },
    /// Given (a small 1-D tensor such as rope factors, F32).
    Given(Vec<f32>),
}

impl Plan {
    /// A tensor of random values.
    fn random(name: String, dtype: DType, ne: Vec<u64>, mean: f32, std: f32) -> Plan {
        Plan {
            name,
            dtype,
            ne,
            values: Values::Random { mean, std },
        }
    }

    /// A 1-D F32 tensor of these values.
    fn values(name: String, values: Vec<f32>) -> Plan {
        Plan {
            name,
            dtype: DType::F32,
            ne: vec![values.len() as u64],
            values: Values::Given(values),
        }
    }
}

/// Writes a random-weight model shaped like `like`, its matrices of `ty`, to `out`;
/// `progress(done, total)` reports bytes of tensor data written.
///
/// [`Like::Smollm2_135m`] reads the test model ([`fetch::test_model`], fetched when it is not
/// cached). The file is deterministic: the same arguments give the same bytes.
pub fn synth(
    like: Like,
    ty: SynthType,
    out: &Path,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<()> {
    ty.check()?;
    let (metadata, plans) = match like.shape() {
        None => {
            let template = GgufFile::open(fetch::test_model(&mut |_| {})?)?;
            copy_layout(&template, ty)?
        }
        Some(shape) => arch::layout(&shape, ty, like.weights())?,
    };
    write_model(metadata, plans, out, progress)
}

/// The tensors [`synth`] writes for `like` in `ty`, in file order: name, type and shape
/// (`ne`, fastest dimension first), without writing anything; [`Like::Smollm2_135m`] reads the
/// test model's layout as [`synth`] does.
pub fn tensors(like: Like, ty: SynthType) -> Result<Vec<(String, DType, Vec<u64>)>> {
    ty.check()?;
    let plans = match like.shape() {
        None => copy_layout(&GgufFile::open(fetch::test_model(&mut |_| {})?)?, ty)?.1,
        Some(shape) => arch::layout(&shape, ty, like.weights())?.1,
    };
    Ok(plans.into_iter().map(|p| (p.name, p.dtype, p.ne)).collect())
}

/// Writes a random-weight model of any [`ArchShape`], with a generated byte-level BPE
/// vocabulary (256 byte tokens, merges, filler tokens, and Llama 3's control tokens at the end:
/// `<|begin_of_text|>` is BOS, `<|end_of_text|>` EOS), its values scaled as the small test
/// models' are.
pub fn synth_arch(
    shape: &ArchShape,
    ty: SynthType,
    out: &Path,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<()> {
    let (metadata, plans) = arch::layout(shape, ty, Weights::Scaled)?;
    write_model(metadata, plans, out, progress)
}

/// Writes a random-weight Llama model of any [`Shape`] with a generated byte-level BPE
/// vocabulary (as [`synth_arch`]); every matrix, the token embedding and the output included,
/// is of `dtype` (one of [`SYNTH_TYPES`]); values as the Llama benchmark shapes'.
pub fn synth_shape(
    shape: &Shape,
    dtype: DType,
    out: &Path,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<()> {
    let ty = SynthType::All(dtype);
    ty.check()?;
    shape.check()?;
    let (metadata, plans) = arch::layout(&shape.arch_shape(), ty, Weights::Flat)?;
    write_model(metadata, plans, out, progress)
}

/// The metadata and tensor plans of a random copy of `template`: every key and value kept
/// (`general.file_type` set for `ty`), the same tensors in the same order, 1-D tensors F32
/// norms; for [`SynthType::All`] of a quantized type `token_embd` Q8_0 and the other matrices
/// that type, for the Q4_K_M mix each matrix as llama.cpp's rule puts it.
fn copy_layout(template: &GgufFile, ty: SynthType) -> Result<(Metadata, Vec<Plan>)> {
    let cfg = ModelConfig::from_gguf(template)?;
    let metadata = template
        .metadata
        .iter()
        .map(|(k, v)| {
            let v = if k == "general.file_type" {
                ty.file_type().into()
            } else {
                v.clone()
            };
            (k.clone(), v)
        })
        .collect();
    let tied = template.tensor("output.weight").is_err();
    let plans = template
        .tensors
        .iter()
        .map(|t| {
            let name = t.name.clone();
            match t.shape() {
                [n] => Ok(Plan::random(name, DType::F32, vec![*n], 1.0, 0.02)),
                [ne0, ne1] => {
                    let role = Role::of(&name).ok_or_else(|| {
                        Error::Model(format!(
                            "{}: tensor '{name}' is a matrix of no known role",
                            template.path()
                        ))
                    })?;
                    let dtype = match ty {
                        SynthType::All(t) if role == Role::TokenEmbd && t.is_quantized() => {
                            DType::Q8_0
                        }
                        _ => {
                            let layer = layer_of(&name).unwrap_or(cfg.n_layer);
                            ty.matrix_type(
                                &name,
                                role,
                                &Place {
                                    layer,
                                    n_layer: cfg.n_layer,
                                    tied,
                                    big_attn_v: false,
                                    gqa: cfg.n_head / cfg.n_head_kv.max(1),
                                },
                                *ne0,
                            )?
                        }
                    };
                    Ok(Plan::random(name, dtype, vec![*ne0, *ne1], 0.0, 0.02))
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
    let (mean, std) = match &p.values {
        Values::Random { mean, std } => (*mean, *std),
        Values::Given(v) => {
            let mut bytes = vec![0u8; p.dtype.row_size(v.len())?];
            quantize_row(p.dtype, v, &mut bytes)?;
            w.write_all(&bytes)
                .map_err(|e| Error::io(format!("writing tensor '{}'", p.name), e))?;
            progress.advance(bytes.len());
            return Ok(());
        }
    };
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
                    if !can_quantize(p.dtype) {
                        // A lattice i-quant tessera does not write (IQ1_S, IQ2_XXS, IQ2_XS): random blocks whose
                        // values have the RMS std.
                        for b in dst.chunks_exact_mut(p.dtype.type_size()) {
                            for c in b.chunks_mut(8) {
                                let r = rng.next_u64().to_le_bytes();
                                c.copy_from_slice(&r[..c.len()]);
                            }
                            fit_random_block(p.dtype, b, std)?;
                        }
                        continue;
                    }
                    for v in vals.iter_mut() {
                        *v = mean + std * rng.normal();
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
    let cfg = ModelConfig::from_gguf(&f)?;
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
