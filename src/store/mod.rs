//! Where pools, backends and routes live in fleet mode (`docs/fleet.md`): etcd, reached
//! through its JSON gateway. Started here, not yet wired to the admin API or the pools.

pub(crate) mod etcd;
