//! What the operator and the health checks decide about a backend: its weight, its
//! administrative state, whether it is healthy, which source owns it and what the admin
//! API pinned. Written on the control side, read by every pick.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU8, Ordering};

use serde::Serialize;

/// Administrative state, set through the admin API.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum AdminState {
    /// Takes traffic when healthy.
    Active,
    /// No new requests; in-flight ones finish.
    Draining,
    /// Out of rotation for maintenance; in-flight ones finish.
    Maintenance,
}

impl AdminState {
    /// Parses `active`, `draining`, `maintenance`.
    pub(crate) fn parse(s: &str) -> Option<AdminState> {
        match s {
            "active" => Some(AdminState::Active),
            "draining" => Some(AdminState::Draining),
            "maintenance" => Some(AdminState::Maintenance),
            _ => None,
        }
    }

    fn from_u8(v: u8) -> AdminState {
        match v {
            1 => AdminState::Draining,
            2 => AdminState::Maintenance,
            _ => AdminState::Active,
        }
    }
}

/// Who put a backend in its pool (`docs/architecture.md`, "Membership"). A source
/// changes only the backends it owns: a reload touches the config file's, never those
/// the admin API added or fulcrum spawned.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Source {
    /// The config file or the command line (`--backend`).
    Config,
    /// `POST /admin/backends`, a pool made through the admin API, the lab's joiners.
    Admin,
    /// Fleet mode's store.
    Store,
    /// `POST /admin/backends/spawn`: a process fulcrum started.
    Spawn,
    /// Discovery: a pool's SRV records (`docs/discovery.md`).
    Srv,
    /// Discovery: a name's A and AAAA records.
    Dns,
    /// Discovery: a watched file.
    File,
}

impl Source {
    fn from_u8(v: u8) -> Source {
        match v {
            1 => Source::Admin,
            2 => Source::Store,
            3 => Source::Spawn,
            4 => Source::Srv,
            5 => Source::Dns,
            6 => Source::File,
            _ => Source::Config,
        }
    }

    /// Whether discovery found it: its pool's `discover` setting owns it.
    pub(crate) fn is_discovered(self) -> bool {
        matches!(self, Source::Srv | Source::Dns | Source::File)
    }
}

/// What the admin API set on a backend that its source must not undo while it stays
/// (`docs/discovery.md`, "The admin API and the dashboard"): bits of [`Backend::pins`].
pub(crate) mod pin {
    /// `PATCH … {"weight"}`.
    pub(crate) const WEIGHT: u8 = 1;
    /// `PATCH … {"max_conns"}`.
    pub(crate) const MAX_CONNS: u8 = 2;
}

/// A backend's control state ([`super::Backend::control`]).
#[derive(Debug)]
pub(crate) struct Control {
    weight: AtomicU32,
    state: AtomicU8,
    healthy: AtomicBool,
    /// Its [`Source`] (control side only).
    source: AtomicU8,
    /// What the admin API set that its source keeps ([`pin`]; control side only).
    pins: AtomicU8,
}

impl Control {
    /// Active, healthy, owned by the config file, nothing pinned.
    pub(crate) fn new(weight: u32) -> Control {
        Control {
            weight: AtomicU32::new(weight),
            state: AtomicU8::new(AdminState::Active as u8),
            healthy: AtomicBool::new(true),
            source: AtomicU8::new(Source::Config as u8),
            pins: AtomicU8::new(0),
        }
    }

    /// Configured weight.
    pub(crate) fn weight(&self) -> u32 {
        self.weight.load(Ordering::Relaxed)
    }

    /// Sets the weight (the admin API, a reload, discovery).
    pub(crate) fn set_weight(&self, w: u32) {
        self.weight.store(w, Ordering::Relaxed);
    }

    /// Administrative state.
    pub(crate) fn state(&self) -> AdminState {
        AdminState::from_u8(self.state.load(Ordering::Relaxed))
    }

    /// Sets the administrative state.
    pub(crate) fn set_state(&self, s: AdminState) {
        self.state.store(s as u8, Ordering::Relaxed);
    }

    /// Who put it in its pool.
    pub(crate) fn source(&self) -> Source {
        Source::from_u8(self.source.load(Ordering::Relaxed))
    }

    /// Hands it to another source (control side: a source that lists a backend the
    /// admin API added takes it over).
    pub(crate) fn set_source(&self, s: Source) {
        self.source.store(s as u8, Ordering::Relaxed);
    }

    /// Whether the admin API set what `bit` ([`pin`]) names.
    pub(crate) fn pinned(&self, bit: u8) -> bool {
        self.pins.load(Ordering::Relaxed) & bit != 0
    }

    /// Notes that the admin API set what `bit` ([`pin`]) names.
    pub(crate) fn pin(&self, bit: u8) {
        self.pins.fetch_or(bit, Ordering::Relaxed);
    }

    /// Result of the active health checks.
    pub(crate) fn healthy(&self) -> bool {
        self.healthy.load(Ordering::Relaxed)
    }

    /// Notes the health checks' verdict.
    pub(crate) fn set_healthy(&self, healthy: bool) {
        self.healthy.store(healthy, Ordering::Relaxed);
    }
}
