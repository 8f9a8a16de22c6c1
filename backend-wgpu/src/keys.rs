//! Typed shader keys: one struct per shader entry point, whose fields are the parameters its
//! variants differ in, and [`Key::defines`], the one place where a key becomes the integer
//! defines of the template step (`shader` module docs). Plans build keys and set their fields;
//! nothing else names a define. Each family also declares the define names its file may test
//! ([`crate::shader::Family::defines`]), so that an `#if` naming anything else is an error.

use tessera_core::{BinaryOp, DType, GluOp};

use crate::shader::Family;

/// Invocations per workgroup of the element-wise families.
pub(crate) const EW_WG: u32 = 256;
/// Invocations per workgroup of the row families (one workgroup per row): a 4,096-value row
/// takes 16 loads an invocation.
pub(crate) const ROW_WG: u32 = 256;
/// Rows of src0 per mat-vec workgroup (they share each load of src1), and invocations per
/// mat-vec workgroup.
pub(crate) const MV_ROWS: u32 = 4;
pub(crate) const MV_WG: u32 = 256;
/// k-steps the f16 mat-mat accumulates in f16 before adding into its f32 accumulators.
const MM_HK: u32 = 16;
/// Invocations per workgroup of `quant_cols` (one 32-value block each).
pub(crate) const QUANT_COLS_WG: u32 = 64;
/// Invocations per workgroup of the flash attention `decode` entry point.
pub(crate) const FA_DECODE_WG: u32 = 256;
/// Invocations per workgroup of the flash attention `decode_combine` entry point.
pub(crate) const FA_COMBINE_WG: u32 = 64;
/// Invocations per workgroup of the flash attention `prefill` entry point.
const FA_PREFILL_WG: u32 = 256;

/// Operation codes of the unary family (`OP` in `shaders/unary.wgsl`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum UnaryKind {
    /// A copy between float types.
    Convert,
    /// `scale * x + bias`.
    Scale,
    /// `clamp(x, min, max)`.
    Clamp,
    /// A copy of 4-byte values as they are.
    Raw,
    /// Quantized blocks to f32.
    Dequantize,
    /// Quantized blocks copied as they are (contiguous).
    Blocks,
    /// Floats to quantized blocks.
    Quantize,
    /// A unary function (its index in `UnaryOp::ALL`).
    Function(u32),
}

impl UnaryKind {
    fn code(self) -> u32 {
        match self {
            UnaryKind::Convert => 0,
            UnaryKind::Scale => 1,
            UnaryKind::Clamp => 2,
            UnaryKind::Raw => 3,
            UnaryKind::Dequantize => 4,
            UnaryKind::Blocks => 5,
            UnaryKind::Quantize => 6,
            UnaryKind::Function(i) => 10 + i,
        }
    }
}

/// `unary.wgsl`: unary functions, scale, clamp and copies with conversion.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct UnaryKey {
    pub op: UnaryKind,
    pub src: DType,
    pub dst: DType,
}

/// `binary.wgsl`: element-wise `a op b` with broadcasting, of a's type.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct BinaryKey {
    pub op: BinaryOp,
    pub a: DType,
    pub b: DType,
}

/// `glu.wgsl`: a gated linear unit of type `t`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct GluKey {
    pub op: GluOp,
    pub t: DType,
    /// gpt-oss's clamped SwiGLU (`op` is then Swiglu).
    pub oai: bool,
}

/// `norm.wgsl`: rms_norm (`layer` false) or norm, times a weight row where `mul` (fused).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct NormKey {
    pub layer: bool,
    pub mul: bool,
    /// With `mul`: a residual (src2) added to the product (ADD).
    pub add: bool,
}

/// `soft_max.wgsl`: with a mask of type `mask` (f32 where there is none).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct SoftMaxKey {
    pub mask: DType,
}

