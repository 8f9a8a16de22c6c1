//! The key of the caches that reuse work between steps: CUDA graphs, wgpu recordings, meta
//! plans.
//!
//! Work derived from a graph (encoded commands, recorded dispatches, a sharding plan) may be
//! reused for another graph exactly when the two agree in everything the work was derived
//! from: the nodes run and their order, every tensor's type, shape, strides, op and op
//! parameters, sources, view and flags, the memory each tensor is bound to (buffer and
//! offset), and the backend's own settings that shape the work (fusion on or off, profiling,
//! its scratch memory). A [`GraphKey`] holds all of that, never a graph's address: a model
//! that builds a fresh graph of the same structure every step finds its work again.
//!
//! Buffers are compared by identity (their address). A key made by [`GraphKey::new`] holds the
//! buffers it names, so no other buffer can take one's address while the key lives; a cache
//! that drops a key lets them go. A cache that forgets every key binding a buffer before that
//! buffer is freed (as wgpu's recordings do) makes its keys with [`GraphKey::unheld`] instead,
//! so that keeping work never keeps memory.
//!
//! [`Graph::stamp`] is a fast path: a graph whose stamp is the key's has not changed since the
//! key was made from it, so only the nodes and settings are compared.

use std::hash::{Hash, Hasher};
use std::sync::Arc;

use crate::backend::Buffer;
use crate::dtype::DType;
use crate::graph::Graph;
use crate::op::Op;
use crate::tensor::{TensorFlags, TensorId, MAX_DIMS};

/// What identifies a tensor in a [`GraphKey`].
#[derive(Clone, PartialEq)]
struct TensorKey {
    dtype: DType,
    ne: [usize; MAX_DIMS],
    nb: [usize; MAX_DIMS],
    op: Op,
    src: Vec<TensorId>,
    view_src: Option<TensorId>,
    view_offset: usize,
    flags: TensorFlags,
    /// The bound buffer's address and the offset in it.
    data: Option<(usize, usize)>,
}

/// The address that names a buffer.
fn buffer_addr(b: &Arc<dyn Buffer>) -> usize {
    Arc::as_ptr(b) as *const u8 as usize
}

/// A graph's nodes, structure, bindings and a backend's settings, compared to find work derived
/// from an equal graph (see the module's documentation).
#[derive(Clone)]
pub struct GraphKey {
    stamp: u64,
    nodes: Vec<TensorId>,
    settings: Vec<u64>,
    tensors: Vec<TensorKey>,
    hash: u64,
    /// The bound buffers, held so that no other buffer can take their addresses (empty for an
    /// [`GraphKey::unheld`] key); never read, only kept.
    _held: Vec<Arc<dyn Buffer>>,
}

impl GraphKey {
    /// The key of running `nodes` of `graph` (in that order) under a backend's `settings`
    /// (whatever else the derived work depends on, as numbers).
    pub fn new(graph: &Graph, nodes: &[TensorId], settings: &[u64]) -> GraphKey {
        Self::make(graph, nodes, settings, true)
    }

    /// [`GraphKey::new`] without holding the buffers: the cache that keeps the key must drop
    /// it before any buffer that its work binds is freed (see the module's documentation).
    pub fn unheld(graph: &Graph, nodes: &[TensorId], settings: &[u64]) -> GraphKey {
        Self::make(graph, nodes, settings, false)
    }

    fn make(graph: &Graph, nodes: &[TensorId], settings: &[u64], hold: bool) -> GraphKey {
        let mut held: Vec<Arc<dyn Buffer>> = Vec::new();
        let tensors: Vec<TensorKey> = graph
            .ids()
            .map(|id| {
                let t = graph.get(id);
                let data = t.data.as_ref().map(|d| {
                    let addr = buffer_addr(&d.buffer);
                    if hold && !held.iter().any(|h| buffer_addr(h) == addr) {
                        held.push(d.buffer.clone());
                    }
                    (addr, d.offset)
                });
                TensorKey {
                    dtype: t.dtype,
                    ne: t.ne,
                    nb: t.nb,
                    op: t.op.clone(),
                    src: t.src.clone(),
                    view_src: t.view_src,
                    view_offset: t.view_offset,
                    flags: t.flags,
                    data,
                }
            })
            .collect();
        let mut h = std::collections::hash_map::DefaultHasher::new();
        nodes.hash(&mut h);
        settings.hash(&mut h);
        for k in &tensors {
            (k.dtype.gguf_id(), k.ne, k.nb, k.op.name(), &k.src).hash(&mut h);
            (k.view_src, k.view_offset, k.data).hash(&mut h);
        }
        GraphKey {
            stamp: graph.stamp(),
            nodes: nodes.to_vec(),
            settings: settings.to_vec(),
            tensors,
            hash: h.finish(),
            _held: held,
        }
    }

