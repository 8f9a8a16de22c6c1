//! Layer split: which part holds which layers of a model.
//!
//! With [`crate::SplitMode::Layer`] each part holds a contiguous range of whole layers (their
//! weights and KV cache) and runs them on its own; the activations cross from one part to the
//! next once per boundary. The parts run one after the other for a token, so a token takes the
//! sum of the parts' times: splitting never makes one sequence faster than its fastest part
//! alone, it lets a model larger than one device run, with as much of it as fits on the fastest.
//!
//! The planner here knows only sizes and speeds; the model runner (tessera-llm's `shard`
//! module) measures a model's layers, asks for a plan and places the weights, and core's
//! scheduler runs the graph, placing each node where its layer's weights are.
//!
//! How many layers each part gets ([`LayerShares`]):
//!
//! - **Given ratios**: layer counts in proportion (largest remainders), as the user asked.
//! - **Fill** (the automatic ratios): the fastest part takes as many layers as its memory holds,
//!   then the next fastest, and so on. For one sequence this is the fastest plan (a token's time
//!   is the sum over parts of their layers' bytes over their speed, least when the fast part
//!   has the most); a part too slow to help gets no layer, and a log line says so.
//! - **Offload(n)** (llama.cpp's `-ngl n`): n layers on the parts that are not the CPU, the rest
//!   on the CPU parts; without n, as many as fit there (a GPU the user chose is used first
//!   whatever its measured speed).
//!
//! The output head (and the output norm) goes on the fastest part with room for it (the last of
//! parts within 10% of the fastest), and that part's range comes last, so that the last layers and the head are on one device; the other
//! parts' ranges follow the parts' order. The token embedding goes with the first layer.
//! Every part's bytes are checked against its budget when the plan is made: a split that leaves
//! a part too little memory is an error naming the part, never an allocation failure later.

use tessera_core::error::{Error, Result};

use crate::split::partition;

/// One part as the planner sees it.
#[derive(Clone, Debug, PartialEq)]
pub struct LayerPart {
    /// The part's device name (for messages).
    pub name: String,
    /// Bytes the part may hold: its free memory less what it keeps for compute buffers.
    pub budget: usize,
    /// Bytes of weights per second it streams through a mat-vec.
    pub speed: f64,
    /// Whether it is a CPU (the parts [`LayerShares::Offload`] leaves the rest to).
    pub cpu: bool,
}

/// What a model's pieces cost in memory.
#[derive(Clone, Debug, PartialEq)]
pub struct LayerCosts {
    /// Bytes of each layer's weights.
    pub weights: Vec<usize>,
    /// Bytes of each layer's KV cache.
    pub cache: Vec<usize>,
    /// Bytes of the output head and what goes with it (the output norm; the token embedding
    /// when the head is tied to it).
    pub head: usize,
    /// Bytes of what goes with the first layer (the token embedding when it is not the head).
    pub input: usize,
}

impl LayerCosts {
    fn layer(&self, l: usize) -> usize {
        self.weights[l] + self.cache[l]
    }
}

/// How many layers each part gets.
#[derive(Clone, Debug, PartialEq)]
pub enum LayerShares {
    /// In proportion to these ratios (one per part, normalized).
    Given(Vec<f64>),
    /// The fastest part first, each as many layers as its budget holds.
    Fill,
    /// This many layers on the parts that are not the CPU (all of them when it is more than the
    /// model has; `None`: as many as fit), the rest on the CPU parts.
    Offload(Option<usize>),
}

/// Where each layer runs.
#[derive(Clone, Debug, PartialEq)]
pub struct LayerPlan {
    /// The part of each layer.
    pub layer_part: Vec<usize>,
    /// The part that computes the output head.
    pub head_part: usize,
    /// Layers of each part.
    pub counts: Vec<usize>,
    /// Bytes each part holds (weights, KV cache, the head and the embedding where they are).
    pub bytes: Vec<usize>,
    /// The expected share of a token's time on each part (its weights' bytes over its speed).
    pub time: Vec<f64>,
}

