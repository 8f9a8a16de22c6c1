//! The ops a graph node can be, with their parameters. Names follow ggml.

/// Element-wise unary functions (ggml's `GGML_UNARY_OP_*` plus the simple math ops).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum UnaryOp {
    /// x * x
    Sqr,
    /// sqrt(x)
    Sqrt,
    /// -x
    Neg,
    /// |x|
    Abs,
    /// e^x
    Exp,
    /// ln(x)
    Log,
    /// sin(x)
    Sin,
    /// cos(x)
    Cos,
    /// max(x, 0)
    Relu,
    /// GELU, tanh approximation.
    Gelu,
    /// GELU with the exact error function.
    GeluErf,
    /// x * sigmoid(x)
    Silu,
    /// 1 / (1 + e^-x)
    Sigmoid,
    /// tanh(x)
    Tanh,
}

impl UnaryOp {
    /// Every unary op.
    pub const ALL: [UnaryOp; 14] = [
        UnaryOp::Sqr,
        UnaryOp::Sqrt,
        UnaryOp::Neg,
        UnaryOp::Abs,
        UnaryOp::Exp,
        UnaryOp::Log,
        UnaryOp::Sin,
        UnaryOp::Cos,
        UnaryOp::Relu,
        UnaryOp::Gelu,
        UnaryOp::GeluErf,
        UnaryOp::Silu,
        UnaryOp::Sigmoid,
        UnaryOp::Tanh,
    ];

    /// ggml's lower-case name.
    pub const fn name(self) -> &'static str {
        match self {
            UnaryOp::Sqr => "sqr",
            UnaryOp::Sqrt => "sqrt",
            UnaryOp::Neg => "neg",
            UnaryOp::Abs => "abs",
            UnaryOp::Exp => "exp",
            UnaryOp::Log => "log",
            UnaryOp::Sin => "sin",
            UnaryOp::Cos => "cos",
            UnaryOp::Relu => "relu",
            UnaryOp::Gelu => "gelu",
            UnaryOp::GeluErf => "gelu_erf",
            UnaryOp::Silu => "silu",
            UnaryOp::Sigmoid => "sigmoid",
            UnaryOp::Tanh => "tanh",
        }
    }
}

/// Element-wise binary functions with broadcasting of src1 over src0.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BinaryOp {
    /// a + b
    Add,
    /// a - b
    Sub,
    /// a * b
    Mul,
    /// a / b
    Div,
}

impl BinaryOp {
    /// ggml's lower-case name.
    pub const fn name(self) -> &'static str {
        match self {
            BinaryOp::Add => "add",
            BinaryOp::Sub => "sub",
            BinaryOp::Mul => "mul",
            BinaryOp::Div => "div",
        }
    }
}

/// Gated linear units: `act(gate) * up`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GluOp {
    /// silu(gate) * up
    Swiglu,
    /// gelu(gate) * up
    Geglu,
}

impl GluOp {
    /// ggml's lower-case name.
    pub const fn name(self) -> &'static str {
        match self {
            GluOp::Swiglu => "swiglu",
            GluOp::Geglu => "geglu",
        }
    }
}

/// How rope pairs the dimensions it rotates.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RopeMode {
    /// Adjacent pairs (2i, 2i+1): ggml mode 0, used by Llama GGUF files.
    Normal,
    /// Halves (i, i + n_dims/2): ggml's NEOX mode 2.
    Neox,
}

/// Rope parameters, as ggml's `rope_ext`: the plain rotation, linear position scaling, YaRN's
/// blend of interpolated and extrapolated angles, and a factor on the result. An optional third
/// source of the op holds per-pair frequency factors (Llama 3's `rope_freqs`, LongRoPE's short
/// and long factors): pair k's angle is divided by factor k.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RopeParams {
    /// How many leading dimensions of each head are rotated (even, at most ne0).
    pub n_dims: usize,
    /// Pairing of the rotated dimensions.
    pub mode: RopeMode,
    /// theta_k = pos * freq_base^(-2k/n_dims) / factor_k, before scaling.
    pub freq_base: f32,
    /// Linear position scaling: the interpolated angle is freq_scale * theta.
    pub freq_scale: f32,
    /// YaRN: how much of the extrapolated (unscaled) angle the high-frequency pairs keep, 0 for
    /// none (then the angle is just freq_scale * theta and the magnitude is attn_factor).
    pub ext_factor: f32,
    /// Factor on cos and sin (YaRN's magnitude correction and LongRoPE's attention factor).
    pub attn_factor: f32,
    /// YaRN: pairs turning more than beta_fast times over the original context extrapolate.
    pub beta_fast: f32,
    /// YaRN: pairs turning fewer than beta_slow times over the original context interpolate.
    pub beta_slow: f32,
    /// YaRN: the context length the model was trained with before scaling.
    pub n_ctx_orig: usize,
}

