//! Failsafe: a holder that cannot reach the store keeps its lock on grants
//! from every other member, asked directly (`docs/failsafe-design.md`).
//! Built so far: a member's side (its core grants, F1 and F4; its agent
//! answers signed asks, F5) and a holder's client (one round of signed
//! asks to every member at once). Not yet: the holder's core — the set in
//! the record and the extension of its licence (F2, F3) — nor the wiring of
//! the client into the agent, so `putex run --failsafe` is hidden and keeps
//! no holder alive through an outage yet.
//!
//! | module | what it is for |
//! |---|---|
//! | [`auth`] | F5: the shared key (`--failsafe-key-file`) and the HMAC-SHA-256 that signs asks and grants |
//! | [`member`] | F1: a member's answers, `POST /v1/failsafe/{lock}` on the agent's `--http` |
//! | [`holder`] | F3: a holder's asks, one round to every member at once, and a verdict for each |

pub mod auth;
pub mod holder;
pub mod member;
