//! The WGSL sources (`shaders/`, one file per op family) and the one mechanism that makes
//! their variants: a tiny template step.
//!
//! # The template step
//!
//! A [`Variant`] is a typed key (`keys` module: one struct per entry point, whose fields
//! are the variant's parameters) and the F16 setting of the device; [`crate::keys::Key::defines`]
//! turns it into integer defines, in that one place. Its source is `common.wgsl`, then
//! `dequant.wgsl` for the families that read quantized blocks, then `quantize.wgsl` when the
//! destination type is quantized, then the family's file, expanded line by line:
//!
//! - `{{NAME}}` is replaced by the define's value (a missing define is an error);
//! - `#if NAME` keeps the following lines when NAME is defined and not 0, `#else` (one per
//!   `#if`) flips that, `#endif` closes; blocks nest. NAME must be one of the defines the
//!   family declares ([`Family::defines`] and the common ones): a misspelt or foreign name is
//!   an error, not a silently false block; so is any other directive, and a key that sets a
//!   define its family does not declare.
//!
//! That is all: element types, f16 on or off, subgroups on or off and tile sizes are defines,
//! and the code that differs between variants is a `#if` block or a constant, never a copy.
//! The defines every variant has (with their defaults) are `T0`..`T3` and `DT` (source and
//! destination types as GGUF type ids, 0 = f32), `DST16` and `ATOMIC` (derived: the
//! destination is 16-bit; it is 16-bit or quantized, and written with atomics), `QDST`, `QK`
//! and `KQUANT` (derived: the destination is quantized, its block size, it is a K type),
//! `GRID` (derived: a family that dequantizes reads a lattice i-quant, and its pipeline binds
//! the grids), `WG` (invocations per workgroup, 64), `SUBGROUPS` (0) and `F16` (0; the device sets it
//! when the adapter converts f16 in f32 shaders, naga's SHADER_FLOAT16_IN_FLOAT32). The
//! tiled mat-mat also has `H16` (the adapter has SHADER_F16: `enable f16;` and f16 tiles) and
//! `COOP` (with H16: products on cooperative matrices, `enable wgpu_cooperative_matrix;`).
//!
//! Every variant the backend can build is listed by `all_variants` (test builds), and the unit test
//! `every_variant_validates` runs each through naga's WGSL front end and validator with no
//! GPU, which is why pipelines are built as trusted modules at run time.

use tessera_core::DType;

use crate::keys::{Key, MatMatKey, MatVecQKey};

/// The shared prelude: bindings, parameters, typed loads and stores.
const COMMON: &str = include_str!("../../shaders/common.wgsl");
/// Block dequantization, for the families that read quantized weights.
const DEQUANT: &str = include_str!("../../shaders/dequant.wgsl");
/// Block quantization, for the variants that write quantized blocks.
const QUANTIZE: &str = include_str!("../../shaders/quantize.wgsl");

/// Storage bindings of the mat-vec over Q, K and V (QKV in `shaders/mat_vec_q.wgsl`): dst (Q),
/// Wq, x, Wk, K, the norm weights (or dst again), Wv, V.
pub(crate) const QKV_BINDINGS: usize = 8;

/// Storage bindings of the mat-vec over Q, K and V with the rope and the KV-cache stores
/// fused in (QKV and ROPE in `shaders/mat_vec_q.wgsl`): the rotated Q, Wq, x, Wk, the K cache,
/// the norm weights (or the rotated Q again), Wv, the V cache, the positions, the cache rows
/// (the last two in WGSL bindings 9 and 10: binding 8 holds the parameters).
pub(crate) const QKV_ROPE_BINDINGS: usize = 10;

/// Storage bindings of the fused rope and cache stores (KV in `shaders/rope.wgsl`) with
/// frequency factors: the family's eight, then the factors (WGSL binding 9).
pub(crate) const ROPE_KV_FACTORS_BINDINGS: usize = 9;

/// The shared matrix-product helpers, before each matrix family's file.
const MUL_MAT: (&str, &str) = ("mul_mat", include_str!("../../shaders/mul_mat.wgsl"));
/// What the two mat-mats share, before their files.
const MAT_MAT_COMMON: (&str, &str) = (
    "mat_mat_common",
    include_str!("../../shaders/mat_mat_common.wgsl"),
);

