//! `tessera devices`.

use clap::Args;
use tessera::meta::MetaDevice;
use tessera::{Device, Result};

/// Arguments of `tessera devices`.
#[derive(Args, Debug)]
pub struct DevicesArgs {
    /// Also show the meta device made of these parts (e.g. cpu,cuda:0 or meta:cpu,cpu), with
    /// each part's share of the work.
    #[arg(long)]
    meta: Option<String>,
    /// The meta device's split: auto (from free memory and a measured mat-vec) or a share per
    /// part (0.6,0.4).
    #[arg(long, default_value = "auto")]
    split: String,
}

fn gib(b: usize) -> f64 {
    b as f64 / (1u64 << 30) as f64
}

fn line(d: &dyn Device) {
    let m = d.memory();
    println!(
        "{:<10} {:<9} {:>7.1} GiB free / {:>7.1} GiB  {}",
        d.name(),
        d.kind().name(),
        gib(m.free),
        gib(m.total),
        d.description()
    );
}

/// Lists every backend's devices, or why it has none; with `--meta`, a meta device's parts and
/// their ratios.
pub fn run(a: DevicesArgs) -> Result<()> {
    let reg = tessera::registry_with(&tessera::Options::from_env()?);
    for b in reg.backends() {
        match &b.devices {
            Ok(ds) if ds.is_empty() => println!("{}: no devices", b.backend),
            Ok(ds) => ds.iter().for_each(|d| line(d.as_ref())),
            Err(why) => println!("{}: unusable here: {why}", b.backend),
        }
    }
    if let Some(spec) = &a.meta {
        let spec = if spec.starts_with("meta:") {
            spec.clone()
        } else {
            format!("meta:{spec}")
        };
        let dev = crate::load::meta_device(&spec, &a.split, &tessera::Options::from_env()?)?;
        println!();
        line(dev.as_ref());
        let ratios = MetaDevice::from_device(dev.as_ref())
            .map(|m| m.ratios().to_vec())
            .unwrap_or_default();
        for (j, (p, r)) in dev.parts().iter().zip(ratios).enumerate() {
            println!(
                "  part {j}: {:<10} {:>5.1}%  {}",
                p.name(),
                r * 100.0,
                p.description()
            );
        }
    }
    Ok(())
}
