//! add, sub, mul, div (src1 broadcast over src0), scale, clamp: contiguous, mixed types,
//! broadcast over each dim, and strided or permuted views.

use tessera_core::{BinaryOp, DType};

use super::{ne_str, permuted, strided};
use crate::case::{Case, Tolerance};
use crate::init::Init;

const OPS: [(BinaryOp, &str); 4] = [
    (BinaryOp::Add, "ADD"),
    (BinaryOp::Sub, "SUB"),
    (BinaryOp::Mul, "MUL"),
    (BinaryOp::Div, "DIV"),
];

/// src1's values: away from zero for div.
fn rhs_init(op: BinaryOp) -> Init {
    if op == BinaryOp::Div {
        Init::Uniform(0.5, 2.0)
    } else {
        Init::Uniform(-1.0, 1.0)
    }
}

/// How src0 is laid out.
#[derive(Clone, Copy, PartialEq)]
enum Layout {
    Contiguous,
    /// Rows further apart than their length.
    Strided,
    /// Dims 1 and 2 swapped (both operands).
    Permuted,
    /// Dims 0 and 1 swapped (elements not contiguous).
    Transposed,
}

impl Layout {
    fn name(self) -> &'static str {
        match self {
            Layout::Contiguous => "",
            Layout::Strided => ",v=strided",
            Layout::Permuted => ",v=permuted",
            Layout::Transposed => ",v=transposed",
        }
    }
}

fn binary_case(
    op: BinaryOp,
    name: &'static str,
    ta: DType,
    tb: DType,
    ne: [usize; 4],
    nr: [usize; 4],
    layout: Layout,
) -> Case {
    let params = format!(
        "type_a={ta},type_b={tb},ne={},nr={}{}",
        ne_str(&ne),
        ne_str(&nr),
        layout.name()
    );
    Case::new(name, params, &[ta, tb], Tolerance::DEFAULT, move |g| {
        let ne_a = [ne[0] * nr[0], ne[1] * nr[1], ne[2] * nr[2], ne[3] * nr[3]];
        let u = Init::Uniform(-1.0, 1.0);
        let (a, b) = match layout {
            Layout::Contiguous => (g.leaf(ta, &ne_a)?, g.input(tb, &ne, rhs_init(op))?),
            Layout::Strided => (strided(g, ta, ne_a, 3, u)?, g.input(tb, &ne, rhs_init(op))?),
            Layout::Permuted => (
                permuted(g, ta, ne_a, [0, 2, 1, 3], u)?,
                permuted(g, tb, ne, [0, 2, 1, 3], rhs_init(op))?,
            ),
            Layout::Transposed => (
                permuted(g, ta, ne_a, [1, 0, 2, 3], u)?,
                g.input(tb, &ne, rhs_init(op))?,
            ),
        };
        match op {
            BinaryOp::Add => g.add(a, b),
            BinaryOp::Sub => g.sub(a, b),
            BinaryOp::Mul => g.mul(a, b),
            BinaryOp::Div => g.div(a, b),
        }
    })
}

/// Every binary, scale and clamp case.
pub(super) fn cases(v: &mut Vec<Case>) {
    let ne = [10, 5, 4, 3];
    let broadcasts = [
        [1, 1, 1, 1],
        [2, 1, 1, 1],
        [1, 2, 1, 1],
        [1, 1, 2, 1],
        [1, 1, 1, 2],
        [2, 2, 2, 2],
    ];
    for (op, name) in OPS {
        for t in [DType::F32, DType::F16] {
            for nr in broadcasts {
                v.push(binary_case(op, name, t, t, ne, nr, Layout::Contiguous));
            }
            for layout in [Layout::Strided, Layout::Permuted] {
                v.push(binary_case(op, name, t, t, ne, [1, 2, 1, 1], layout));
            }
        }
        for (ta, tb) in [(DType::F32, DType::F16), (DType::F16, DType::F32)] {
            v.push(binary_case(
                op,
                name,
                ta,
                tb,
                ne,
                [2, 2, 1, 1],
                Layout::Contiguous,
            ));
        }
        v.push(binary_case(
            op,
            name,
            DType::BF16,
            DType::BF16,
            ne,
            [1, 1, 2, 1],
            Layout::Contiguous,
        ));
        v.push(binary_case(
            op,
            name,
            DType::F32,
            DType::F32,
            [16, 3, 2, 1],
            [1, 1, 1, 1],
            Layout::Transposed,
        ));
        v.push(binary_case(
            op,
            name,
            DType::F32,
            DType::F32,
            [1, 1, 1, 1],
            [64, 3, 2, 1],
            Layout::Contiguous,
        ));
    }
    // A projection's bias (Qwen 2's Q, K and V): [n] added to every token's [n].
    for (n, tokens) in [(896, 7), (128, 1), (2560, 3)] {
        v.push(binary_case(
            BinaryOp::Add,
            "ADD",
            DType::F32,
            DType::F32,
            [n, 1, 1, 1],
            [1, tokens, 1, 1],
            Layout::Contiguous,
        ));
    }
    scale_clamp(v);
}

fn scale_clamp(v: &mut Vec<Case>) {
    for t in [DType::F32, DType::F16] {
        for (s, b) in [(0.5f32, 0.0f32), (2.5, -1.25)] {
            for ne in [[10, 10, 10, 10], [33, 3, 1, 1]] {
                v.push(Case::new(
                    "SCALE",
                    format!("type={t},ne={},scale={s},bias={b}", ne_str(&ne)),
                    &[t],
                    Tolerance::DEFAULT,
                    move |g| {
                        let a = g.leaf(t, &ne)?;
                        g.scale_bias(a, s, b)
                    },
                ));
            }
        }
        v.push(Case::new(
            "SCALE",
            format!("type={t},ne=[10,5,4,3],scale=3,bias=0.5,v=permuted"),
            &[t],
            Tolerance::DEFAULT,
            move |g| {
                let a = permuted(g, t, [10, 5, 4, 3], [0, 2, 1, 3], Init::Uniform(-1.0, 1.0))?;
                g.scale_bias(a, 3.0, 0.5)
            },
        ));
        for (lo, hi) in [(-0.5f32, 0.5f32), (-0.1, 0.8)] {
            v.push(Case::new(
                "CLAMP",
                format!("type={t},ne=[10,5,4,3],min={lo},max={hi}"),
                &[t],
                Tolerance::DEFAULT,
                move |g| {
                    let a = g.leaf(t, &[10, 5, 4, 3])?;
                    g.clamp(a, lo, hi)
                },
            ));
        }
    }
}
