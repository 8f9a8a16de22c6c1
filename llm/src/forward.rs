//! The forward pass as a tessera graph: one block builder for every architecture, computing the
//! features its [`Block`](crate::config::Block) and [`LayerConfig`](crate::config::LayerConfig)s
//! ask for. One graph is built per step shape (tokens in the batch, KV cells attended, which
//! logits are wanted) and reused while the shape stays the same.
//!
//! The order of ops within a block is the one the backends fuse (RMS norm then its weight,
//! Q/K/V projections side by side, rope then the cache stores, the gated feed-forward as gate
//! and up projections then the GLU), whatever the architecture adds around it.

use std::collections::HashSet;

use tessera_core::{DType, Graph, Result, TensorId, UnaryOp};

use crate::config::{ModelConfig, Moe, RopeFactors, Routing};
use crate::kv_cache::KvCache;
use crate::weights::Weights;

/// The shape of one step.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct StepShape {
    /// Tokens in the batch.
    pub n_tokens: usize,
    /// KV cells the global layers attend (a multiple of the padding, at most their cache).
    pub n_kv: usize,
    /// KV cells the sliding-window layers attend (0 when the model has none).
    pub n_kv_window: usize,
    /// Logits for every token (true) or only the last.
    pub all_logits: bool,
    /// Attention groups: the tokens are this many groups of `n_tokens / n_groups` consecutive
    /// tokens (a divisor of `n_tokens`; 1: one group), each group a batch of its own in
    /// flash_attn_ext (q `[hd, n_tokens / n_groups, heads, n_groups]`, the mask `[n_kv,
    /// n_tokens / n_groups, 1, n_groups]`). A batched step whose sequences bring equally many
    /// tokens (one each, decoding) gives each sequence its group: the kernels then give its
    /// query rows blocks of their own, which skip the key tiles the mask hides from the whole
    /// group (the other sequences' pages), instead of blocks that mix every sequence's rows.
    pub n_groups: usize,
}

/// The inputs of the KV cells of one kind of layer.
#[derive(Clone, Copy, Debug)]
pub struct KvInputs {
    /// I64 `[n_tokens]`: KV cache rows written.
    pub rows: TensorId,
    /// F16 `[n_kv, n_tokens]` (`[n_kv, n_tokens / n_groups, 1, n_groups]` by attention
    /// group, [`StepShape::n_groups`]): 0 where a token may attend a cell, -inf elsewhere.
    pub mask: TensorId,
}

/// The graph's inputs and output.
#[derive(Clone, Copy, Debug)]
pub struct StepIo {
    /// I32 `[n_tokens]`: token ids.
    pub tokens: TensorId,
    /// I32 `[n_tokens]`: positions.
    pub pos: TensorId,
    /// Rows and mask of the global layers.
    pub global: KvInputs,
    /// Rows and mask of the sliding-window layers (their cache is a ring: see
    /// [`KvCache::window_cells`]).
    pub window: Option<KvInputs>,
    /// F32 `[n_vocab, n_out]`: the logits (`[n_embd, n_tokens]` hidden states with
    /// [`Head::Hidden`]).
    pub logits: TensorId,
    /// I32 `[n]`: the rows whose logits [`Head::LogitsOf`] computes.
    pub out_ids: Option<TensorId>,
}

/// What a step's graph outputs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Head {
    /// The logits of every token or of the last, as [`StepShape::all_logits`] says.
    #[default]
    Logits,
    /// The logits of `n` tokens picked by [`StepIo::out_ids`]: the last token of each sequence
    /// of a batch, so the output head runs once per sequence, not once per token.
    LogitsOf(usize),
    /// The hidden states after the output norm, every token (what embeddings pool).
    Hidden,
}

/// What the graph of a step is built from.
pub struct StepSource<'a> {
    /// The model's config.
    pub cfg: &'a ModelConfig,
    /// Its weights.
    pub weights: &'a Weights,
    /// The context's cache.
    pub kv: &'a KvCache,
    /// Positions the context holds (picks LongRoPE's short or long factors).
    pub n_ctx: usize,
}

impl StepSource<'_> {
    /// The rope factor tensor the layers use, if any.
    fn rope_factors(&self) -> Option<String> {
        match &self.cfg.rope.factors {
            RopeFactors::None => None,
            RopeFactors::Tensor(name) => Some(name.clone()),
            // llama.cpp's rule: the long factors once the context exceeds the original one.
            RopeFactors::LongRope => Some(
                if self.n_ctx > self.cfg.rope.n_ctx_orig {
                    "rope_factors_long.weight"
                } else {
                    "rope_factors_short.weight"
                }
                .into(),
            ),
        }
    }
}

