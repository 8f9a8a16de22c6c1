//! `tessera devices`.

use tessera::Result;

fn gib(b: usize) -> f64 {
    b as f64 / (1u64 << 30) as f64
}

/// Lists every backend's devices, or why it has none.
pub fn run() -> Result<()> {
    let reg = tessera::registry();
    for b in reg.backends() {
        match &b.devices {
            Ok(ds) if ds.is_empty() => println!("{}: no devices", b.backend),
            Ok(ds) => {
                for d in ds {
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
            }
            Err(why) => println!("{}: unusable here: {why}", b.backend),
        }
    }
    Ok(())
}