/// `rope.wgsl`: the rope of a tensor of type `t`, or (`kv_cache`: the caches' type, F16 or
/// F32; `t` f32) the fused rope of K with the stores of K and V into their caches (KV). The
/// unfused rope may also divide each pair's angle by frequency factors (`factors`: an F32
/// third source, FACTORS) and blend and scale as rope_ext does (`blend`: YaRN's blend and the
/// magnitude, BLEND); the plain rotation compiles neither.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct RopeKey {
    pub t: DType,
    pub kv_cache: Option<DType>,
    pub factors: bool,
    pub blend: bool,
}

/// Operation codes of the rows family (`OP` in `shaders/rows.wgsl`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum RowsKind {
    /// get_rows of float or quantized rows into f32.
    Get,
    /// get_rows of i32 rows.
    GetRaw,
    /// set_rows into float rows.
    Set,
    /// set_rows into quantized rows.
    SetQuantized,
}

/// `rows.wgsl`: get_rows and set_rows (`src` the rows read, `idx` the indices' type, `dst`
/// the rows written).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct RowsKey {
    pub op: RowsKind,
    pub src: DType,
    pub idx: DType,
    pub dst: DType,
}

/// `mat_vec.wgsl` `mat_vec`: the float (dequantizing) mat-vec of weights `a` by activations
/// `b`. `aligned`: the weights read as 16-byte loads (a float type: A4) or as whole aligned
/// words (a quantized type whose blocks are whole words: AL); `y4`: f32 activations as
/// 16-byte loads. `id`: mul_mat_id's mat-vec, the expert of each slot read from the ids (ID);
/// `glu` (with `id`): the experts' gate and up in one dispatch, act(gate) * up stored (GLU,
/// W3, GELU for GEGLU); float weights are then never read as 16-byte loads.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct MatVecKey {
    pub a: DType,
    pub b: DType,
    pub subgroups: bool,
    pub aligned: bool,
    pub y4: bool,
    pub id: bool,
    pub glu: Option<GluOp>,
}

/// The second weight matrix of an integer-dot mat-vec (W2): read as the first is (B4 = A4),
/// its product stored beside the first's (PAIR) or `silu(first) * second` stored (`glu`: the
/// fused gate, up and swiglu).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct SecondMatrix {
    /// The gated activation of the two products (GLU: SwiGLU, or GEGLU with GELU), or None
    /// for the two products side by side (PAIR).
    pub glu: Option<GluOp>,
}

/// `mat_vec_q.wgsl` `mat_vec_q`: the integer-dot mat-vec (see the shader for each define).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct MatVecQKey {
    /// Weight and activation types.
    pub a: DType,
    pub b: DType,
    pub subgroups: bool,
    /// Q4_K rows read as 16-byte words (A4); f32 activations as 16-byte loads (Y4).
    pub a4: bool,
    pub y4: bool,
    /// Rows per workgroup, invocations per workgroup, values of the column quantized per
    /// step, the row length compiled in (KK), quads loaded per invocation and step (QPS).
    pub rows: u32,
    pub wg: u32,
    pub kc: u32,
    pub kk: u32,
    pub qps: u32,
    /// Row sums added by subgroup shuffles (RSUB); the column quantized with coalesced loads
    /// (YC); the column's loads issued before the first weights' (QF).
    pub rsub: bool,
    pub yc: bool,
    pub qf: bool,
    /// One column of dst without batch dimensions: its rows and the weights' row stride
    /// compiled in (ONECOL, MM, RS).
    pub one_column: Option<(u32, u32)>,
    /// Fused: a residual added as it stores (ADD); a second weight matrix (W2); Q, K and V
    /// in one dispatch (QKV, with the second matrix); the rope of Q and K and the cache stores
    /// into caches of this type (ROPE, with QKV); the column's rms_norm computed (NORM).
    pub add: bool,
    pub second: Option<SecondMatrix>,
    pub qkv: bool,
    pub rope: Option<DType>,
    pub norm: bool,
    /// mul_mat_id's mat-vec, the expert of each slot read from the ids (ID; with `second`'s
    /// GLU, the experts' gate and up).
    pub id: bool,
    /// Columns of dst per workgroup (NC: 1, or 2, 4 or 8 with MC, which none of `second`,
    /// `qkv`, `rope`, `id` and `one_column` comes with; 2 to 16 with `pq`).
    pub cols: u32,
    /// The columns read pre-quantized from src1, as [`QuantColsKey`]'s dispatch wrote them
    /// (PQ, with MC and Y4; `norm` is then that dispatch's, never this one's).
    pub pq: bool,
}

