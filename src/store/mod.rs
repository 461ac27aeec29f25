//! Fleet mode (`docs/fleet.md`): pools, backends and routes in etcd, shared by every
//! instance.

pub(crate) mod apply;
pub(crate) mod etcd;
pub(crate) mod fleet;
pub(crate) mod model;
pub(crate) mod registry;
pub(crate) mod writes;