impl RopeParams {
    /// Plain rope of `n_dims` dimensions with linear scaling `freq_scale` and no YaRN.
    pub fn new(n_dims: usize, mode: RopeMode, freq_base: f32, freq_scale: f32) -> RopeParams {
        RopeParams {
            n_dims,
            mode,
            freq_base,
            freq_scale,
            ext_factor: 0.0,
            attn_factor: 1.0,
            beta_fast: 32.0,
            beta_slow: 1.0,
            n_ctx_orig: 0,
        }
    }

    /// Whether the rotation is the plain one (only base and linear scale): no YaRN blend and
    /// no factor on the result. Backends with a plain kernel only take these.
    pub fn is_plain(&self) -> bool {
        self.ext_factor == 0.0 && self.attn_factor == 1.0
    }

    /// YaRN's correction range: the first and last pair index (as reals, clamped to the rotated
    /// pairs) between which the blend ramps from extrapolation to interpolation. Pair k turns
    /// n_ctx_orig * base^(-2k/n_dims) / (2 pi) times over the original context; the range runs
    /// from the pair turning beta_fast times to the one turning beta_slow times.
    pub fn yarn_corr_dims(&self) -> [f32; 2] {
        let n = self.n_dims as f32;
        let dim = |rotations: f32| -> f32 {
            n * (self.n_ctx_orig as f32 / (rotations * 2.0 * std::f32::consts::PI)).ln()
                / (2.0 * self.freq_base.ln())
        };
        let lo = dim(self.beta_fast).floor().max(0.0);
        let hi = dim(self.beta_slow).ceil().min(n - 1.0);
        [lo, hi]
    }

    /// cos and sin of pair `k` (of `n_dims / 2`) at angle `theta` = pos * base^(-2k/n_dims) /
    /// factor_k, with scaling, the YaRN blend and the magnitude applied; `corr` is
    /// [`RopeParams::yarn_corr_dims`]. The reference every backend follows.
    pub fn cos_sin(&self, theta: f32, k: usize, corr: [f32; 2]) -> (f32, f32) {
        let interp = self.freq_scale * theta;
        let (angle, mag) = if self.ext_factor != 0.0 {
            // The ramp is 1 below corr[0] (extrapolate) and 0 above corr[1] (interpolate),
            // measured in pairs of dimensions.
            let y = ((k as f32) - corr[0]) / (corr[1] - corr[0]).max(0.001);
            let ramp = (1.0 - y.clamp(0.0, 1.0)) * self.ext_factor;
            let mag = self.attn_factor * (1.0 + 0.1 * (1.0 / self.freq_scale).ln());
            (interp * (1.0 - ramp) + theta * ramp, mag)
        } else {
            (interp, self.attn_factor)
        };
        (angle.cos() * mag, angle.sin() * mag)
    }
}

