//! tessera: tensor graphs on any mix of devices.
pub use tessera_core as core;
