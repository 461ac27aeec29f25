//! fulcrum: an HTTP load balancer and reverse proxy.
//!
//! The design keeps three things apart: backends measure themselves ([`pool::Backend`]),
//! a strategy is a pure function of an immutable snapshot ([`strategy::Picker`]), and
//! control (the admin API, configuration) changes the pool, never the request path
//! ([`pool::Pool`]). See `docs/architecture.md`.

pub mod admin;
pub mod backend;
pub mod cli;
pub mod config;
pub mod deadline;
pub mod demo;
pub mod front;
pub mod health;
pub mod logging;
pub mod metrics;
pub mod pool;
pub mod proxy;
pub mod reload;
pub mod server;
pub mod spawn;
pub mod stats;
pub mod strategy;
pub mod traffic;