/// What a tensor is computed by. Leaves (weights, inputs) are [`Op::None`].
#[derive(Clone, Debug, PartialEq)]
pub enum Op {
    /// A leaf: data is set from outside.
    None,
    /// A view of src0 with its own ne/nb/offset (no computation).
    View,
    /// src0 with another shape (no computation; src0 contiguous).
    Reshape,
    /// src0 with its axes permuted (no computation).
    Permute([usize; 4]),
    /// src0 with axes 0 and 1 swapped (no computation).
    Transpose,
    /// Copy src0 into the memory of src1, converting its type; the result is a view of src1.
    Cpy,
    /// A contiguous copy of src0.
    Cont,
    /// A copy of src0 in the same layout type.
    Dup,
    /// Rows of src0 picked by the I32 indices in src1, as F32.
    GetRows,
    /// Rows of src1 written into src0 at the indices in src2; the result is a view of src0.
    SetRows,
    /// src1 times src0 transposed: out[m, n] = sum_k src0[k, m] * src1[k, n], batched over 2-3.
    MulMat,
    /// A mat-mul whose matrix is picked per row: src0 holds one matrix per expert
    /// [k, m, n_expert], src1 the rows [k, n_b, n_tokens], src2 the I32 expert ids
    /// [n_used, n_tokens]; out[:, e, t] = src0[:, :, ids[e, t]] times src1[:, e % n_b, t]
    /// (ggml's MUL_MAT_ID). src0 holds experts `first..first + n_expert` (`first` is 0 but in
    /// the graph of one part of a meta device that holds a slice of the experts); a row routed
    /// to an expert src0 does not hold is 0.
    MulMatId {
        /// The id of src0's first expert.
        first: usize,
    },
    /// src0 [n, n_used, n_tokens] plus the row of src1 [n, n_rows] that the I32 ids src2
    /// [n_used, n_tokens] pick: out[:, e, t] = src0[:, e, t] + src1[:, ids[e, t]] (ggml's
    /// ADD_ID: a bias per expert).
    AddId,
    /// An element-wise binary op, src1 broadcast over src0.
    Binary(BinaryOp),
    /// x * scale + bias
    Scale {
        /// Factor.
        scale: f32,
        /// Added after scaling.
        bias: f32,
    },
    /// An element-wise unary op.
    Unary(UnaryOp),
    /// min(max(x, min), max)
    Clamp {
        /// Lower bound.
        min: f32,
        /// Upper bound.
        max: f32,
    },
    /// Gated linear unit; with one source the row holds gate then up halves.
    Glu {
        /// Which activation.
        op: GluOp,
        /// With one source: the up half comes first.
        swapped: bool,
    },
    /// gpt-oss's clamped SwiGLU of gate src0 and up src1 (ggml's `swiglu_oai`): with
    /// x = min(gate, limit) and y = clamp(up, -limit, limit), x * sigmoid(alpha * x) * (y + 1).
    SwigluOai {
        /// Factor in the sigmoid.
        alpha: f32,
        /// Bound of the gate (above) and of the up value (both sides).
        limit: f32,
    },
    /// x / sqrt(mean(x^2) + eps) over each row.
    RmsNorm {
        /// Added under the root.
        eps: f32,
    },
    /// (x - mean) / sqrt(var + eps) over each row.
    Norm {
        /// Added under the root.
        eps: f32,
    },
    /// softmax(x * scale + slope * mask) over each row; src1 is the optional mask.
    SoftMax {
        /// Factor on x.
        scale: f32,
        /// ALiBi: 0 for none.
        max_bias: f32,
    },
    /// Rotary position embedding of src0 [head_dim, heads, tokens, 1] at I32 positions src1.
    Rope(RopeParams),
    /// Attention softmax(q k^T * scale + mask) v, fused; src: q, k, v, optional mask, then
    /// the sinks when `sinks` is set.
    FlashAttnExt {
        /// Factor on q k^T.
        scale: f32,
        /// ALiBi: 0 for none.
        max_bias: f32,
        /// tanh softcap of the logits: 0 for none.
        logit_softcap: f32,
        /// The last source is an F32 [heads] row of attention sinks (gpt-oss; ggml's
        /// `flash_attn_ext_add_sinks`): head h's sink is one more logit, taken as it is (not
        /// scaled, capped or masked), that joins the soft-max of each of the head's rows and
        /// adds no value, so the weights of the keys sum to less than 1.
        sinks: bool,
    },
    /// src0 and src1 joined along an axis.
    Concat(usize),
    /// src0 tiled to the result's shape.
    Repeat,
    /// src0 padded with zeros at the end of each axis.
    Pad([usize; 4]),
    /// Sum of all elements (one value).
    Sum,
    /// Sum of each row.
    SumRows,
    /// Mean of each row.
    Mean,
    /// Index of the largest value of each row (I32).
    Argmax,
    /// The indices (I32) that sort each row, ascending or descending; equal values keep their
    /// order (a stable sort), so the result is exact.
    Argsort {
        /// Largest first.
        descending: bool,
    },
    /// The indices (I32) of the k largest values of each row, largest first, equal values in
    /// index order: the first k of a descending argsort. (ggml leaves the order of its TOP_K
    /// open; this one fixes it, so that backends agree exactly.)
    TopK(usize),
    /// Elements with column > n_past + row set to -inf.
    DiagMaskInf(usize),
    /// start, start + step, ... below stop.
    Arange {
        /// First value.
        start: f32,
        /// Upper bound (excluded).
        stop: f32,
        /// Increment.
        step: f32,
    },
    /// src0 (f32, contiguous) summed over the ranks of the communicator group the backend has
    /// joined ([`crate::Communicator::attach`]), written back into src0's memory: the result is
    /// an in-place view of src0. Only meta devices put it in graphs, and only on backends that
    /// joined a group; no other backend supports it.
    AllReduce,
}