impl LayerPlan {
    /// The first and one-past-last layer of part `j` (equal when it has none).
    pub fn range(&self, j: usize) -> (usize, usize) {
        let first = self.layer_part.iter().position(|&p| p == j);
        match first {
            Some(f) => (f, f + self.counts[j]),
            None => (0, 0),
        }
    }
}

/// Plans the layers of a model with `costs` over `parts` as `shares` say; `device` names the
/// whole in messages.
pub fn plan_layers(
    device: &str,
    parts: &[LayerPart],
    costs: &LayerCosts,
    shares: &LayerShares,
) -> Result<LayerPlan> {
    let n = parts.len();
    let n_layer = costs.weights.len();
    if n == 0 {
        return Err(Error::Invalid(format!("{device} has no parts")));
    }
    if costs.cache.len() != n_layer {
        return Err(Error::Invalid(format!(
            "{n_layer} layers of weights but {} of KV cache",
            costs.cache.len()
        )));
    }
    // The fastest of some parts; among parts within 10% of the fastest (like devices, whose
    // measured speeds differ by noise) the last in the parts' order, so that like parts keep
    // their order.
    let fastest = |of: &mut dyn Iterator<Item = usize>| {
        let of: Vec<usize> = of.collect();
        let top = of.iter().map(|&j| parts[j].speed).fold(f64::MIN, f64::max);
        of.into_iter().rev().find(|&j| parts[j].speed >= 0.9 * top)
    };
    let biggest = (0..n_layer).map(|l| costs.layer(l)).max().unwrap_or(0);
    let room = |j: usize, head: usize| -> usize {
        let b = parts[j]
            .budget
            .saturating_sub(if j == head { costs.head } else { 0 });
        b.checked_div(biggest).unwrap_or(usize::MAX)
    };
    // The head: the fastest part with room for it (among the GPU parts when layers are
    // offloaded to them, the CPU parts when none is).
    let head_among = |pick: &dyn Fn(usize) -> bool| {
        let fits = fastest(&mut (0..n).filter(|&j| pick(j) && parts[j].budget >= costs.head));
        fits.or_else(|| fastest(&mut (0..n).filter(|&j| pick(j))))
    };
    let (counts, head) = match shares {
        LayerShares::Given(ratios) => {
            if ratios.len() != n {
                return Err(Error::Invalid(format!(
                    "{} split ratios for the {n} parts of {device}",
                    ratios.len()
                )));
            }
            let head = head_among(&|j| ratios[j] > 0.0)
                .or_else(|| head_among(&|_| true))
                .expect("at least one part");
            let counts = partition(n_layer, ratios);
            for j in 0..n {
                if ratios[j] > 0.0 && counts[j] == 0 {
                    log::info!(
                        "{device}: part {j} ({}) gets no layer: its ratio {:.3} is less than one \
                         of the {n_layer} layers",
                        parts[j].name,
                        ratios[j]
                    );
                }
            }
            (counts, head)
        }
        LayerShares::Fill => {
            let head = head_among(&|_| true).expect("at least one part");
            let all: Vec<usize> = (0..n).collect();
            let counts = fill(n_layer, &all, parts, head, &|j| room(j, head));
            (counts, head)
        }
        LayerShares::Offload(k) => {
            let gpus: Vec<usize> = (0..n).filter(|&j| !parts[j].cpu).collect();
            let cpus: Vec<usize> = (0..n).filter(|&j| parts[j].cpu).collect();
            let asked = k.map(|k| k.min(n_layer));
            let head_gpu = asked != Some(0) && !gpus.is_empty();
            let head = if head_gpu {
                head_among(&|j| !parts[j].cpu)
            } else {
                head_among(&|j| parts[j].cpu)
            }
            .ok_or_else(|| {
                Error::Invalid(format!(
                    "{device} has no CPU part for the layers left to it"
                ))
            })?;
            let k = asked.unwrap_or_else(|| {
                fill(n_layer, &gpus, parts, head, &|j| room(j, head))
                    .iter()
                    .sum()
            });
            if k < n_layer && cpus.is_empty() {
                return Err(Error::Invalid(format!(
                    "{k} of {n_layer} layers on the GPUs leaves {} for a CPU, but {device} has no \
                     CPU part",
                    n_layer - k
                )));
            }
            if k > 0 && gpus.is_empty() {
                return Err(Error::Invalid(format!(
                    "{k} layers asked for on the GPUs, but {device} has no GPU part"
                )));
            }
            let on_gpus = fill(k, &gpus, parts, head, &|j| room(j, head));
            let fit: usize = on_gpus.iter().sum();
            if fit < k {
                let names: Vec<&str> = gpus.iter().map(|&j| parts[j].name.as_str()).collect();
                return Err(Error::OutOfMemory {
                    device: format!(
                        "{} of {device}: {k} GPU layers asked for, room for {fit} (with the output \
                         head and compute buffers); ask for at most {fit}, or leave the count out \
                         to fill the GPU",
                        names.join(", ")
                    ),
                    bytes: k * biggest + costs.head,
                });
            }
            let on_cpus = fill(n_layer - k, &cpus, parts, head, &|j| room(j, head));
            let counts = (0..n).map(|j| on_gpus[j] + on_cpus[j]).collect();
            (counts, head)
        }
    };
    let placed: usize = counts.iter().sum();
    if placed < n_layer {
        let free: usize = parts.iter().map(|p| p.budget).sum();
        let need: usize = (0..n_layer).map(|l| costs.layer(l)).sum::<usize>() + costs.head;
        return Err(Error::OutOfMemory {
            device: format!(
                "{device} (its parts hold {placed} of the model's {n_layer} layers: the model \
                 and its KV cache need {} MiB, the parts have {} MiB free after compute buffers; \
                 use a smaller context or add a part)",
                need >> 20,
                free >> 20
            ),
            bytes: need,
        });
    }
    // Ranges in part order, the head's part last.
    let mut order: Vec<usize> = (0..n).filter(|&j| j != head).collect();
    order.push(head);
    let mut layer_part = Vec::with_capacity(n_layer);
    for &j in &order {
        layer_part.extend(std::iter::repeat_n(j, counts[j]));
    }
    let mut bytes = vec![0usize; n];
    let mut streamed = vec![0usize; n];
    for (l, &j) in layer_part.iter().enumerate() {
        bytes[j] += costs.layer(l);
        streamed[j] += costs.weights[l];
    }
    bytes[head] += costs.head;
    streamed[head] += costs.head;
    let first = layer_part.first().copied().unwrap_or(head);
    bytes[first] += costs.input;
    for j in 0..n {
        if bytes[j] > parts[j].budget {
            let plan = LayerPlan {
                layer_part: layer_part.clone(),
                head_part: head,
                counts: counts.clone(),
                bytes: bytes.clone(),
                time: Vec::new(),
            };
            let (a, b) = plan.range(j);
            return Err(Error::OutOfMemory {
                device: format!(
                    "part {j} ({}) of {device}: layers {a}..{b}{} need {} MiB, but it has {} MiB \
                     free after compute buffers (give it a smaller ratio, or fewer GPU layers)",
                    parts[j].name,
                    if j == head {
                        " and the output head"
                    } else {
                        ""
                    },
                    bytes[j] >> 20,
                    parts[j].budget >> 20
                ),
                bytes: bytes[j],
            });
        }
    }
    let secs: Vec<f64> = (0..n)
        .map(|j| streamed[j] as f64 / parts[j].speed.max(1e-9))
        .collect();
    let total: f64 = secs.iter().sum();
    let time = secs
        .iter()
        .map(|s| if total > 0.0 { s / total } else { 0.0 })
        .collect();
    if matches!(shares, LayerShares::Fill) {
        for j in (0..n).filter(|&j| counts[j] == 0 && j != head) {
            log::info!(
                "{device}: part {j} ({}) gets no layer: the faster parts hold the whole model",
                parts[j].name
            );
        }
    }
    Ok(LayerPlan {
        layer_part,
        head_part: head,
        counts,
        bytes,
        time,
    })
}