/// `quant_cols.wgsl` `quant_cols`: the columns of a mat-vec's src1 (of type `b`, `k` values
/// each; `y4`: f32 read as 16-byte loads) quantized once for the mat-vecs that read them
/// pre-quantized ([`MatVecQKey::pq`]); `norm`: `rms_norm(x) * w` quantized (NORM).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct QuantColsKey {
    pub b: DType,
    pub y4: bool,
    pub k: u32,
    pub norm: bool,
}

/// `mat_mat.wgsl` (or, with `coop`, `mat_mat_coop.wgsl`) `mat_mat`: the tiled mat-mat of weights `a` by activations `b`; `tile`
/// (BM, BN, BK); `aligned` and `y4` as for [`MatVecKey`]; `h16`: f16 tiles and products;
/// `coop` (with `h16`): the products on cooperative matrices; `pair` (with `coop`): two weight
/// matrices in one dispatch (MMPAIR); `id` (without `coop`): mul_mat_id's pairs grouped by
/// expert, a tile of one expert's pairs per workgroup (ID).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct MatMatKey {
    pub a: DType,
    pub b: DType,
    pub tile: (u32, u32, u32),
    pub aligned: bool,
    pub y4: bool,
    pub h16: bool,
    pub coop: bool,
    pub pair: bool,
    pub id: bool,
}

/// The types and head size every flash attention entry point is built for: k, v, the mask
/// (f32 where there is none), and DMAX.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Attn {
    pub k: DType,
    pub v: DType,
    pub mask: DType,
    pub dmax: u32,
    /// Attention sinks (SINKS, one f32 per query head in binding 5).
    pub sinks: bool,
}

/// `flash_attn.wgsl` `main`: one key per invocation, `wg` invocations.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct FlashAttnKey {
    pub attn: Attn,
    pub wg: u32,
}

/// `flash_attn.wgsl` `decode`: groups of invocations per key; subgroup operations where
/// `subgroups`; k and v rows as 16-byte chunks where `wide` (Y4, B4); the keys split over
/// workgroups whose partial results `decode_combine` merges (`split`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct FlashAttnDecodeKey {
    pub attn: Attn,
    pub subgroups: bool,
    pub wide: [bool; 2],
    pub split: bool,
}

/// `flash_attn.wgsl` `prefill`: cooperative matrices; f16 k and v staged 8 values a load
/// (`kv16`: PKV16).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct FlashAttnPrefillKey {
    pub attn: Attn,
    pub kv16: bool,
}

/// Operation codes of the reduce family (`OP` in `shaders/reduce.wgsl`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum ReduceKind {
    SumRows,
    Mean,
    Argmax,
    Sum,
}

/// `reduce.wgsl`: sums, means and argmax of `src` into `dst`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct ReduceKey {
    pub op: ReduceKind,
    pub src: DType,
    pub dst: DType,
}

/// Operation codes of the shape family (`OP` in `shaders/shape.wgsl`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum ShapeKind {
    Concat,
    Repeat,
    Pad,
    DiagMaskInf,
    Arange,
}

/// `shape.wgsl`: concat, repeat, pad, diag_mask_inf, arange of `t` into `dst`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct ShapeKey {
    pub op: ShapeKind,
    pub t: DType,
    pub dst: DType,
}

