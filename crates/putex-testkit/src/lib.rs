//! What putex's tests, benchmarks (`crates/putex/examples`) and chaos suite
//! (`crates/chaos`) share, so that each fixture exists once:
//!
//! - [`agent`]: `putex run` agents of a given binary (started again when
//!   refused for a slow store, killed with their keeper and services on
//!   drop) and the hook lines they write.
//! - [`bench`](mod@bench): the benchmarks' report helpers and lock fixtures.
//! - [`check`]: reading `putex check`'s output (the failover bound B).
//! - [`etcd_server`]: a real etcd on free loopback ports with temporary
//!   data — one member (optionally with password authentication, a user
//!   limited to a prefix, TLS and client certificates) or an n-member
//!   cluster, whose members can be killed, paused and restarted — killed
//!   and cleaned up on drop, and etcdctl against it. A missing binary fails
//!   with the command that installs it; nothing is ever skipped.
//! - [`nats_server`]: a real nats-server on ephemeral loopback ports with
//!   temporary storage — one JetStream server, one configured by a file, or
//!   a 3-node cluster — stopped and cleaned up on drop. A missing binary
//!   fails with the command that installs it; nothing is ever skipped.
//! - [`pki`]: a throwaway CA, server and client certificates for the TLS
//!   tests.
//! - [`postgres`]: a real PostgreSQL streaming-replication cluster
//!   (`initdb`, `pg_basebackup -R`) on ephemeral loopback ports, run as the
//!   `postgres` user under root, and a writer that records every
//!   acknowledged commit.
//! - [`proxy`]: a TCP proxy between a client and its server that loses,
//!   holds, delays or resets traffic on command (partitions without
//!   touching the host's network).
//! - [`ports`]: free loopback ports below the kernel's ephemeral range,
//!   for servers that bind them later than the test picks them.
//! - [`procfs`]: `/proc` readings for the benchmarks' figures.
//! - [`timing`]: turns for the timing-sensitive tests, within a process and
//!   across the processes `scripts/test` runs side by side.
//! - [`watch_failures`]: a tracing layer counting watches that failed to
//!   start.
//!
//! Whatever runs the `putex` binary takes its path: only the caller knows
//! where cargo built it.

pub mod agent;
pub mod bench;
pub mod check;
pub mod etcd_server;
pub mod nats_server;
pub mod netns;
pub mod pki;
pub mod ports;
pub mod postgres;
pub mod procfs;
pub mod proxy;
pub mod timing;
pub mod watch_failures;