    /// A hash of the key: equal keys have equal hashes.
    pub fn hash(&self) -> u64 {
        self.hash
    }

    /// Whether running `nodes` of `graph` under `settings` is what this key names.
    pub fn matches(&self, graph: &Graph, nodes: &[TensorId], settings: &[u64]) -> bool {
        if self.nodes != nodes || self.settings != settings {
            return false;
        }
        if self.stamp == graph.stamp() {
            return true;
        }
        self.tensors.len() == graph.len()
            && graph.ids().zip(&self.tensors).all(|(id, k)| {
                let t = graph.get(id);
                k.ne == t.ne
                    && k.nb == t.nb
                    && k.dtype == t.dtype
                    && k.src == t.src
                    && k.view_src == t.view_src
                    && k.view_offset == t.view_offset
                    && k.flags == t.flags
                    && k.op == t.op
                    && k.data == t.data.as_ref().map(|d| (buffer_addr(&d.buffer), d.offset))
            })
    }
}

impl GraphKey {
    /// After [`GraphKey::matches`] found `graph` equal to this key: the graph's present stamp
    /// is remembered, so that its next runs match by the stamp alone.
    pub fn refresh(&mut self, graph: &Graph) {
        self.stamp = graph.stamp();
    }
}

impl PartialEq for GraphKey {
    fn eq(&self, other: &GraphKey) -> bool {
        self.hash == other.hash
            && self.nodes == other.nodes
            && self.settings == other.settings
            && self.tensors == other.tensors
    }
}

impl std::fmt::Debug for GraphKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GraphKey")
            .field("nodes", &self.nodes.len())
            .field("tensors", &self.tensors.len())
            .field("settings", &self.settings)
            .field("hash", &self.hash)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::GraphKey;
    use crate::{DType, Graph, TensorId};

    fn graph(scale: f32) -> (Graph, Vec<TensorId>) {
        let mut g = Graph::new();
        let a = g.input("a", DType::F32, &[4, 2]).unwrap();
        let b = g.scale(a, scale).unwrap();
        g.set_output(b);
        let nodes = g.ids().collect();
        (g, nodes)
    }

    #[test]
    fn equal_structure_matches_across_graphs_and_settings_count() {
        let (g1, n1) = graph(2.0);
        let (g2, n2) = graph(2.0);
        assert_ne!(g1.stamp(), g2.stamp());
        let k = GraphKey::new(&g1, &n1, &[1]);
        assert!(
            k.matches(&g2, &n2, &[1]),
            "a fresh graph of the same structure"
        );
        let mut k2 = k.clone();
        k2.refresh(&g2);
        assert!(
            k2.matches(&g2, &n2, &[1]),
            "and by its stamp after a refresh"
        );
        assert_eq!(k, GraphKey::new(&g2, &n2, &[1]));
        assert!(!k.matches(&g2, &n2, &[0]), "other settings");
        assert!(!k.matches(&g2, &n2[..1], &[1]), "other nodes");
    }

    #[test]
    fn an_op_parameter_or_a_change_breaks_the_match() {
        let (g1, n1) = graph(2.0);
        let (g2, n2) = graph(3.0);
        let k = GraphKey::new(&g1, &n1, &[]);
        assert!(!k.matches(&g2, &n2, &[]), "another scale");
        assert_ne!(k, GraphKey::new(&g2, &n2, &[]));
        let (mut g3, n3) = graph(2.0);
        let k3 = GraphKey::new(&g3, &n3, &[]);
        g3.set_output(n3[0]);
        assert!(
            !k3.matches(&g3, &n3, &[]),
            "the graph changed after the key was made"
        );
    }
}
