//! Test-only switches that turn off one safety rule at a time.
//!
//! A checker that cannot fail is worthless. The simulation's tests switch
//! off each rule below and show that the checkers then find a violation.
//!
//! Only a build with the `mutation` feature can switch a rule off: without
//! it `Mutations::only` does not exist and [`Mutations::is`] is always
//! false, so a release build cannot express "safety rule off". The feature
//! is enabled by this crate's own tests (a dev-dependency on itself), never
//! by the `putex` binary.

/// A safety rule that can be switched off for a mutation test.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u64)]
pub enum Rule {
    /// H1 broken: the licence runs from the acknowledgement, not the send.
    LicenceFromAck = 1 << 0,
    /// S1 broken: W = T' without the (1+ε)/(1−ε) factor.
    NoDriftFactor = 1 << 1,
    /// S2/S4 broken: activate without waiting G' after a takeover.
    NoGap = 1 << 2,
    /// H3 broken: our own landed write is treated as a foreign one.
    OwnWriteIsForeign = 1 << 3,
    /// Configuration mismatch broken: a slower holder's advertised T ignored.
    IgnoreAdvertisedLease = 1 << 4,
    /// Trusting a read instead of a CAS: take over with an unconditional put.
    TakeoverByPut = 1 << 5,
    /// H6 broken: release written before the graceful stop is proven.
    ReleaseWithoutProof = 1 << 6,
    /// H6 broken: a node leaving `confirming` writes a release.
    ReleaseFromConfirming = 1 << 7,
    /// S1 (b) broken: the store-clock witness asks for T' instead of W.
    ProbeWitnessLease = 1 << 8,
    /// Keeper broken: fence and activate run before the keeper acknowledged
    /// the tenure's deadline.
    ActivateBeforeArmed = 1 << 9,
    /// H2/H6 broken: a holder whose stop proved nothing (or whose keeper
    /// died) gives its lease up on purpose while the service may run.
    UnprovenStopLetsGo = 1 << 10,
    /// Inside `Timing::staleness_wait`: W = T', the drift factor dropped.
    TimingWaitWithoutDrift = 1 << 11,
    /// Inside `Timing::gap_against` and `gap_unknown`: G' = 0.
    TimingGapDropped = 1 << 12,
    /// Inside `Timing::lease_against`: T' = own T, the advertised T ignored.
    TimingIgnoresAdvertisedLease = 1 << 13,
    /// S6 broken: what an agent saw while holding or stepping down does
    /// not raise the store's trusted present, so a rollback below it looks
    /// like a clean record to the agent once it is a standby again.
    HolderViewUntrusted = 1 << 14,
    /// S1/S6 broken: a stale takeover trusts the view it judged (possibly a
    /// replica's) without a leader read after the store-clock witness.
    StaleTakeoverUnconfirmed = 1 << 15,
    /// S6 broken: a compare-and-swap over revision t that lands although a
    /// foreign record newer than t was seen while it was on its way (the
    /// store lost that record) is trusted as the clean acquisition it was
    /// judged to be.
    AcquireOverLostRecord = 1 << 16,
    /// O2 broken: a standby judges a paused record like any other.
    TakeoverWhilePaused = 1 << 17,
    /// O2 broken: the keeper is disarmed as soon as the paused renewal is
    /// sent, before it is known to have landed.
    DisarmBeforePauseLanded = 1 << 18,
    /// O2 broken: the unpaused record is written before the keeper
    /// acknowledged the new deadline.
    UnpauseBeforeRearmed = 1 << 19,
    /// O1 broken: a release handed to another node is taken at once.
    TakeHandedToOther = 1 << 20,
    /// O3/O4 broken: priority 0, `--max-lag` and a pending rejoin do not
    /// keep a node from taking over (nor a switchover's target behind
    /// `--max-lag` from taking its release before it caught up, O1).
    IgnoreEligibility = 1 << 21,
    /// O5 broken: fail back as soon as a preferred member is ready, without
    /// the hold-down.
    FailbackWithoutHoldDown = 1 << 22,
    /// S1 (b) broken on a store whose clock reads in steps (etcd): a probe
    /// stamped up to one step before the record (rounding, not a clock that
    /// went back) is taken as a backwards clock, so (b) falls back to a
    /// further W of the standby's own clock.
    StepRoundingIsBackwards = 1 << 23,
    /// S6 (z) broken: a record of a re-created bucket that the standby's
    /// own clock has seen unchanged for W is taken without the store-clock
    /// witness (S1 b) and the leader read after it (refinement (v)).
    NewEpochOwnClockOnly = 1 << 24,
    /// S6 broken: a confirming holder that sees another writer's record
    /// above its own revision waits only for the own-writes read, which a
    /// store that lost that record answers with ours.
    ForeignAboveWhileConfirming = 1 << 25,
    /// S6 broken: one revision seen with two contents (the store lost the
    /// first and reused its number) is judged like any new record, so a
    /// late event of a lost `released` record is taken at once (S3).
    ReusedRevisionTrusted = 1 << 26,
    /// S4 refinement broken, in the store: a store that loses acknowledged
    /// writes proves a vacancy anyway (the simulation's store only; a real
    /// store's proof is its driver's, `docs/safety.md` S4).
    VacancyOnLossyStore = 1 << 27,
    /// S4 refinement broken, in the store: a key someone deleted counts as
    /// never used.
    VacancyIgnoresDelete = 1 << 28,
    /// S4 refinement broken, in the store: a vacancy counted from before
    /// the store itself was made (a re-created bucket, a replaced file).
    VacancyIgnoresStoreAge = 1 << 29,
    /// Token check broken: a holding's later records carry no `since`, so
    /// its own tokens stop counting as held after its first renewal.
    HoldingWithoutSince = 1 << 30,
    /// Token check broken: a new holding's first write carries the `since`
    /// of the record it replaced, so the previous holder's tokens still
    /// count as held.
    AcquisitionInheritsSince = 1 << 31,
    /// F1 broken: a member grants while it holds, confirms or acquires the
    /// lock, and whatever the newest record it saw.
    FailsafeGrantBlind = 1 << 32,
    /// F1 (a) broken: a grant does not restart the member's own-clock W.
    FailsafeGrantKeepsWait = 1 << 33,
    /// F1 (b) broken: a grant does not move the member's store-clock floor.
    FailsafeGrantKeepsFloor = 1 << 34,
    /// F1 (b) broken: a probe sent before a grant, answered after it, sets
    /// the floor.
    FailsafeFloorFromEarlierProbe = 1 << 35,
    /// F3 broken: a round with one grant missing extends the licence.
    FailsafeExtendWithGrantMissing = 1 << 36,
    /// F3/H1 broken: a round whose verdicts came after the licence ended
    /// revives it.
    FailsafeReviveEndedLicence = 1 << 37,
    /// F4 broken: a member started with failsafe on counts from the record
    /// only, as if it had granted nothing before its restart.
    FailsafeRestartWithoutWait = 1 << 38,
    /// F2 broken: a node outside a failsafe record's set waits only W.
    FailsafeOutsiderWaitsOnlyW = 1 << 39,
    /// F2 (S7) broken, in the store: a revoke drops the record's set.
    FailsafeRevokeDropsSet = 1 << 40,
    /// F3 (H4) broken: the asks leave out a member that only a write of
    /// unknown outcome added.
    FailsafeAsksOnlyLanded = 1 << 41,
    /// The cap broken: grants extend the licence past the last landed
    /// renewal + `failsafe_max`.
    FailsafeNoCap = 1 << 42,
    /// The cap broken the other way (sim seed failsafe:7490 of session 53):
    /// a taker of an absent or re-created record does not wait for a
    /// holder that may run on grants for up to its cap.
    FailsafeAbsentWithoutCap = 1 << 43,
    /// F2 broken (sim seed failsafe:158459 of session 55): a holder asks,
    /// and extends on grants, while a record of its that may be the newest
    /// carries no set — one written before any member was reported — so
    /// that nobody reading it waits for the cap.
    FailsafeAskWithoutRecordedSet = 1 << 44,
}

