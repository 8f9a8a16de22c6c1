//! Running one case on one device: bind every root tensor in one buffer with a sentinel after
//! it, fill inputs, poison results, compute, then check the sentinels and inputs and read the
//! compared tensor back as f64.

use std::sync::Arc;

use rand::rngs::StdRng;
use rand::SeedableRng;
use tessera_core::{Backend, Buffer, Device, Error, Graph, Op, TensorId};

use crate::case::Case;
use crate::init::POISON;
use crate::tensor_io;

/// Bytes of sentinel after every tensor.
const SENTINEL: usize = 64;

/// The byte at position `i` of a sentinel (or of the padding between tensors).
fn sentinel_byte(i: usize) -> u8 {
    0xA5 ^ (i as u8).wrapping_mul(29)
}

/// Why a case did not produce a comparable output.
#[derive(Debug)]
pub(crate) enum Stop {
    /// The device cannot run it.
    Skip(String),
    /// It ran wrong (or the case itself is broken).
    Fail(String),
}

impl Stop {
    /// An error from a device call: unsupported means skip, anything else a failure.
    fn from_error(what: &str, e: Error) -> Stop {
        match e {
            Error::Unsupported { .. } => Stop::Skip(e.to_string()),
            Error::OutOfMemory { .. } => Stop::Skip(format!("{what}: {e}")),
            _ => Stop::Fail(format!("{what}: {e}")),
        }
    }
}

/// One root tensor's place in the buffer.
struct Slot {
    id: TensorId,
    offset: usize,
    len: usize,
    /// The bytes put there before the run.
    before: Vec<u8>,
    /// Whether the run may change them (a computed result, or a destination written in place).
    written: bool,
}

/// A case bound to a device's memory, ready to run.
pub(crate) struct Prepared {
    /// The graph, every root bound.
    pub graph: Graph,
    /// Every tensor id, in order (what compute is given).
    pub nodes: Vec<TensorId>,
    /// The root of the compared tensor.
    pub out: TensorId,
    buffer: Arc<dyn Buffer>,
    slots: Vec<Slot>,
    image: Vec<u8>,
    /// Where the result is a view into part of its root (a cpy into a strided view): which
    /// bytes of the root the view covers; the rest must not change.
    covered: Option<Vec<bool>>,
}

fn align_up(x: usize, a: usize) -> usize {
    x.div_ceil(a.max(1)) * a.max(1)
}

/// Whether node `id` runs a kernel (not a leaf, not a view).
pub(crate) fn is_computed(graph: &Graph, id: TensorId) -> bool {
    let op = &graph.get(id).op;
    *op != Op::None && !op.is_view()
}

/// Builds the case on `device`: checks support, lays out and fills the buffer.
pub(crate) fn prepare(device: &dyn Device, case: &Case, seed: u64) -> Result<Prepared, Stop> {
    let (cg, out) = case
        .build()
        .map_err(|e| Stop::Fail(format!("building the graph: {e}")))?;
    let nodes: Vec<TensorId> = cg.ids().collect();
    for &id in &nodes {
        if is_computed(&cg, id) && !device.supports_op(&cg, id) {
            let t = cg.get(id);
            let types: Vec<&str> = t.src.iter().map(|&s| cg.get(s).dtype.name()).collect();
            return Err(Stop::Skip(format!(
                "{} does not support {} ({} -> {})",
                device.name(),
                t.op.name(),
                types.join(","),
                t.dtype
            )));
        }
    }
    // Roots written by the graph: computed roots, and the roots of in-place results.
    let mut written = vec![false; cg.len()];
    for &id in &nodes {
        if is_computed(&cg, id) {
            written[cg.root(id).0.index()] = true;
        }
    }
    let bt = device.buffer_type();
    let align = bt.alignment();
    let mut rng = StdRng::seed_from_u64(seed);
    let mut slots = Vec::new();
    let mut end = 0;
    for &id in &nodes {
        let t = cg.get(id);
        if t.view_src.is_some() {
            continue;
        }
        let offset = align_up(end, align);
        let len = t.nbytes();
        let before = if t.op == Op::None {
            cg.init(id)
                .bytes(t, &mut rng)
                .map_err(|e| Stop::Fail(format!("filling {}: {e}", cg.label(id))))?
        } else {
            vec![POISON; len]
        };
        end = offset + len + SENTINEL;
        slots.push(Slot {
            id,
            offset,
            len,
            before,
            written: written[id.index()],
        });
    }
    let size = align_up(end, align);
    let mut image: Vec<u8> = (0..size).map(sentinel_byte).collect();
    for s in &slots {
        image[s.offset..s.offset + s.len].copy_from_slice(&s.before);
    }
    let buffer = bt
        .alloc(size)
        .map_err(|e| Stop::from_error("allocating", e))?;
    buffer
        .set(0, &image)
        .map_err(|e| Stop::from_error("writing inputs", e))?;
    let mut graph = cg.into_graph();
    for s in &slots {
        graph
            .bind(s.id, buffer.clone(), s.offset)
            .map_err(|e| Stop::Fail(format!("binding: {e}")))?;
    }
    let covered = view_coverage(&graph, out);
    let out = graph.root(out).0;
    Ok(Prepared {
        graph,
        nodes,
        out,
        buffer,
        slots,
        image,
        covered,
    })
}

