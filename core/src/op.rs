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

/// Rope parameters (no YaRN extension yet).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RopeParams {
    /// How many leading dimensions of each head are rotated (even, at most ne0).
    pub n_dims: usize,
    /// Pairing of the rotated dimensions.
    pub mode: RopeMode,
    /// theta_i = pos * freq_scale * freq_base^(-2i/n_dims)
    pub freq_base: f32,
    /// Linear position scaling.
    pub freq_scale: f32,
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
    /// Attention softmax(q k^T * scale + mask) v, fused; src: q, k, v, optional mask.
    FlashAttnExt {
        /// Factor on q k^T.
        scale: f32,
        /// ALiBi: 0 for none.
        max_bias: f32,
        /// tanh softcap of the logits: 0 for none.
        logit_softcap: f32,
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
