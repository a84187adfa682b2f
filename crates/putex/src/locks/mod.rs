//! Locks for programs and scripts, all built on the core's lease rules.
//!
//! | module | what it is for |
//! |---|---|
//! | [`guard`] | guarded writes: a holder's writes to the store that the store refuses once the lock has moved on |
//! | [`lease`] | named leases for Rust programs: [`lease::Lease`] (one tenure; [`lease::LossSignal`] for its loss, [`lease::LeaseError`] per outcome) and [`lease::Lock`] (taken and given back again and again, one CAS each) |
//! | [`section`] | critical sections (`putex lock`): a command run under a lock or semaphore slot, stopped before the lock passes on |
//! | [`queue`] | fair queues: waiters take their turn in arrival order; dead waiters expire |
//! | [`idpool`] | identity pools (`putex id`): unique ids from a range, claimed atomically, never duplicated |
//! | [`gateway`] | the lock gateway behind `putex serve`: locks for HTTP clients, held in the store |

pub mod gateway;
pub mod guard;
pub mod idpool;
pub mod lease;
pub mod queue;
pub mod section;
