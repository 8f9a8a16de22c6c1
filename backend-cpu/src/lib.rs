//! tessera-cpu: the CPU backend.