/// An op family: a WGSL file of entry points (after the shared files it includes).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Family {
    /// Unary functions, scale, clamp and copies with conversion.
    Unary,
    /// Binary element-wise ops with broadcasting.
    Binary,
    /// Gated linear units.
    Glu,
    /// rms_norm and norm.
    Norm,
    /// soft_max with mask, scale and ALiBi.
    SoftMax,
    /// Rotary position embedding.
    Rope,
    /// get_rows and set_rows.
    Rows,
    /// The float mat-vec.
    MatVec,
    /// The integer-dot mat-vec and its fused forms.
    MatVecQ,
    /// The columns of a mat-vec quantized once for the integer-dot mat-vec.
    QuantCols,
    /// The tiled mat-mat.
    MatMat,
    /// The cooperative-matrix mat-mat.
    MatMatCoop,
    /// Fused attention.
    FlashAttn,
    /// Sums, means and argmax.
    Reduce,
    /// concat, repeat, pad, diag_mask_inf, arange.
    Shape,
    /// mul_mat_id, add_id, argsort and top_k.
    Moe,
}

impl Family {
    /// Every family.
    #[cfg(test)]
    pub const ALL: [Family; 16] = [
        Family::Unary,
        Family::Binary,
        Family::Glu,
        Family::Norm,
        Family::SoftMax,
        Family::Rope,
        Family::Rows,
        Family::MatVec,
        Family::MatVecQ,
        Family::QuantCols,
        Family::MatMat,
        Family::MatMatCoop,
        Family::FlashAttn,
        Family::Reduce,
        Family::Shape,
        Family::Moe,
    ];

    /// The family's name (its file's).
    pub(crate) fn name(self) -> &'static str {
        self.files().last().map_or("", |f| f.0)
    }

    /// The family's files (name and source) after the common ones: the shared files it
    /// includes, then its own.
    fn files(self) -> &'static [(&'static str, &'static str)] {
        match self {
            Family::Unary => &[("unary", include_str!("../../shaders/unary.wgsl"))],
            Family::Binary => &[("binary", include_str!("../../shaders/binary.wgsl"))],
            Family::Glu => &[("glu", include_str!("../../shaders/glu.wgsl"))],
            Family::Norm => &[("norm", include_str!("../../shaders/norm.wgsl"))],
            Family::SoftMax => &[("soft_max", include_str!("../../shaders/soft_max.wgsl"))],
            Family::Rope => &[("rope", include_str!("../../shaders/rope.wgsl"))],
            Family::Rows => &[("rows", include_str!("../../shaders/rows.wgsl"))],
            Family::MatVec => &[
                MUL_MAT,
                ("mat_vec", include_str!("../../shaders/mat_vec.wgsl")),
            ],
            Family::MatVecQ => &[
                MUL_MAT,
                ("mat_vec_q", include_str!("../../shaders/mat_vec_q.wgsl")),
            ],
            Family::QuantCols => &[
                MUL_MAT,
                ("quant_cols", include_str!("../../shaders/quant_cols.wgsl")),
            ],
            Family::MatMat => &[
                MUL_MAT,
                MAT_MAT_COMMON,
                ("mat_mat", include_str!("../../shaders/mat_mat.wgsl")),
            ],
            Family::MatMatCoop => &[
                MUL_MAT,
                MAT_MAT_COMMON,
                (
                    "mat_mat_coop",
                    include_str!("../../shaders/mat_mat_coop.wgsl"),
                ),
            ],
            Family::FlashAttn => &[("flash_attn", include_str!("../../shaders/flash_attn.wgsl"))],
            Family::Reduce => &[("reduce", include_str!("../../shaders/reduce.wgsl"))],
            Family::Shape => &[("shape", include_str!("../../shaders/shape.wgsl"))],
            Family::Moe => &[("moe", include_str!("../../shaders/moe.wgsl"))],
        }
    }

    /// The define names the family's files may test besides [`COMMON_DEFINES`] (an `#if` of
    /// any other name is an error).
    pub(crate) fn defines(self) -> &'static [&'static str] {
        match self {
            Family::Unary | Family::Binary | Family::Glu | Family::Reduce => &["OP"],
            Family::Norm => &["OP", "MUL", "ADD"],
            Family::SoftMax => &[],
            Family::Rope => &["KV", "FACTORS", "BLEND"],
            Family::Rows => &["OP", "QUANT"],
            Family::Moe => &["OP"],
            Family::Shape => &["OP", "RAW"],
            // mul_mat.wgsl's (KK, MMPAIR, YK), then the family's own.
            Family::MatVec => &[
                "KK", "MMPAIR", "YK", "GELU", "GLU", "ID", "QB", "ROWS", "TPB",
            ],
            Family::MatVecQ => &[
                "KK", "MMPAIR", "YK", "ADD", "GELU", "GLU", "ID", "KC", "MC", "MM", "NC", "NORM",
                "ONECOL", "PAIR", "PF2", "PQ", "QB", "QF", "QKV", "QPS", "ROPE", "ROWS", "RS",
                "RSUB", "TPB", "TPR", "W2", "YC",
            ],
            Family::QuantCols => &["KK", "MMPAIR", "YK", "NORM"],
            Family::MatMat => &["KK", "MMPAIR", "YK", "BK", "BM", "BN", "QUANT", "HK", "ID"],
            Family::MatMatCoop => &["KK", "MMPAIR", "YK", "BK", "BM", "BN", "QUANT", "FM4"],
            Family::FlashAttn => &[
                "COMBINE", "DECODE", "DMAX", "KU", "OT4", "PKV16", "PREFILL", "SINKS", "SPLIT",
            ],
        }
    }

    /// Whether the family reads quantized blocks (and so includes `dequant.wgsl`).
    fn dequantizes(self) -> bool {
        matches!(
            self,
            Family::Rows
                | Family::Unary
                | Family::MatVec
                | Family::MatVecQ
                | Family::QuantCols
                | Family::MatMat
                | Family::MatMatCoop
        )
    }

    /// Storage bindings its shaders use: the destination and the sources.
    pub fn storage_bindings(self) -> usize {
        match self {
            Family::Unary | Family::Reduce => 2,
            // The scratch written, the norm weights (NORM; else the scratch again), the columns.
            Family::QuantCols => 3,
            Family::Binary
            | Family::Glu
            | Family::Norm
            | Family::SoftMax
            | Family::Rows
            | Family::Shape => 3,
            Family::Moe => 4,
            Family::FlashAttn => 5,
            // The fused mat-vecs read a residual or a second weight matrix (and may write a
            // second result), and the weights of an rms_norm they compute (binding 5); the one
            // over Q, K and V two more ([`Variant::storage_bindings`]).
            Family::MatVec | Family::MatVecQ | Family::MatMat | Family::MatMatCoop => 6,
            // The fused rope of Q and K with the stores of K and V into their caches.
            Family::Rope => 8,
        }
    }
}