/// Builds a graph while recording which weights it reads.
struct Builder<'a> {
    g: Graph,
    src: &'a StepSource<'a>,
    used: HashSet<String>,
}

impl Builder<'_> {
    /// Weight `name`, checked to have shape `ne`.
    fn w(&mut self, name: &str, ne: &[usize]) -> Result<TensorId> {
        let t = self.src.weights.expect(name, ne)?;
        self.used.insert(name.to_string());
        self.g
            .weight(name, t.dtype, &t.ne, t.buffer.clone(), t.offset)
    }

    /// Layer `l`'s weight `blk.l.name.weight`.
    fn lw(&mut self, l: usize, name: &str, ne: &[usize]) -> Result<TensorId> {
        self.w(&format!("blk.{l}.{name}.weight"), ne)
    }

    /// RMS norm of the rows of `x` times weight `name` (of the rows' width).
    fn norm(&mut self, x: TensorId, name: &str) -> Result<TensorId> {
        let width = self.g.get(x).ne[0];
        let weight = self.w(name, &[width])?;
        let cur = self.g.rms_norm(x, self.src.cfg.rms_eps)?;
        self.g.mul(cur, weight)
    }

    /// `x` times `factor` when there is one.
    fn scale(&mut self, x: TensorId, factor: Option<f32>) -> Result<TensorId> {
        match factor {
            Some(f) => self.g.scale(x, f),
            None => Ok(x),
        }
    }

    /// `c * tanh(x / c)` when a cap `c` is set.
    fn softcap(&mut self, x: TensorId, cap: Option<f32>) -> Result<TensorId> {
        let Some(c) = cap else { return Ok(x) };
        let x = self.g.scale(x, 1.0 / c)?;
        let x = self.g.unary(x, UnaryOp::Tanh)?;
        self.g.scale(x, c)
    }

    /// The attention of layer `l` over the normed input `cur` [n_embd, n]: the projected
    /// output [n_embd, n], before any post-norm.
    fn attention(
        &mut self,
        l: usize,
        cur: TensorId,
        io: &StepIo,
        factors: Option<TensorId>,
        shape: StepShape,
    ) -> Result<TensorId> {
        let cfg = self.src.cfg;
        let b = &cfg.block;
        let layer = cfg.layers[l];
        let n = shape.n_tokens;
        let (d, hd, nh, nkv) = (cfg.n_embd, cfg.head_dim, cfg.n_head, cfg.n_head_kv);
        let (n_embd_q, n_embd_kv) = (cfg.n_embd_q(), cfg.n_embd_kv());
        let wq = self.lw(l, "attn_q", &[d, n_embd_q])?;
        let wk = self.lw(l, "attn_k", &[d, n_embd_kv])?;
        let wv = self.lw(l, "attn_v", &[d, n_embd_kv])?;
        let mut q = self.g.mul_mat(wq, cur)?;
        let mut k = self.g.mul_mat(wk, cur)?;
        let mut v = self.g.mul_mat(wv, cur)?;
        if b.qkv_bias {
            let bq = self.w(&format!("blk.{l}.attn_q.bias"), &[n_embd_q])?;
            let bk = self.w(&format!("blk.{l}.attn_k.bias"), &[n_embd_kv])?;
            let bv = self.w(&format!("blk.{l}.attn_v.bias"), &[n_embd_kv])?;
            q = self.g.add(q, bq)?;
            k = self.g.add(k, bk)?;
            v = self.g.add(v, bv)?;
        }
        if b.qk_norm_whole {
            q = self.norm(q, &format!("blk.{l}.attn_q_norm.weight"))?;
            k = self.norm(k, &format!("blk.{l}.attn_k_norm.weight"))?;
        }
        let mut q = self.g.reshape(q, &[hd, nh, n])?;
        let mut k = self.g.reshape(k, &[hd, nkv, n])?;
        if b.qk_norm {
            q = self.norm(q, &format!("blk.{l}.attn_q_norm.weight"))?;
            k = self.norm(k, &format!("blk.{l}.attn_k_norm.weight"))?;
        }
        let rope = cfg.rope.params(layer.rope_base, layer.rope_freq_scale);
        let q = self.g.rope_ext(q, io.pos, factors, rope)?;
        let k = self.g.rope_ext(k, io.pos, factors, rope)?;
        let groups = shape.n_groups.max(1);
        let q = if groups > 1 {
            self.g.reshape(q, &[hd, nh, n / groups, groups])?
        } else {
            q
        };
        let k = self.g.reshape(k, &[n_embd_kv, n])?;

        let (inputs, n_kv) = match (layer.window, io.window) {
            (Some(_), Some(w)) => (w, shape.n_kv_window),
            _ => (io.global, shape.n_kv),
        };
        let mask = inputs.mask;
        let kv = self.src.kv;
        let ts = kv.dtype().type_size();
        let kc = kv.tensor(&mut self.g, l, false, n_embd_kv)?;
        let vc = kv.tensor(&mut self.g, l, true, n_embd_kv)?;
        let kc = self.g.set_rows(kc, k, inputs.rows)?;
        let vc = self.g.set_rows(vc, v, inputs.rows)?;
        let strides = [hd * ts, n_embd_kv * ts];
        let kview = self.g.view(kc, &[hd, nkv, n_kv], &strides, 0)?;
        let vview = self.g.view(vc, &[hd, nkv, n_kv], &strides, 0)?;
        let kview = self.g.permute(kview, [0, 2, 1, 3])?;
        let vview = self.g.permute(vview, [0, 2, 1, 3])?;
        let q = self.g.permute(q, [0, 2, 1, 3])?;
        let att = if b.attn_sinks {
            let sinks = self.lw(l, "attn_sinks", &[nh])?;
            let (q, k, v, m) = (q, kview, vview, Some(mask));
            let (scale, cap) = (b.attn_scale, b.attn_softcap);
            self.g
                .flash_attn_ext_sinks(q, k, v, m, sinks, scale, 0.0, cap)?
        } else {
            let (q, k, v, m) = (q, kview, vview, Some(mask));
            self.g
                .flash_attn_ext(q, k, v, m, b.attn_scale, 0.0, b.attn_softcap)?
        };
        let att = self.g.reshape(att, &[n_embd_q, n])?;
        let wo = self.lw(l, "attn_output", &[n_embd_q, d])?;
        let out = self.g.mul_mat(wo, att)?;
        if !b.attn_out_bias {
            return Ok(out);
        }
        let bo = self.w(&format!("blk.{l}.attn_output.bias"), &[d])?;
        self.g.add(out, bo)
    }

    /// The gated feed-forward of layer `l` over the normed input `cur`.
    fn ffn(&mut self, l: usize, cur: TensorId) -> Result<TensorId> {
        let ff = self.src.cfg.n_ff;
        self.gated_ffn(l, cur, ["ffn_gate", "ffn_up", "ffn_down"], ff)
    }

    /// A gated feed-forward of width `ff` from layer `l`'s gate, up and down weights `names`.
    fn gated_ffn(
        &mut self,
        l: usize,
        cur: TensorId,
        names: [&str; 3],
        ff: usize,
    ) -> Result<TensorId> {
        let cfg = self.src.cfg;
        let d = cfg.n_embd;
        let wg = self.lw(l, names[0], &[d, ff])?;
        let wu = self.lw(l, names[1], &[d, ff])?;
        let wd = self.lw(l, names[2], &[ff, d])?;
        let gate = self.g.mul_mat(wg, cur)?;
        let up = self.g.mul_mat(wu, cur)?;
        let act = self.g.glu_split(gate, up, cfg.block.ffn_act)?;
        self.g.mul_mat(wd, act)
    }

    /// Layer `l`'s bias `blk.l.name.bias` of shape `ne`.
    fn lb(&mut self, l: usize, name: &str, ne: &[usize]) -> Result<TensorId> {
        self.w(&format!("blk.{l}.{name}.bias"), ne)
    }

    /// `x` [n, n_used, tokens] plus the bias row of each slot's expert (`add_id`) when the
    /// experts have biases.
    fn expert_bias(
        &mut self,
        l: usize,
        x: TensorId,
        name: &str,
        moe: &Moe,
        selected: TensorId,
    ) -> Result<TensorId> {
        if !moe.biases {
            return Ok(x);
        }
        let rows = self.g.get(x).ne[0];
        let bias = self.lb(l, name, &[rows, moe.n_expert])?;
        self.g.add_id(x, bias, selected)
    }

    /// The mixture-of-experts feed-forward of layer `l` over the normed input `cur` [d, n]:
    /// the router (with its bias where there is one) picks the `n_used` experts of each token
    /// as [`Routing`] says (soft-max probabilities renormalized where the architecture asks,
    /// or a soft-max over the selected logits), each selected expert's gated FFN runs through
    /// one `mul_mat_id` per projection (plus each expert's biases), the outputs are weighted
    /// and summed; plus the gated shared expert where there is one.
    fn moe_ffn(&mut self, l: usize, cur: TensorId, moe: &Moe) -> Result<TensorId> {
        let cfg = self.src.cfg;
        let (d, n) = (cfg.n_embd, self.g.get(cur).ne[1]);
        let (ne, nu, ff) = (moe.n_expert, moe.n_used, moe.n_ff_exp);
        let router = self.lw(l, "ffn_gate_inp", &[d, ne])?;
        let mut logits = self.g.mul_mat(router, cur)?;
        if moe.biases {
            let bias = self.lb(l, "ffn_gate_inp", &[ne])?;
            logits = self.g.add(logits, bias)?;
        }
        let scores = match moe.routing {
            Routing::SoftMax => self.g.soft_max_ext(logits, None, 1.0, 0.0)?,
            Routing::TopKSoftMax => logits,
        };
        let selected = self.g.top_k(scores, nu)?;
        let scores = self.g.reshape(scores, &[1, ne, n])?;
        let mut weights = self.g.get_rows(scores, selected)?;
        if moe.routing == Routing::TopKSoftMax {
            let w = self.g.reshape(weights, &[nu, n])?;
            let w = self.g.soft_max_ext(w, None, 1.0, 0.0)?;
            weights = self.g.reshape(w, &[1, nu, n])?;
        }
        if moe.norm_weights {
            let w = self.g.reshape(weights, &[nu, n])?;
            let sum = self.g.sum_rows(w)?;
            // llama.cpp's floor under the sum (the smallest normal f16).
            let sum = self.g.clamp(sum, 6.103_515_6e-5, f32::INFINITY)?;
            let w = self.g.div(w, sum)?;
            weights = self.g.reshape(w, &[1, nu, n])?;
        }
        let x = self.g.reshape(cur, &[d, 1, n])?;
        let wg = self.lw(l, "ffn_gate_exps", &[d, ff, ne])?;
        let wu = self.lw(l, "ffn_up_exps", &[d, ff, ne])?;
        let wd = self.lw(l, "ffn_down_exps", &[ff, d, ne])?;
        let gate = self.g.mul_mat_id(wg, x, selected)?;
        let gate = self.expert_bias(l, gate, "ffn_gate_exps", moe, selected)?;
        let up = self.g.mul_mat_id(wu, x, selected)?;
        let up = self.expert_bias(l, up, "ffn_up_exps", moe, selected)?;
        let act = match moe.swiglu_oai {
            Some([alpha, limit]) => self.g.swiglu_oai(gate, up, alpha, limit)?,
            None => self.g.glu_split(gate, up, cfg.block.ffn_act)?,
        };
        let down = self.g.mul_mat_id(wd, act, selected)?;
        let down = self.expert_bias(l, down, "ffn_down_exps", moe, selected)?;
        let weighted = self.g.mul(down, weights)?;
        let nb = self.g.get(weighted).nb;
        let mut out = self.g.view(weighted, &[d, n], &[nb[2]], 0)?;
        for e in 1..nu {
            let slot = self.g.view(weighted, &[d, n], &[nb[2]], e * nb[1])?;
            out = self.g.add(out, slot)?;
        }
        if let Some(shared_ff) = moe.shared_ff {
            let names = ["ffn_gate_shexp", "ffn_up_shexp", "ffn_down_shexp"];
            let shared = self.gated_ffn(l, cur, names, shared_ff)?;
            let wgate = self.lw(l, "ffn_gate_inp_shexp", &[d])?;
            let gate = self.g.mul_mat(wgate, cur)?;
            let gate = self.g.unary(gate, UnaryOp::Sigmoid)?;
            let shared = self.g.mul(shared, gate)?;
            out = self.g.add(out, shared)?;
        }
        Ok(out)
    }

    /// Adds a block's branch output `y` to the residual `x`, after the architecture's post-norm
    /// (`post` names it) and residual scale.
    fn residual(&mut self, x: TensorId, y: TensorId, post: Option<String>) -> Result<TensorId> {
        let y = match post {
            Some(name) => self.norm(y, &name)?,
            None => y,
        };
        let y = self.scale(y, self.src.cfg.block.residual_scale)?;
        self.g.add(x, y)
    }
}