impl Rule {
    /// Every rule, for listing.
    pub const ALL: [Rule; 45] = [
        Rule::LicenceFromAck,
        Rule::NoDriftFactor,
        Rule::NoGap,
        Rule::OwnWriteIsForeign,
        Rule::IgnoreAdvertisedLease,
        Rule::TakeoverByPut,
        Rule::ReleaseWithoutProof,
        Rule::ReleaseFromConfirming,
        Rule::ProbeWitnessLease,
        Rule::ActivateBeforeArmed,
        Rule::UnprovenStopLetsGo,
        Rule::TimingWaitWithoutDrift,
        Rule::TimingGapDropped,
        Rule::TimingIgnoresAdvertisedLease,
        Rule::HolderViewUntrusted,
        Rule::StaleTakeoverUnconfirmed,
        Rule::AcquireOverLostRecord,
        Rule::TakeoverWhilePaused,
        Rule::DisarmBeforePauseLanded,
        Rule::UnpauseBeforeRearmed,
        Rule::TakeHandedToOther,
        Rule::IgnoreEligibility,
        Rule::FailbackWithoutHoldDown,
        Rule::StepRoundingIsBackwards,
        Rule::NewEpochOwnClockOnly,
        Rule::ForeignAboveWhileConfirming,
        Rule::ReusedRevisionTrusted,
        Rule::VacancyOnLossyStore,
        Rule::VacancyIgnoresDelete,
        Rule::VacancyIgnoresStoreAge,
        Rule::HoldingWithoutSince,
        Rule::AcquisitionInheritsSince,
        Rule::FailsafeGrantBlind,
        Rule::FailsafeGrantKeepsWait,
        Rule::FailsafeGrantKeepsFloor,
        Rule::FailsafeFloorFromEarlierProbe,
        Rule::FailsafeExtendWithGrantMissing,
        Rule::FailsafeReviveEndedLicence,
        Rule::FailsafeRestartWithoutWait,
        Rule::FailsafeOutsiderWaitsOnlyW,
        Rule::FailsafeRevokeDropsSet,
        Rule::FailsafeAsksOnlyLanded,
        Rule::FailsafeNoCap,
        Rule::FailsafeAbsentWithoutCap,
        Rule::FailsafeAskWithoutRecordedSet,
    ];
}

/// A set of switched-off rules; empty in production.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Mutations(u64);

impl Mutations {
    /// No rule switched off.
    pub const NONE: Mutations = Mutations(0);

    /// Only `rule` switched off (tests only: the `mutation` feature).
    #[cfg(feature = "mutation")]
    pub const fn only(rule: Rule) -> Mutations {
        Mutations(rule as u64)
    }

    /// Whether `rule` is switched off.
    pub fn is(self, rule: Rule) -> bool {
        cfg!(feature = "mutation") && self.0 & rule as u64 != 0
    }
}