/// Define names every family may test: the types, F16, SUBGROUPS and WG that every variant
/// has, the ones the template step derives from DT, and the load widths, the weights' second
/// binding (W3) and f16 settings that `common.wgsl`, `dequant.wgsl` and `quantize.wgsl` read.
const COMMON_DEFINES: [&str; 21] = [
    "T0",
    "T1",
    "T2",
    "T3",
    "DT",
    "F16",
    "SUBGROUPS",
    "WG",
    "DST16",
    "ATOMIC",
    "QDST",
    "QK",
    "KQUANT",
    "A4",
    "AL",
    "Y4",
    "B4",
    "W3",
    "H16",
    "COOP",
    "GRID",
];

/// The GGUF ids of the lattice i-quants, whose blocks index the grids (GRID).
const LATTICE_IDS: [u32; 7] = [16, 17, 18, 19, 21, 22, 29];

/// Whether a variant of `family` whose src0 has GGUF type id `t0` reads the lattice grids.
fn reads_grid(family: Family, t0: u32) -> bool {
    family.dequantizes() && LATTICE_IDS.contains(&t0)
}

/// One pipeline: a typed key (family, entry point and parameters) and whether the adapter
/// converts f16 in f32 shaders (the F16 define, naga's SHADER_FLOAT16_IN_FLOAT32).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Variant {
    /// The entry point and its parameters.
    pub key: Key,
    /// The F16 define.
    pub f16: bool,
}

impl Variant {
    /// The variant of `key` (F16 off).
    pub fn new(key: Key) -> Self {
        Variant { key, f16: false }
    }

    /// The family (file).
    pub fn family(&self) -> Family {
        self.key.entry().0
    }