/// Operation codes of the moe family (`OP` in `shaders/moe.wgsl`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum MoeKind {
    AddId,
    /// argsort and top_k.
    Sort,
    /// mul_mat_id's (slot, token) pairs grouped by expert, with the tile table of the grouped
    /// mat-mat ([`MatMatKey::id`]).
    Bucket,
    /// A router's selection (the fusion group `MoeRouter`).
    Router,
    /// The weighted sum of the experts' outputs (the fusion group `MoeWeightedSum`).
    WeightedSum,
}

/// `moe.wgsl`: add_id, argsort and top_k (f32), and the fused router and weighted sum.
/// mul_mat_id is the mat-vec's ([`MatVecKey`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct MoeKey {
    pub op: MoeKind,
}

/// One shader entry point with its parameters.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Key {
    Unary(UnaryKey),
    Binary(BinaryKey),
    Glu(GluKey),
    Norm(NormKey),
    SoftMax(SoftMaxKey),
    Rope(RopeKey),
    Rows(RowsKey),
    MatVec(MatVecKey),
    MatVecQ(MatVecQKey),
    QuantCols(QuantColsKey),
    MatMat(MatMatKey),
    FlashAttn(FlashAttnKey),
    FlashAttnDecode(FlashAttnDecodeKey),
    FlashAttnPrefill(FlashAttnPrefillKey),
    /// `flash_attn.wgsl` `decode_combine` at head size DMAX.
    FlashAttnCombine(u32),
    Reduce(ReduceKey),
    Shape(ShapeKey),
    Moe(MoeKey),
}

/// Invocations per workgroup of an element-wise variant writing `dst`: one for quantizing into
/// K types (their scratch is workgroup memory, see `quantize.wgsl`), else [`EW_WG`].
pub(crate) fn ew_wg(dst: DType) -> u32 {
    if dst.is_quantized() && dst.block_size() == 256 {
        1
    } else {
        EW_WG
    }
}

/// Values per block and invocations per block of the float mat-vec for weights of type `a`
/// (each invocation takes 8 values).
fn mat_vec_blocks(a: DType) -> (u32, u32) {
    if !a.is_quantized() {
        (8, 1)
    } else if a.block_size() == 256 {
        (256, 32)
    } else {
        (32, 4)
    }
}

/// Values per block and parts per block of the integer-dot mat-vec for weights of type `a`
/// (see `shaders/mat_vec_q.wgsl`). A Q4_K part is a whole 64-value group, whose
/// two sub-blocks share the head's loads and the scales' decode.
pub(crate) fn mvq_parts(a: DType) -> (u32, u32) {
    match a {
        DType::Q8_0 => (32, 2),
        DType::Q4_K => (256, 4),
        DType::Q6_K => (256, 4),
        _ => (32, 1),
    }
}

/// Whether the integer-dot mat-vec of weights of type `a` keeps two parts per invocation in
/// flight (PF2 in `mat_vec_q`): a gain for the small-block types; Q4_K's parts lose with it and
/// Q6_K's are too large (they spill), and with a second weight matrix (two parts of each of
/// two matrices) it loses for every type.
fn mvq_two_in_flight(a: DType) -> bool {
    matches!(a, DType::Q4_0 | DType::Q4_1 | DType::Q8_0)
}

