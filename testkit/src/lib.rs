//! What Spool's tests share, in one place: which outside services they can reach
//! ([`services`], std only), fixtures, calls tests repeat, certificates, the TCP proxy
//! and a store with faults. Every module but `services` is behind a feature of the same name (see
//! Cargo.toml), off by default.

pub mod services;

#[cfg(feature = "calls")]
pub mod calls;
#[cfg(feature = "faults")]
pub mod faults;
#[cfg(feature = "fixtures")]
pub mod fixtures;
#[cfg(feature = "pki")]
pub mod pki;
#[cfg(feature = "proxy")]
pub mod proxy;