    /// The entry point.
    pub fn entry(&self) -> &'static str {
        self.key.entry().1
    }

    /// The variant's defines, sorted by name (the key's, and F16).
    pub fn defines(&self) -> Vec<(&'static str, u32)> {
        let mut defs = self.key.defines();
        let i = defs.partition_point(|(n, _)| *n < "F16");
        defs.insert(i, ("F16", u32::from(self.f16)));
        defs
    }

    /// A define's value (for naming a variant; plans set fields of its key).
    pub fn get(&self, name: &str) -> Option<u32> {
        self.defines()
            .iter()
            .find(|(n, _)| *n == name)
            .map(|&(_, v)| v)
    }

    /// Its integer-dot mat-vec key, where it is one.
    pub fn mat_vec_q(&self) -> Option<&MatVecQKey> {
        match &self.key {
            Key::MatVecQ(k) => Some(k),
            _ => None,
        }
    }

    /// The variant with `f` applied to its integer-dot mat-vec key (unchanged where it is not
    /// one).
    pub fn with_mat_vec_q(mut self, f: impl FnOnce(&mut MatVecQKey)) -> Self {
        if let Key::MatVecQ(k) = &mut self.key {
            f(k);
        }
        self
    }

    /// Its mat-mat key, where it is one.
    pub fn mat_mat(&self) -> Option<&MatMatKey> {
        match &self.key {
            Key::MatMat(k) => Some(k),
            _ => None,
        }
    }

    /// Storage bindings of the variant's pipeline: its family's, or [`QKV_BINDINGS`] for the
    /// mat-vec over Q, K and V (V's weights and result in bindings 6 and 7), or
    /// [`QKV_ROPE_BINDINGS`] for that mat-vec with the rope and the cache stores,
    /// [`ROPE_KV_FACTORS_BINDINGS`] for the fused rope and cache stores with frequency factors,
    /// 4 for the norm with a residual added (its src2), or 6 for attention with sinks.
    pub fn storage_bindings(&self) -> usize {
        match self.key {
            Key::MatVecQ(k) if k.rope.is_some() => QKV_ROPE_BINDINGS,
            Key::MatVecQ(k) if k.qkv => QKV_BINDINGS,
            Key::Rope(k) if k.kv_cache.is_some() && k.factors => ROPE_KV_FACTORS_BINDINGS,
            Key::Norm(k) if k.add => 4,
            Key::FlashAttn(k) if k.attn.sinks => 6,
            Key::FlashAttnDecode(k) if k.attn.sinks => 6,
            _ => self.family().storage_bindings(),
        }
    }

    /// Whether its pipeline binds the lattice grids (the GRID define: a family that
    /// dequantizes, reading a lattice i-quant).
    pub fn grid(&self) -> bool {
        reads_grid(self.family(), self.get("T0").unwrap_or(0))
    }

    /// A label for logs and errors: `family.entry[A=1,B=2]`.
    pub fn label(&self) -> String {
        let defs: Vec<String> = self
            .defines()
            .iter()
            .map(|(n, v)| format!("{n}={v}"))
            .collect();
        format!(
            "{}.{}[{}]",
            self.family().name(),
            self.entry(),
            defs.join(",")
        )
    }

    /// The expanded WGSL source.
    pub fn source(&self) -> Result<String, String> {
        Source::new(self)?.build()
    }
}

/// A variant's defines (with the derived ones) and the names its family may test.
struct Source {
    family: Family,
    label: String,
    defs: Vec<(&'static str, u32)>,
}

impl Source {
    /// The defines of `v`, with DST16 and ATOMIC (the destination is 16-bit; it is 16-bit or
    /// quantized, and written with atomics), QDST, QK and KQUANT (it is quantized, its block
    /// size, it is a K type) derived from DT, and GRID ([`Variant::grid`]); an error where the
    /// key sets a define its family does not declare.
    fn new(v: &Variant) -> Result<Source, String> {
        let mut defs = v.defines();
        let dt = v.get("DT").unwrap_or(0);
        let dst16 = u32::from(dt == DType::F16.gguf_id() || dt == DType::BF16.gguf_id());
        let qk = DType::ALL
            .iter()
            .find(|t| t.is_quantized() && t.gguf_id() == dt)
            .map_or(0, |t| t.block_size() as u32);
        let qdst = u32::from(qk > 0);
        for d in [
            ("DST16", dst16),
            ("ATOMIC", dst16 | qdst),
            ("QDST", qdst),
            ("QK", qk),
            ("KQUANT", u32::from(qk == 256)),
            ("GRID", u32::from(v.grid())),
        ] {
            match defs.binary_search_by(|(n, _)| n.cmp(&d.0)) {
                Ok(i) => defs[i].1 = d.1,
                Err(i) => defs.insert(i, d),
            }
        }
        let s = Source {
            family: v.family(),
            label: v.label(),
            defs,
        };
        if let Some((n, _)) = s.defs.iter().find(|(n, _)| !s.declared(n)) {
            return Err(format!(
                "{}: define {n} is not one of the {} family's",
                s.label,
                s.family.name()
            ));
        }
        Ok(s)
    }