impl Key {
    /// The family (file) and entry point.
    pub fn entry(&self) -> (Family, &'static str) {
        match self {
            Key::Unary(_) => (Family::Unary, "main"),
            Key::Binary(_) => (Family::Binary, "main"),
            Key::Glu(_) => (Family::Glu, "main"),
            Key::Norm(_) => (Family::Norm, "main"),
            Key::SoftMax(_) => (Family::SoftMax, "main"),
            Key::Rope(_) => (Family::Rope, "main"),
            Key::Rows(_) => (Family::Rows, "main"),
            Key::MatVec(_) => (Family::MatVec, "mat_vec"),
            Key::MatVecQ(_) => (Family::MatVecQ, "mat_vec_q"),
            Key::QuantCols(_) => (Family::QuantCols, "quant_cols"),
            Key::MatMat(k) if k.coop => (Family::MatMatCoop, "mat_mat"),
            Key::MatMat(_) => (Family::MatMat, "mat_mat"),
            Key::FlashAttn(_) => (Family::FlashAttn, "main"),
            Key::FlashAttnDecode(_) => (Family::FlashAttn, "decode"),
            Key::FlashAttnPrefill(_) => (Family::FlashAttn, "prefill"),
            Key::FlashAttnCombine(_) => (Family::FlashAttn, "decode_combine"),
            Key::Reduce(_) => (Family::Reduce, "main"),
            Key::Shape(_) => (Family::Shape, "main"),
            Key::Moe(_) => (Family::Moe, "main"),
        }
    }

    /// Invocations per workgroup: the WG define (the mat-mats, whose workgroups are always 256
    /// invocations, do not read it).
    pub fn workgroup_size(&self) -> u32 {
        self.defines()
            .iter()
            .find(|(n, _)| *n == "WG")
            .map_or(1, |&(_, v)| v)
    }

