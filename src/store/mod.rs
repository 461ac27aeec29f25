//! Where pools, backends and routes will live in fleet mode: etcd, reached through its
//! JSON gateway. Not yet wired to the admin API or the pools.

pub(crate) mod etcd;
