//! Failsafe: a holder that cannot reach the store keeps its lock on grants
//! from every other member, asked directly (`docs/failsafe-design.md`).
//! Built so far: a member's side (its core grants, F1 and F4; its agent
//! answers signed asks, F5). Not yet: the holder's asks and the extension
//! of its licence (F2, F3), so `putex run --failsafe` is hidden and keeps
//! no holder alive through an outage yet.
//!
//! | module | what it is for |
//! |---|---|
//! | [`auth`] | F5: the shared key (`--failsafe-key-file`) and the HMAC-SHA-256 that signs asks and grants |
//! | [`member`] | F1: a member's answers, `POST /v1/failsafe/{lock}` on the agent's `--http` |

pub mod auth;
pub mod member;