    /// The key's defines (without F16, which the device adds, and the ones the template step
    /// derives from DT), sorted by name: the defaults (`T0`..`T3` and `DT` f32, `SUBGROUPS`
    /// 0, `WG` 64) changed by the key's fields, and the family's own.
    pub fn defines(&self) -> Vec<(&'static str, u32)> {
        let mut d = Defines(vec![
            ("DT", 0),
            ("SUBGROUPS", 0),
            ("T0", 0),
            ("T1", 0),
            ("T2", 0),
            ("T3", 0),
            ("WG", 64),
        ]);
        match *self {
            Key::Unary(k) => {
                d.set("OP", k.op.code());
                d.ty("T0", k.src).ty("DT", k.dst);
                d.set("WG", ew_wg(k.dst));
            }
            Key::Binary(k) => {
                let code = match k.op {
                    BinaryOp::Add => 0,
                    BinaryOp::Sub => 1,
                    BinaryOp::Mul => 2,
                    BinaryOp::Div => 3,
                };
                d.set("OP", code);
                d.ty("T0", k.a).ty("T1", k.b).ty("DT", k.a);
                d.set("WG", ew_wg(k.a));
            }
            Key::Glu(k) => {
                d.set(
                    "OP",
                    if k.oai {
                        2
                    } else {
                        u32::from(k.op == GluOp::Geglu)
                    },
                );
                d.ty("T0", k.t).ty("T1", k.t).ty("DT", k.t);
                d.set("WG", ew_wg(k.t));
            }
            Key::Norm(k) => {
                d.set("OP", u32::from(k.layer));
                d.set("MUL", u32::from(k.mul));
                d.set("ADD", u32::from(k.add));
                d.set("WG", ROW_WG);
            }
            Key::SoftMax(k) => {
                d.ty("T1", k.mask);
                d.set("WG", ROW_WG);
            }
            Key::Rope(k) => {
                d.ty("T0", k.t);
                if k.factors {
                    d.set("FACTORS", 1).ty("T2", DType::F32);
                }
                if k.blend {
                    d.set("BLEND", 1);
                }
                match k.kv_cache {
                    Some(cache) => {
                        d.set("KV", 1);
                        d.ty("DT", cache);
                        d.set("WG", ew_wg(cache));
                    }
                    None => {
                        d.ty("DT", k.t);
                        d.set("WG", ew_wg(k.t));
                    }
                }
            }
            Key::Rows(k) => {
                let code = match k.op {
                    RowsKind::Get => 0,
                    RowsKind::GetRaw => 1,
                    RowsKind::Set => 2,
                    RowsKind::SetQuantized => 3,
                };
                d.set("OP", code);
                d.set("QUANT", u32::from(k.src.is_quantized()));
                d.ty("T0", k.src).ty("T1", k.idx).ty("DT", k.dst);
                d.set("WG", ew_wg(k.dst));
            }
            Key::MatVec(k) => {
                let (qb, tpb) = mat_vec_blocks(k.a);
                let quant = k.a.is_quantized();
                d.set("SUBGROUPS", u32::from(k.subgroups));
                d.set("A4", u32::from(k.aligned && !quant && k.glu.is_none()));
                d.set("AL", u32::from(k.aligned && quant));
                d.set("Y4", u32::from(k.y4));
                d.set("QB", qb);
                d.set("TPB", tpb);
                d.set("WG", MV_WG);
                d.set("ROWS", MV_ROWS);
                d.ty("T0", k.a).ty("T1", k.b);
                if k.id {
                    d.set("ID", 1).ty("T2", DType::I32);
                }
                if let Some(op) = k.glu {
                    d.set("GLU", 1).set("W3", 1);
                    d.set("GELU", u32::from(op == GluOp::Geglu));
                }
            }
            Key::MatVecQ(k) => {
                let (qb, tpb) = mvq_parts(k.a);
                d.set("SUBGROUPS", u32::from(k.subgroups));
                d.set("A4", u32::from(k.a4));
                d.set("Y4", u32::from(k.y4));
                d.set("QB", qb);
                d.set("TPB", tpb);
                d.ty("T0", k.a).ty("T1", k.b);
                d.set("ROWS", k.rows);
                d.set("KK", k.kk);
                d.set("YK", 1);
                d.set("WG", k.wg);
                d.set("TPR", k.wg / k.rows);
                d.set("KC", k.kc);
                d.set("QPS", k.qps);
                d.set("RSUB", u32::from(k.rsub));
                d.set("YC", u32::from(k.yc));
                d.set("QF", u32::from(k.qf));
                if let Some((rows, stride)) = k.one_column {
                    d.set("ONECOL", 1);
                    d.set("MM", rows);
                    d.set("RS", stride);
                }
                d.set(
                    "PF2",
                    u32::from(mvq_two_in_flight(k.a) && k.second.is_none()),
                );
                if k.add {
                    d.set("ADD", 1);
                }
                if let Some(s) = k.second {
                    d.set("W2", 1);
                    d.set("B4", u32::from(k.a4));
                    d.set(if s.glu.is_some() { "GLU" } else { "PAIR" }, 1);
                    d.set("GELU", u32::from(s.glu == Some(GluOp::Geglu)));
                }
                if k.qkv {
                    d.set("QKV", 1);
                }
                if let Some(cache) = k.rope {
                    d.set("ROPE", 1);
                    d.ty("T3", cache);
                }
                if k.norm {
                    d.set("NORM", 1);
                }
                if k.id {
                    d.set("ID", 1);
                }
                d.set("NC", k.cols);
                if k.cols > 1 {
                    d.set("MC", 1);
                }
                if k.pq {
                    d.set("PQ", 1);
                }
            }
            Key::QuantCols(k) => {
                d.ty("T1", k.b);
                d.set("Y4", u32::from(k.y4));
                d.set("KK", k.k);
                d.set("YK", 1);
                d.set("NORM", u32::from(k.norm));
                d.set("WG", QUANT_COLS_WG);
            }
            Key::MatMat(k) => {
                let (bm, bn, bk) = k.tile;
                if k.coop {
                    d.set("H16", 1);
                    d.set("COOP", 1);
                    d.set("FM4", u32::from(bn == 128));
                } else if k.h16 {
                    d.set("H16", 1);
                    d.set("HK", MM_HK.min(bk));
                } else {
                    d.set("HK", bk);
                }
                let quant = k.a.is_quantized();
                d.set("QUANT", u32::from(quant));
                d.set("A4", u32::from(k.aligned && !quant));
                d.set("AL", u32::from(k.aligned && quant));
                d.set("Y4", u32::from(k.y4));
                d.set("BM", bm);
                d.set("BN", bn);
                d.set("BK", bk);
                d.ty("T0", k.a).ty("T1", k.b);
                if k.pair {
                    d.set("MMPAIR", 1);
                }
                if k.id {
                    d.set("ID", 1);
                }
            }
            Key::FlashAttn(k) => {
                d.attn(k.attn);
                d.set("WG", k.wg);
            }
            Key::FlashAttnDecode(k) => {
                d.attn(k.attn);
                d.set("DECODE", 1);
                d.set("KU", (512 / k.attn.dmax).max(1));
                d.set("WG", FA_DECODE_WG);
                d.set("SUBGROUPS", u32::from(k.subgroups));
                d.set("Y4", u32::from(k.wide[0]));
                d.set("B4", u32::from(k.wide[1]));
                if k.split {
                    d.set("SPLIT", 1);
                }
            }
            Key::FlashAttnPrefill(k) => {
                d.attn(k.attn);
                d.set("PKV16", u32::from(k.kv16));
                d.set("Y4", u32::from(k.kv16));
                d.set("B4", u32::from(k.kv16));
                d.set("WG", FA_PREFILL_WG);
                d.set("PREFILL", 1);
                d.set("H16", 1);
                d.set("COOP", 1);
                d.set("OT4", u32::from(k.attn.dmax == 128));
            }
            Key::FlashAttnCombine(dmax) => {
                d.set("DMAX", dmax);
                d.set("COMBINE", 1);
                d.set("WG", FA_COMBINE_WG);
            }
            Key::Reduce(k) => {
                let code = match k.op {
                    ReduceKind::SumRows => 0,
                    ReduceKind::Mean => 1,
                    ReduceKind::Argmax => 2,
                    ReduceKind::Sum => 3,
                };
                d.set("OP", code);
                d.ty("T0", k.src).ty("DT", k.dst);
                d.set("WG", ROW_WG);
            }
            Key::Shape(k) => {
                let code = match k.op {
                    ShapeKind::Concat => 0,
                    ShapeKind::Repeat => 1,
                    ShapeKind::Pad => 2,
                    ShapeKind::DiagMaskInf => 3,
                    ShapeKind::Arange => 4,
                };
                d.set("OP", code);
                d.set("RAW", u32::from(k.t == DType::I32));
                d.ty("T0", k.t).ty("T1", k.t).ty("DT", k.dst);
                d.set("WG", ew_wg(k.dst));
            }
            Key::Moe(k) => {
                let (code, dst, wg) = match k.op {
                    MoeKind::AddId => (1, DType::F32, EW_WG),
                    MoeKind::Sort => (2, DType::I32, ROW_WG),
                    MoeKind::Bucket => (3, DType::I32, ROW_WG),
                    MoeKind::Router => (4, DType::F32, ROW_WG),
                    MoeKind::WeightedSum => (5, DType::F32, EW_WG),
                };
                d.set("OP", code);
                d.ty("T2", DType::I32).ty("DT", dst);
                d.set("WG", wg);
            }
        }
        d.0
    }
}

/// A define list being built, sorted by name.
struct Defines(Vec<(&'static str, u32)>);

impl Defines {
    /// Sets define `name`.
    fn set(&mut self, name: &'static str, value: u32) -> &mut Self {
        match self.0.binary_search_by(|(n, _)| n.cmp(&name)) {
            Ok(i) => self.0[i].1 = value,
            Err(i) => self.0.insert(i, (name, value)),
        }
        self
    }

    /// Sets the type define `name` (T0..T3, DT) to a type.
    fn ty(&mut self, name: &'static str, t: DType) -> &mut Self {
        self.set(name, t.gguf_id())
    }

    /// The defines every flash attention entry point has.
    fn attn(&mut self, a: Attn) {
        self.set("DMAX", a.dmax);
        self.ty("T1", a.k).ty("T2", a.v).ty("T3", a.mask);
        self.set("SINKS", u32::from(a.sinks));
    }
}
