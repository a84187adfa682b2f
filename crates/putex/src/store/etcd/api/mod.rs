//! etcd's v3 gRPC API: the prost messages and tonic clients generated from
//! etcd's `.proto` files by `crates/etcd-codegen` into
//! `crates/putex/generated/etcd/` (`cargo run -p etcd-codegen`; its
//! `--check`, run by `scripts/test`, fails when those files are not what it
//! generates), kept out of `src/`: nobody writes them. Generated, so neither formatted nor
//! linted here; never edit them by hand. The inputs and where they come
//! from: `crates/etcd-codegen/proto/README.md`.
//!
//! Committed rather than generated at build time, so that building putex
//! needs no protoc and no code generator: only cargo.

#![allow(
    dead_code,
    missing_docs,
    clippy::all,
    clippy::pedantic,
    rustdoc::bare_urls,
    rustdoc::broken_intra_doc_links,
    rustdoc::invalid_html_tags
)]

/// Keys, values and events (`mvccpb`).
pub mod mvccpb {
    include!(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/generated/etcd/mvccpb.rs"
    ));
}

/// Users, roles and permissions (`authpb`).
pub mod authpb {
    include!(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/generated/etcd/authpb.rs"
    ));
}

/// The KV, Watch, Lease, Cluster, Maintenance and Auth services and their
/// messages (`etcdserverpb`).
pub mod etcdserverpb {
    include!(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/generated/etcd/etcdserverpb.rs"
    ));
}