/// `k` layers over the parts `among`, the head's part `head` first (the fastest, or one of
/// like parts), then the fastest, each taking at most `room(j)`.
fn fill(
    k: usize,
    among: &[usize],
    parts: &[LayerPart],
    head: usize,
    room: &dyn Fn(usize) -> usize,
) -> Vec<usize> {
    let mut order = among.to_vec();
    order.sort_by(|&a, &b| {
        (a != head)
            .cmp(&(b != head))
            .then(parts[b].speed.total_cmp(&parts[a].speed))
            .then(a.cmp(&b))
    });
    let mut counts = vec![0; parts.len()];
    let mut left = k;
    for j in order {
        let take = left.min(room(j));
        counts[j] = take;
        left -= take;
    }
    counts
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: usize = 1 << 20;

    fn part(name: &str, budget_mib: usize, speed: f64, cpu: bool) -> LayerPart {
        LayerPart {
            name: name.into(),
            budget: budget_mib * MIB,
            speed,
            cpu,
        }
    }

    /// Ten layers of 10 MiB of weights and 2 MiB of cache, a 20 MiB head, a 5 MiB embedding.
    fn costs() -> LayerCosts {
        LayerCosts {
            weights: vec![10 * MIB; 10],
            cache: vec![2 * MIB; 10],
            head: 20 * MIB,
            input: 5 * MIB,
        }
    }

    #[test]
    fn given_ratios_give_proportional_ranges_with_the_head_part_last() {
        let parts = [part("cpu", 1000, 1.0, true), part("gpu", 1000, 8.0, false)];
        let p = plan_layers("m", &parts, &costs(), &LayerShares::Given(vec![0.3, 0.7])).unwrap();
        assert_eq!(p.counts, vec![3, 7]);
        assert_eq!(p.head_part, 1);
        assert_eq!(p.layer_part, vec![0, 0, 0, 1, 1, 1, 1, 1, 1, 1]);
        assert_eq!(p.range(0), (0, 3));
        assert_eq!(p.range(1), (3, 10));
        assert_eq!(
            p.bytes,
            vec![3 * 12 * MIB + 5 * MIB, 7 * 12 * MIB + 20 * MIB]
        );
        // Part 0 streams 30 MiB at 1, part 1 90 MiB at 8.
        let want = 30.0 / (30.0 + 90.0 / 8.0);
        assert!((p.time[0] - want).abs() < 1e-9, "{:?}", p.time);
        // The head on the fast part even when it comes first.
        let parts = [part("gpu", 1000, 8.0, false), part("cpu", 1000, 1.0, true)];
        let p = plan_layers("m", &parts, &costs(), &LayerShares::Given(vec![0.5, 0.5])).unwrap();
        assert_eq!(p.head_part, 0);
        assert_eq!(p.layer_part, vec![1, 1, 1, 1, 1, 0, 0, 0, 0, 0]);
    }

    #[test]
    fn a_part_with_ratio_zero_gets_nothing() {
        let parts = [part("a", 1000, 1.0, true), part("b", 1000, 1.05, true)];
        let p = plan_layers("m", &parts, &costs(), &LayerShares::Given(vec![1.0, 0.0])).unwrap();
        assert_eq!(p.counts, vec![10, 0]);
        assert_eq!(p.head_part, 0);
        assert_eq!(p.bytes[1], 0);
        // Like parts keep their order: the head on the last.
        let p = plan_layers("m", &parts, &costs(), &LayerShares::Given(vec![0.5, 0.5])).unwrap();
        assert_eq!(p.head_part, 1);
        assert_eq!(p.layer_part, vec![0, 0, 0, 0, 0, 1, 1, 1, 1, 1]);
    }

    #[test]
    fn fill_puts_what_fits_on_the_fastest_part_and_the_rest_on_the_next() {
        // The GPU holds the head (20) and 5 layers of 12 MiB in its 85 MiB.
        let parts = [part("gpu", 85, 8.0, false), part("cpu", 1000, 1.0, true)];
        let p = plan_layers("m", &parts, &costs(), &LayerShares::Fill).unwrap();
        assert_eq!(p.counts, vec![5, 5]);
        assert_eq!(p.head_part, 0);
        assert_eq!(p.layer_part[..5], [1; 5]);
        // Room for everything: the slow part gets nothing.
        let parts = [part("cpu", 1000, 1.0, true), part("gpu", 1000, 8.0, false)];
        let p = plan_layers("m", &parts, &costs(), &LayerShares::Fill).unwrap();
        assert_eq!(p.counts, vec![0, 10]);
        assert_eq!(p.time, vec![0.0, 1.0]);
        // Like parts: the one with the head takes the layers too.
        let parts = [part("a", 1000, 1.0, true), part("b", 1000, 1.0, true)];
        let p = plan_layers("m", &parts, &costs(), &LayerShares::Fill).unwrap();
        assert_eq!((p.counts.clone(), p.head_part), (vec![0, 10], 1));
    }

    #[test]
    fn offload_puts_n_layers_on_the_gpu_and_the_rest_on_the_cpu() {
        let parts = [part("gpu", 1000, 8.0, false), part("cpu", 1000, 1.0, true)];
        let p = plan_layers("m", &parts, &costs(), &LayerShares::Offload(Some(7))).unwrap();
        assert_eq!(p.counts, vec![7, 3]);
        assert_eq!(p.head_part, 0);
        assert_eq!(p.layer_part, vec![1, 1, 1, 0, 0, 0, 0, 0, 0, 0]);
        // More than the model has: all of it.
        let p = plan_layers("m", &parts, &costs(), &LayerShares::Offload(Some(99))).unwrap();
        assert_eq!(p.counts, vec![10, 0]);
        // None: the head stays on the CPU too.
        let p = plan_layers("m", &parts, &costs(), &LayerShares::Offload(Some(0))).unwrap();
        assert_eq!((p.counts.clone(), p.head_part), (vec![0, 10], 1));
        // As many as fit, on a GPU slower than the CPU: it is used first all the same.
        let parts = [part("gpu", 85, 0.5, false), part("cpu", 1000, 1.0, true)];
        let p = plan_layers("m", &parts, &costs(), &LayerShares::Offload(None)).unwrap();
        assert_eq!((p.counts.clone(), p.head_part), (vec![5, 5], 0));
    }

    #[test]
    fn a_split_that_overfills_a_part_is_an_error_naming_it() {
        let parts = [part("cpu", 1000, 1.0, true), part("wgpu:0", 50, 8.0, false)];
        let e = plan_layers("m", &parts, &costs(), &LayerShares::Given(vec![0.5, 0.5]))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("part 1 (wgpu:0)") && e.contains("layers 5..10"),
            "{e}"
        );
        let e = plan_layers("m", &parts, &costs(), &LayerShares::Offload(Some(8)))
            .unwrap_err()
            .to_string();
        assert!(e.contains("8 GPU layers asked for, room for 2"), "{e}");
        // A model larger than every part together.
        let parts = [part("a", 30, 1.0, true), part("b", 30, 2.0, false)];
        let e = plan_layers("m", &parts, &costs(), &LayerShares::Fill)
            .unwrap_err()
            .to_string();
        assert!(e.contains("of the model's 10 layers"), "{e}");
    }

    #[test]
    fn offload_without_a_cpu_part_or_a_gpu_part_is_refused() {
        let gpus = [part("gpu", 1000, 8.0, false)];
        assert!(plan_layers("m", &gpus, &costs(), &LayerShares::Offload(Some(4))).is_err());
        assert!(plan_layers("m", &gpus, &costs(), &LayerShares::Offload(Some(10))).is_ok());
        let cpus = [part("cpu", 1000, 1.0, true)];
        assert!(plan_layers("m", &cpus, &costs(), &LayerShares::Offload(Some(2))).is_err());
    }
}