/// Builds the forward graph for one step; also returns the names of the weights it reads.
pub fn build(src: &StepSource, shape: StepShape) -> Result<(Graph, StepIo, HashSet<String>)> {
    build_head(src, shape, Head::Logits)
}

/// [`build`] with the output `head` picks.
pub fn build_head(
    src: &StepSource,
    shape: StepShape,
    head: Head,
) -> Result<(Graph, StepIo, HashSet<String>)> {
    let cfg = src.cfg;
    let mut b = Builder {
        g: Graph::new(),
        src,
        used: HashSet::new(),
    };
    let n = shape.n_tokens;
    let d = cfg.n_embd;

    let tokens = b.g.input("tokens", DType::I32, &[n])?;
    // The masks' rows by attention group (see StepShape::n_groups).
    let groups = shape.n_groups.max(1);
    let mask_ne = |n_kv: usize| [n_kv, n / groups, 1, groups];
    let pos = b.g.input("pos", DType::I32, &[n])?;
    let global = KvInputs {
        rows: b.g.input("kv_rows", DType::I64, &[n])?,
        mask: b.g.input("kq_mask", DType::F16, &mask_ne(shape.n_kv))?,
    };
    let window = match src.kv.window_cells() {
        Some(_) => Some(KvInputs {
            rows: b.g.input("kv_rows_swa", DType::I64, &[n])?,
            mask: b
                .g
                .input("kq_mask_swa", DType::F16, &mask_ne(shape.n_kv_window))?,
        }),
        None => None,
    };
    let mut io = StepIo {
        tokens,
        pos,
        global,
        window,
        logits: tokens,
        out_ids: None,
    };

    let tok_embd = b.w("token_embd.weight", &[d, cfg.n_vocab])?;
    let x = b.g.get_rows(tok_embd, tokens)?;
    let mut x = b.scale(x, cfg.block.embd_scale)?;
    let factors = match src.rope_factors() {
        Some(name) => Some(b.w(&name, &[cfg.rope.n_rot / 2])?),
        None => None,
    };
    let post = |l: usize, name: &str| {
        cfg.block
            .post_norms
            .then(|| format!("blk.{l}.{name}.weight"))
    };

    for l in 0..cfg.n_layer {
        let cur = b.norm(x, &format!("blk.{l}.attn_norm.weight"))?;
        let att = b.attention(l, cur, &io, factors, shape)?;
        x = b.residual(x, att, post(l, "post_attention_norm"))?;

        let cur = b.norm(x, &format!("blk.{l}.{}.weight", cfg.block.ffn_norm))?;
        let ffn = match &cfg.moe {
            Some(moe) => b.moe_ffn(l, cur, moe)?,
            None => b.ffn(l, cur)?,
        };
        x = b.residual(x, ffn, post(l, "post_ffw_norm"))?;
        b.g.set_name(x, format!("l_out-{l}"));
    }

    match head {
        Head::Logits if !shape.all_logits && n > 1 => {
            let row = b.g.get(x).nb[1];
            x = b.g.view(x, &[d, 1], &[row], (n - 1) * row)?;
        }
        Head::LogitsOf(n_out) => {
            let ids = b.g.input("out_ids", DType::I32, &[n_out])?;
            io.out_ids = Some(ids);
            x = b.g.get_rows(x, ids)?;
        }
        Head::Logits | Head::Hidden => {}
    }
    let cur = b.norm(x, "output_norm.weight")?;
    if head == Head::Hidden {
        b.g.set_name(cur, "hidden");
        b.g.set_output(cur);
        io.logits = cur;
        return Ok((b.g, io, b.used));
    }
    let out_w = if src.weights.find("output.weight").is_some() {
        b.w("output.weight", &[d, cfg.n_vocab])?
    } else {
        tok_embd
    };
    let logits = b.g.mul_mat(out_w, cur)?;
    let logits = b.scale(logits, cfg.block.logit_scale.map(|s| 1.0 / s))?;
    let logits = b.softcap(logits, cfg.block.final_softcap)?;
    b.g.set_name(logits, "logits");
    b.g.set_output(logits);
    io.logits = logits;
    Ok((b.g, io, b.used))
}