    /// Whether the family declares define `name`.
    fn declared(&self, name: &str) -> bool {
        COMMON_DEFINES.contains(&name) || self.family.defines().contains(&name)
    }

    /// A define's value.
    fn get(&self, name: &str) -> Option<u32> {
        self.defs.iter().find(|(n, _)| *n == name).map(|(_, v)| *v)
    }

    /// The source: `common.wgsl`, `dequant.wgsl` for the families that read quantized blocks,
    /// `quantize.wgsl` where the destination is quantized, then the family's files.
    fn build(&self) -> Result<String, String> {
        let mut out = String::new();
        self.expand("common", COMMON, &mut out)?;
        if self.family.dequantizes() {
            self.expand("dequant", DEQUANT, &mut out)?;
        }
        if self.get("QDST").is_some_and(|q| q != 0) {
            self.expand("quantize", QUANTIZE, &mut out)?;
        }
        for (name, text) in self.family.files() {
            self.expand(name, text, &mut out)?;
        }
        Ok(out)
    }

    /// Expands one file into `out`.
    fn expand(&self, file: &str, text: &str, out: &mut String) -> Result<(), String> {
        // Each open block: (whether its enclosing block is kept, whether this branch is kept,
        // whether it has had its #else).
        let mut stack: Vec<(bool, bool, bool)> = Vec::new();
        let kept =
            |s: &Vec<(bool, bool, bool)>| s.last().is_none_or(|&(outer, this, _)| outer && this);
        for (n, line) in text.lines().enumerate() {
            let where_ = || format!("{file}.wgsl:{}", n + 1);
            let t = line.trim();
            if let Some(name) = t.strip_prefix("#if ") {
                let name = name.trim();
                if !self.declared(name) {
                    return Err(format!(
                        "{}: #if {name}: no such define in the {} family",
                        where_(),
                        self.family.name()
                    ));
                }
                let on = self.get(name).is_some_and(|v| v != 0);
                let outer = kept(&stack);
                stack.push((outer, on, false));
            } else if t.starts_with('#') {
                match t {
                    "#else" => {
                        let top = stack
                            .last_mut()
                            .ok_or_else(|| format!("{}: #else without #if", where_()))?;
                        if top.2 {
                            return Err(format!("{}: a second #else for one #if", where_()));
                        }
                        top.1 = !top.1;
                        top.2 = true;
                    }
                    "#endif" => {
                        stack
                            .pop()
                            .ok_or_else(|| format!("{}: #endif without #if", where_()))?;
                    }
                    _ => return Err(format!("{}: unknown directive {t}", where_())),
                }
            } else if kept(&stack) {
                let mut rest = line;
                while let Some(start) = rest.find("{{") {
                    let end = rest[start..]
                        .find("}}")
                        .ok_or_else(|| format!("{}: unclosed {{{{", where_()))?
                        + start;
                    let name = &rest[start + 2..end];
                    let value = self.get(name).ok_or_else(|| {
                        format!("{}: no define {name} in {}", where_(), self.label)
                    })?;
                    out.push_str(&rest[..start]);
                    out.push_str(&value.to_string());
                    rest = &rest[end + 2..];
                }
                out.push_str(rest);
                out.push('\n');
            }
        }
        if stack.is_empty() {
            Ok(())
        } else {
            Err(format!("{file}.wgsl: #if without #endif"))
        }
    }
}

/// Every variant the backend can build, for the offline validation test.
#[cfg(test)]
pub(crate) fn all_variants() -> Vec<Variant> {
    let mut v = Vec::new();
    for f in Family::ALL {
        for sub in [false, true] {
            for f16 in [false, true] {
                v.extend(
                    crate::ops::variants(f, sub)
                        .into_iter()
                        .map(|x| Variant { f16, ..x }),
                );
            }
        }
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Parses and validates one source with naga, with f16 and subgroup capabilities where
    /// the variant uses them.
    fn validate(v: &Variant) -> Result<(), String> {
        validated(v).map(|_| ())
    }

    /// [`validate`], returning the module and its validation info.
    fn validated(v: &Variant) -> Result<(naga::Module, naga::valid::ModuleInfo), String> {
        let src = v.source()?;
        let module = naga::front::wgsl::parse_str(&src).map_err(|e| e.emit_to_string(&src))?;
        let mut caps = naga::valid::Capabilities::empty();
        if v.get("SUBGROUPS").is_some_and(|s| s != 0) {
            caps |= naga::valid::Capabilities::SUBGROUP;
        }
        if v.get("F16").is_some_and(|s| s != 0) {
            caps |= naga::valid::Capabilities::SHADER_FLOAT16_IN_FLOAT32;
        }
        if v.get("H16").is_some_and(|s| s != 0) {
            caps |= naga::valid::Capabilities::SHADER_FLOAT16;
        }
        if v.get("COOP").is_some_and(|s| s != 0) {
            caps |= naga::valid::Capabilities::COOPERATIVE_MATRIX;
        }
        let mut validator = naga::valid::Validator::new(naga::valid::ValidationFlags::all(), caps);
        if caps.contains(naga::valid::Capabilities::SUBGROUP) {
            validator.subgroup_stages(naga::valid::ShaderStages::COMPUTE);
            validator.subgroup_operations(naga::valid::SubgroupOperationSet::all());
        }
        let info = validator
            .validate(&module)
            .map_err(|e| e.emit_to_string(&src))?;
        if !module.entry_points.iter().any(|e| e.name == v.entry()) {
            return Err(format!("no entry point {}", v.entry()));
        }
        Ok((module, info))
    }

    /// The cooperative-matrix mat-mat variants also go through naga's SPIR-V writer (the path
    /// Vulkan takes; the feature is experimental in naga, and no CI adapter offers it).
    #[test]
    fn coop_variants_write_spirv() {
        let coop: Vec<Variant> = all_variants()
            .into_iter()
            .filter(|v| v.get("COOP").is_some_and(|c| c != 0))
            .collect();
        assert!(!coop.is_empty());
        for v in &coop {
            let (module, info) = validated(v).unwrap();
            let words = naga::back::spv::write_vec(&module, &info, &Default::default(), None)
                .unwrap_or_else(|e| panic!("{}: {e}", v.label()));
            assert!(words.len() > 100);
        }
    }

    #[test]
    fn every_variant_validates() {
        let all = all_variants();
        assert!(all.len() > 100, "only {} variants", all.len());
        let mut failures = Vec::new();
        for v in &all {
            if let Err(e) = validate(v) {
                failures.push(format!("{}:\n{e}", v.label()));
            }
        }
        assert!(
            failures.is_empty(),
            "{} of {} variants fail:\n{}",
            failures.len(),
            all.len(),
            failures.join("\n")
        );
    }

    /// A source of the norm family (which declares OP and MUL) with MUL=1.
    fn norm_source() -> Source {
        Source {
            family: Family::Norm,
            label: "test".into(),
            defs: vec![("MUL", 1), ("OP", 0), ("WG", 64)],
        }
    }

    #[test]
    fn template_expands_and_rejects() {
        let s = norm_source();
        let mut out = String::new();
        s.expand(
            "t",
            "x{{WG}}y\n#if MUL\nkeep\n#if OP\ndrop\n#else\nkeep2\n#endif\n#else\ndrop2\n#endif\n",
            &mut out,
        )
        .unwrap();
        assert_eq!(out, "x64y\nkeep\nkeep2\n");
        // A declared define the variant does not set is off.
        let mut out = String::new();
        s.expand("t", "#if SUBGROUPS\ndrop\n#endif\n", &mut out)
            .unwrap();
        assert_eq!(out, "");
        assert!(s.expand("t", "{{NOPE}}", &mut String::new()).is_err());
        assert!(s.expand("t", "#if MUL\n", &mut String::new()).is_err());
        assert!(s.expand("t", "#endif\n", &mut String::new()).is_err());
        assert!(s
            .expand("t", "#if MUL\n#else\n#else\n#endif\n", &mut String::new())
            .is_err());
        assert!(s
            .expand("t", "#ifdef MUL\n#endif\n", &mut String::new())
            .is_err());
    }

    /// An `#if` of a define the family does not declare (a misspelling, or another family's)
    /// is an error, even inside a block that is dropped.
    #[test]
    fn misspelt_define_is_rejected() {
        let s = norm_source();
        let e = s
            .expand("t", "#if MULL\nx\n#endif\n", &mut String::new())
            .unwrap_err();
        assert!(e.contains("MULL"), "{e}");
        let e = s
            .expand("t", "#if OP\n#if QKV\n#endif\n#endif\n", &mut String::new())
            .unwrap_err();
        assert!(e.contains("QKV"), "{e}");
    }
}
