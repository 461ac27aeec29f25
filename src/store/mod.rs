//! Fleet mode (`docs/fleet.md`): pools, backends and routes in etcd, shared by every
//! instance.

pub(crate) mod acme;
pub(crate) mod apply;
pub(crate) mod etcd;
pub(crate) mod fleet;
pub(crate) mod model;
pub(crate) mod registry;
pub(crate) mod writes;

/// The first id an instance gives a backend of its own in fleet mode (one discovery
/// found): the store's backends take the etcd revision that created them, far below
/// this (2^48 revisions is thousands of years of writes at a million a second), and a
/// JavaScript number still holds it exactly.
pub(crate) const LOCAL_IDS: u64 = 1 << 48;