impl Op {
    /// ggml's upper-case op name (used in reports and errors).
    pub fn name(&self) -> &'static str {
        match self {
            Op::None => "NONE",
            Op::View => "VIEW",
            Op::Reshape => "RESHAPE",
            Op::Permute(_) => "PERMUTE",
            Op::Transpose => "TRANSPOSE",
            Op::Cpy => "CPY",
            Op::Cont => "CONT",
            Op::Dup => "DUP",
            Op::GetRows => "GET_ROWS",
            Op::SetRows => "SET_ROWS",
            Op::MulMat => "MUL_MAT",
            Op::MulMatId { .. } => "MUL_MAT_ID",
            Op::AddId => "ADD_ID",
            Op::Binary(BinaryOp::Add) => "ADD",
            Op::Binary(BinaryOp::Sub) => "SUB",
            Op::Binary(BinaryOp::Mul) => "MUL",
            Op::Binary(BinaryOp::Div) => "DIV",
            Op::Scale { .. } => "SCALE",
            Op::Unary(u) => match u {
                UnaryOp::Sqr => "SQR",
                UnaryOp::Sqrt => "SQRT",
                UnaryOp::Neg => "NEG",
                UnaryOp::Abs => "ABS",
                UnaryOp::Exp => "EXP",
                UnaryOp::Log => "LOG",
                UnaryOp::Sin => "SIN",
                UnaryOp::Cos => "COS",
                UnaryOp::Relu => "RELU",
                UnaryOp::Gelu => "GELU",
                UnaryOp::GeluErf => "GELU_ERF",
                UnaryOp::Silu => "SILU",
                UnaryOp::Sigmoid => "SIGMOID",
                UnaryOp::Tanh => "TANH",
            },
            Op::Clamp { .. } => "CLAMP",
            Op::Glu {
                op: GluOp::Swiglu, ..
            } => "SWIGLU",
            Op::Glu {
                op: GluOp::Geglu, ..
            } => "GEGLU",
            Op::SwigluOai { .. } => "SWIGLU_OAI",
            Op::RmsNorm { .. } => "RMS_NORM",
            Op::Norm { .. } => "NORM",
            Op::SoftMax { .. } => "SOFT_MAX",
            Op::Rope(_) => "ROPE",
            Op::FlashAttnExt { .. } => "FLASH_ATTN_EXT",
            Op::Concat(_) => "CONCAT",
            Op::Repeat => "REPEAT",
            Op::Pad(_) => "PAD",
            Op::Sum => "SUM",
            Op::SumRows => "SUM_ROWS",
            Op::Mean => "MEAN",
            Op::Argmax => "ARGMAX",
            Op::Argsort { .. } => "ARGSORT",
            Op::TopK(_) => "TOP_K",
            Op::DiagMaskInf(_) => "DIAG_MASK_INF",
            Op::Arange { .. } => "ARANGE",
            Op::AllReduce => "ALL_REDUCE",
        }
    }

    /// Whether the op only reinterprets its source's memory (no kernel runs).
    pub fn is_view(&self) -> bool {
        matches!(
            self,
            Op::View | Op::Reshape | Op::Permute(_) | Op::Transpose
        )
    }
}