/// For a result that is a view into its root: the root's bytes its elements cover.
fn view_coverage(graph: &Graph, id: TensorId) -> Option<Vec<bool>> {
    let (root, offset) = graph.root(id);
    if root == id {
        return None;
    }
    let t = graph.get(id);
    let mut covered = vec![false; graph.get(root).nbytes()];
    let (n0, width) = if t.dtype.is_quantized() {
        (1, t.row_bytes())
    } else {
        (t.ne[0], t.dtype.type_size())
    };
    for i3 in 0..t.ne[3] {
        for i2 in 0..t.ne[2] {
            for i1 in 0..t.ne[1] {
                for i0 in 0..n0 {
                    let at = offset + i0 * t.nb[0] + i1 * t.nb[1] + i2 * t.nb[2] + i3 * t.nb[3];
                    let end = (at + width).min(covered.len());
                    covered[at.min(end)..end].iter_mut().for_each(|c| *c = true);
                }
            }
        }
    }
    Some(covered)
}

/// Opens a backend on `device`.
pub(crate) fn backend(device: &dyn Device) -> Result<Box<dyn Backend>, Stop> {
    device
        .new_backend()
        .map_err(|e| Stop::from_error("opening a backend", e))
}

/// Computes the whole graph once and waits for it.
pub(crate) fn run(backend: &mut dyn Backend, p: &Prepared) -> Result<(), Stop> {
    backend
        .compute(&p.graph, &p.nodes)
        .map_err(|e| Stop::from_error("compute", e))?;
    backend
        .synchronize()
        .map_err(|e| Stop::from_error("synchronize", e))
}

/// Reads the buffer back, checks that nothing outside the written tensors changed, and returns
/// the compared tensor's values.
pub(crate) fn collect(p: &Prepared) -> Result<Vec<f64>, Stop> {
    let mut after = vec![0u8; p.image.len()];
    p.buffer
        .get(0, &mut after)
        .map_err(|e| Stop::from_error("reading back", e))?;
    let mut covered = 0;
    for s in &p.slots {
        if let Some(i) = first_difference(&p.image[covered..s.offset], &after[covered..s.offset]) {
            return Err(Stop::Fail(format!(
                "write outside every tensor at byte {}",
                covered + i
            )));
        }
        if !s.written && after[s.offset..s.offset + s.len] != s.before[..] {
            return Err(Stop::Fail(format!(
                "input '{}' was modified",
                p.graph.label(s.id)
            )));
        }
        let tail = s.offset + s.len;
        if let Some(i) = first_difference(
            &p.image[tail..tail + SENTINEL],
            &after[tail..tail + SENTINEL],
        ) {
            return Err(Stop::Fail(format!(
                "write past the end of '{}' (sentinel byte {i} changed)",
                p.graph.label(s.id)
            )));
        }
        covered = tail;
    }
    if let Some(i) = first_difference(&p.image[covered..], &after[covered..]) {
        return Err(Stop::Fail(format!(
            "write past the last tensor at byte {}",
            covered + i
        )));
    }
    let slot = p
        .slots
        .iter()
        .find(|s| s.id == p.out)
        .ok_or_else(|| Stop::Fail("no output slot".into()))?;
    if let Some(covered) = &p.covered {
        let now = &after[slot.offset..slot.offset + slot.len];
        if let Some(i) = (0..slot.len).find(|&i| !covered[i] && now[i] != slot.before[i]) {
            return Err(Stop::Fail(format!(
                "write outside the destination view, at byte {i} of '{}'",
                p.graph.label(p.out)
            )));
        }
    }
    tensor_io::read(
        p.graph.get(p.out),
        &after[slot.offset..slot.offset + slot.len],
    )
    .map_err(|e| Stop::Fail(format!("reading the output: {e}")))
}

fn first_difference(a: &[u8], b: &[u8]) -> Option<usize> {
    a.iter().zip(b).position(|(x, y)| x != y)
}

/// Runs `case` on `device` once and returns the compared tensor's values.
pub(crate) fn execute(device: &dyn Device, case: &Case, seed: u64) -> Result<Vec<f64>, Stop> {
    let p = prepare(device, case, seed)?;
    let mut b = backend(device)?;
    run(b.as_mut(), &p)?;
    collect(&p)
}

/// Bytes that one run reads and writes: every computed node's result and sources.
pub(crate) fn bytes_moved(graph: &Graph) -> usize {
    graph
        .ids()
        .filter(|&id| is_computed(graph, id))
        .map(|id| {
            let t = graph.get(id);
            t.nbytes() + t.src.iter().map(|&s| graph.get(s).nbytes()).sum::<usize>()
        })
        .sum()
}
