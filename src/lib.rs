//! fulcrum: an HTTP load balancer and reverse proxy.
//!
//! The design keeps three things apart: backends measure themselves
//! ([`backend::Backend`]), a strategy is a pure function of an immutable snapshot
//! ([`strategy::Picker`]), and control (the admin API, configuration) changes the pool,
//! never the request path ([`pool::Pool`]). See `docs/architecture.md`.
//!
//! The public modules hold what the binary and the benchmarks use: the command line's
//! entry point, backend specs, the backends and the strategies' pickers; everything
//! else is internal to the crate.

pub(crate) mod acme;
pub(crate) mod admin;
pub mod backend;
pub mod basic_auth;
pub mod cli;
pub(crate) mod clock;
pub mod compress;
pub mod config;
pub(crate) mod deadline;
pub(crate) mod demo;
pub(crate) mod descriptors;
pub(crate) mod discovery;
pub(crate) mod driver;
pub(crate) mod fetch;
pub(crate) mod front;
#[cfg(fuzzing)]
#[doc(hidden)]
pub mod fuzzing;
#[cfg(all(test, not(fuzzing)))]
mod fuzzing;
pub(crate) mod h3_front;
pub(crate) mod h3_quic;
pub(crate) mod health;
pub(crate) mod http2;
pub(crate) mod hyper_front;
pub(crate) mod identity;
pub(crate) mod ipset;
pub(crate) mod jwks;
pub(crate) mod jwt;
pub(crate) mod lab;
pub(crate) mod lab_run;
pub(crate) mod listeners;
pub(crate) mod liveness;
pub(crate) mod logging;
pub(crate) mod loops;
pub(crate) mod manual;
pub(crate) mod metrics;
pub(crate) mod mirror;
pub(crate) mod mtls;
pub(crate) mod notify;
pub(crate) mod obtained;
pub mod pool;
pub(crate) mod proxy;
pub(crate) mod proxy_protocol;
pub(crate) mod quic;
pub(crate) mod rate_limit;
pub(crate) mod recycle;
pub(crate) mod reload;
pub mod route;
pub(crate) mod server;
pub(crate) mod site;
pub(crate) mod sockets;
pub(crate) mod spawn;
pub(crate) mod split;
pub(crate) mod stats;
pub(crate) mod store;
pub mod strategy;
pub(crate) mod tcp;
pub(crate) mod tls;
pub mod trace;
pub(crate) mod traffic;
pub(crate) mod transport;
pub(crate) mod trust;
pub(crate) mod upgrade;
pub(crate) mod x509;
