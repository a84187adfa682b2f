//! Seeds that once broke a check, frozen as named tests (`rNN_what_broke`).
//!
//! When a sweep fails, fix the bug, then add the seed here so it stays fixed.

#![allow(unused_imports, unused_macros)]

use putex_core::mutation::Mutations;

use crate::run_one;
use crate::scenario::Profile;

/// Declares a regression test that replays one seed and expects every check to hold.
macro_rules! regression {
    ($name:ident, $profile:expr, $seed:expr) => {
        #[test]
        fn $name() {
            let (r, _) = run_one($profile, $seed, Mutations::NONE, false);
            if let Err(v) = r.result {
                panic!(
                    "regression seed {} of {:?} fails again: {v}",
                    $seed, $profile
                );
            }
        }
    };
}

// A rollback reused a revision; the agent kept its pre-tenure view of "the
// record at that revision" (a release) and took over the new record by CAS
// on the same number. Fixed: forget the view when a tenure ends, and treat a
// revision with other contents as a new record.
regression!(
    r01_reused_revision_after_rollback_not_taken_as_seen,
    Profile::Chaos,
    7833
);
// Same cause: the first-seen time of a reused revision was not restarted.
regression!(
    r02_reused_revision_restarts_staleness_wait,
    Profile::Chaos,
    2254
);
// A confirming holder activated while a conflicting renewal was being checked.
regression!(
    r03_no_activation_while_a_conflict_is_verified,
    Profile::Chaos,
    2274
);
// A chaos run that found the sim's own duplicated CAS requests (a store
// contract violation the simulation no longer injects).
regression!(r04_liveness_with_reordered_replies, Profile::Chaos, 1319);
// After a rollback the revision our takeover expected was reused by another
// write; the CAS hit a record the taker never judged. Fixed: notice the
// reuse and owe the absent-record wait (S6).
regression!(
    r05_cas_on_a_reused_revision_owes_the_absent_wait,
    Profile::Chaos,
    5506
);
// An emergency stop left the keeper armed; the next instance "adopted" a
// keeper that no longer ran the service and sat active with nothing running.
regression!(
    r06_keeper_disarmed_after_emergency_stop,
    Profile::Chaos,
    2034
);
// An agent killed mid graceful stop was restarted and adopted a keeper that
// was still stopping the service.
regression!(
    r07_no_adoption_of_a_keeper_that_is_stopping,
    Profile::Chaos,
    400
);
// The simulation merged a start-up stop into a failing graceful stop.
regression!(
    r08_startup_stop_escalates_a_failing_graceful_stop,
    Profile::Chaos,
    4042
);
// Found by a 100,000-seed sweep. After a rollback the revision a takeover
// expected was reused; the evidence arrived while the CAS was in flight,
// then our own write's watch event replaced it before the reply. Fixed: the
// in-flight acquisition remembers the reuse itself.
regression!(
    r09_reuse_seen_while_the_takeover_is_in_flight,
    Profile::Chaos,
    15418
);
// A foreign write (garbage) landed on our fresh record before the CAS reply:
// verify before activating.
regression!(
    r10_a_newer_foreign_write_is_verified_before_activating,
    Profile::Chaos,
    25229
);
// The checker forgot an absence when a late event of the old epoch arrived.
regression!(
    r11_late_old_epoch_event_after_a_recreate,
    Profile::Chaos,
    32354
);
// Found by seeds 10,000-100,000. A rollback lost a node's fresh
// acquisition over a release and handed the same revision to a second
// node's CAS: both activated. Fixed: a record at our own revision carrying
// someone else's write id is a store regression (S6) - for a holder's
// own-writes read or watch, and for a fresh acquisition (which then owes
// the absent-record wait).
regression!(
    r12_a_revision_reissued_after_a_rollback_is_noticed,
    Profile::Chaos,
    65824
);
// Found by seeds 20,000-120,000 (session 3). The bucket was re-created
// under a holder whose fencing gap (1 s) was larger than the taker's
// (250 ms): the taker waited W(--max-lease) + its own G and activated while
// the old holder's emergency stop, allowed its own G after the licence,
// still ran. Fixed: --max-gap, the longest G any holder may advertise, is
// owed with --max-lease when a record is absent or unreadable (S4).
regression!(
    r13_an_absent_record_owes_the_longest_gap_too,
    Profile::Chaos,
    41094
);
// Found by the million-seed sweep (session 4, the `skewed` profile). The
// agent froze after a renewal, before its keeper (slow to read) took the
// extension; the keeper fired at the older deadline; on waking, the fence
// hook's result was handled before the keeper's "fired", and the service
// started under a fired keeper (check f). Fixed: nothing starts once the
// keeper's last acknowledged deadline has passed; the activation waits for
// an acknowledged extension (or ends with the keeper's "fired").
regression!(
    r14_nothing_starts_past_the_keepers_acknowledged_deadline,
    Profile::Skewed,
    6159
);
// Found by the million-seed sweep (session 5, 5 of the first 242,836
// chaos seeds). A node stepping down saw the next holder's record (1:325)
// by watch, but a holder's view did not raise the store's trusted present;
// a rollback then showed the node its own older `released` (1:324), which
// it took at once (S3) while the rolled-back holder's service still ran.
// Fixed: every record seen, in any role, raises the trusted present (S6),
// so the rolled-back record is suspect and owes the absent wait.
regression!(
    r15_what_a_holder_saw_counts_after_a_rollback,
    Profile::Chaos,
    164586
);
regression!(
    r16_what_a_holder_saw_counts_after_a_rollback_too,
    Profile::Chaos,
    191278
);
// Same sweep. A standby whose replica view was stuck (stale reads) judged
// revision 1:104 stale; a rollback had meanwhile handed 1:104 to another
// node's fresh record, and the takeover CAS on "1:104" displaced a record
// the standby never saw, activating after G' instead of W + G'. Fixed: a
// stale takeover first reads the record from the leader after the
// store-clock witness; the same revision with other contents restarts the
// wait (S1 a). `mutation_stale_takeover_unconfirmed_is_caught` replays
// this seed with the read switched off.
regression!(
    r17_a_stale_takeover_reads_the_leader_first,
    Profile::Chaos,
    242835
);
regression!(
    r18_a_stale_takeover_reads_the_leader_first_too,
    Profile::Chaos,
    131456
);
// Same sweep: an acquisition whose outcome was unknown landed on a revision
// a rollback had reused, over a record the node never saw (it then waited
// the absent wait from the adoption, which check (d) does not accept for
// an unseen record). With (v) the run takes another course and is clean.
regression!(
    r19_an_adopted_acquisition_over_a_reused_revision,
    Profile::Chaos,
    162778
);
// Found by the deep sweep on the session-6 core (seeds 90,000–124,999). A
// standby sent its compare-and-swap over a `released` record (4:29); before
// the reply it saw, by watch, another node's acquisition over the same
// release (4:30, 4:31). A rollback then lost those two writes, the swap
// landed (4:38), and the standby activated at once (S3) beside the node
// whose writes were lost. Fixed, refinement (w): a foreign record newer
// than the revision replaced, seen while the swap was on its way, makes the
// acquisition a regression (S6): it owes the absent wait.
// The core test `s6_a_swap_that_lands_over_a_record_others_took_owes_the_absent_wait`
// is its mutation proof (after (x), this seed no longer reaches the case).
regression!(
    r20_a_swap_over_a_release_that_others_took_meanwhile,
    Profile::Chaos,
    104009
);
// Found by the deep sweep on the final session-7 core (seeds 600,000–
// 649,999), a liveness failure. A node that trusted the store's first
// incarnation took the lock when the bucket was re-created (epoch 2), held
// it, stepped down for health and released. Its own landed writes in epoch
// 2 never raised the token it trusted (only same-epoch tokens did), so the
// next holder's record, first seen after the release, looked like a
// re-created bucket: absent-like. Once its back-off ended the node took
// that record at once (7 s after it was written, T = 9 s) and owed W + G';
// the holder had crashed meanwhile and the takeover came 1 s past the
// bound. Fixed: a write of ours that landed is trusted in any epoch.
regression!(
    r21_own_writes_in_a_recreated_bucket_are_trusted,
    Profile::Chaos,
    629376
);
// A failback released to node1; the releaser's own view of its release,
// built from the reply, lacked the target, so it took its own handover
// back 0.24 s later, within the hold that was node1's (O1). Fixed: the
// releaser remembers the record it wrote, target included.
regression!(
    r22_the_releaser_leaves_its_handover_to_the_target,
    Profile::Operator,
    751
);
// Found by a 100,000-seed sweep once a live record of a re-created bucket
// was no longer taken at once (S6 (z)), a safety failure of refinement (w).
// Two standbys swapped over the same release; the first landed (4:187),
// activated at once (S3) and the store rolled that write back. The second,
// whose swap was still on its way, saw the first one's record at 4:187 by
// watch, then its own record at 4:187, then its reply: 4:187. (w) counted a
// foreign record only strictly between the replaced revision and ours, so
// a foreign record at our very revision, hidden behind our own in the view,
// went unnoticed and the second activated at once beside the first. Fixed:
// a foreign record at our own revision counts too (the store handed it out
// twice).
regression!(
    r23_a_foreign_record_at_our_own_revision_is_a_lost_write,
    Profile::Chaos,
    65435
);
// Found by a 150,000-seed sweep (seeds 100,000–249,999) of the session-14
// core, a safety failure of S6 introduced the same day: the start-up read
// that looks for this node's paused record (O2) did not count what it
// showed as seen. After a rollback the node then activated on a token below
// one it had read at start (1:105 after 1:106). Fixed: a start-up read's
// entry is noted like any other (and so is the adopted keeper's read).
regression!(r24_a_start_up_read_counts_as_seen, Profile::Chaos, 102841);
// Found by the same sweep, a liveness failure of S6 (z) as first written: a
// node first saw a re-created bucket's record after its holder had crashed,
// waited W for it to change, then took it as absent and waited W + G' more:
// past the failover bound. Fixed: the W already waited counts (S4 from the
// first sighting), and only G' is owed after the swap.
regression!(
    r25_a_dead_record_of_a_re_created_bucket_owes_w_once,
    Profile::Chaos,
    191561
);
// A harness fault found by the 100,000-seed sweep of the session-14 core:
// the operator's standing pause request, re-sent every round with a random
// delay, reached the holder after the resume and paused it again; it then
// crashed with its paused write on the way, and the liveness probe, opened
// as the store still showed the unpaused record, waited for a takeover the
// pause forbids. The harness now drops a request overtaken by a newer one
// (the shell reads the control record in order).
regression!(
    r26_a_pause_request_overtaken_by_the_resume_is_stale,
    Profile::Operator,
    5747
);
// Found by a sweep of seeds 10,000–499,999 of the session-32 core (issue
// 42): a standby whose traffic was held swapped over a release it saw in the
// held watch; the same batch showed another node's acquisition and renewals
// above it, which a rollback had lost; the swap landed on the restored
// release at a revision *below* them, and the node activated at once (S3)
// beside the node whose writes were lost. Refinement (w) counted only a
// foreign record at or below the swap's own revision. Fixed: any foreign
// record above the replaced one, seen while the swap was on its way, is a
// lost record; one seen after the reply, while confirming, owes the absent
// wait too.
regression!(
    r27_a_swap_that_lands_below_lost_records_owes_the_absent_wait,
    Profile::Chaos,
    115352
);
// Found by the same sweep, five seeds of one flaw in S6 (z): a record of a
// re-created bucket unchanged for W on the standby's own clock was taken
// without the store-clock witness (S1 b) and the leader read (v). A
// standby whose clock jumped forward took a live holder's record of the new
// incarnation while an old-incarnation holder still ran (the store replaced,
// then a jump). Fixed: such a record is taken like any stale record, with
// both witnesses.
regression!(
    r28_a_re_created_buckets_record_needs_the_store_clock_witness,
    Profile::Chaos,
    127069
);
regression!(
    r29_a_re_created_buckets_record_needs_the_store_clock_witness_too,
    Profile::Chaos,
    330876
);
regression!(
    r30_a_replaced_stores_record_needs_the_store_clock_witness,
    Profile::Chaos,
    373709
);
regression!(
    r31_a_re_created_buckets_record_needs_both_witnesses,
    Profile::Chaos,
    361948
);
regression!(
    r32_a_re_created_buckets_record_needs_both_witnesses_too,
    Profile::Chaos,
    453510
);
// Found by the same sweep: a node released (2:110), a rollback lost the
// release, another node's write reused revision 2:110, and the late watch
// event of the lost release reached the first node after the newer record
// at the same revision. It took "its release" at once (S3), swapping over
// the other node's record. Fixed: one revision seen with two contents is a
// store regression, judged as absent (S6).
regression!(
    r33_one_revision_with_two_contents_is_a_regression,
    Profile::Chaos,
    384865
);
// Found by the same sweep; a checker artifact. A node restarted right
// after a rollback it knew nothing of and took its own old release; the
// checker thought it had witnessed the rollback because a *new* record at a
// reused revision number pushed its highest seen number past the lost one.
// The checker now judges "witnessed" by the lost records' identity
// (revision and contents), per rollback, and excuses only an overlap with a
// node whose records that rollback lost; every other check stays on.
regression!(
    r34_a_rollback_is_witnessed_by_its_lost_records_not_their_numbers,
    Profile::Chaos,
    242205
);
// Found by the million-seed sweep of the session-33 core, two more checker
// artifacts of the same kind as r34: a standby cut off one way (every reply
// and event held back) kept swapping over the release it had seen; a
// rollback lost that release, another node's write reused its revision,
// and the swap landed over that write. The standby was shown nothing after
// the rollback but its own landing, above everything it knew: nothing could
// tell it. The checker now asks for *evidence* of a rollback — a lost record
// of another writer, then a record written since at or below it — before it
// holds a node to S6 (`RollbackView`).
regression!(
    r35_a_rollback_with_nothing_shown_since_is_not_witnessed,
    Profile::Chaos,
    311349
);
regression!(
    r36_a_rollback_with_nothing_shown_since_is_not_witnessed_too,
    Profile::Chaos,
    324459
);
// Found by a failsafe sweep of session 53 (seed 7490 of that profile): a
// re-created bucket's newcomer waited only W + G' while the holder whose
// record was lost ran on its members' grants. Fixed: absent and
// re-created records owe the cap too. The seed that catches the mutation
// `FailsafeAbsentWithoutCap` in today's profile is frozen here, clean.
regression!(
    r37_a_lost_failsafe_record_owes_the_cap,
    Profile::Failsafe,
    452
);
// Found by the million-seed failsafe sweep of session 55 (seeds 129307,
// 158459 and 166279, the same course each time): a holder restarted and
// took a released record before any member was reported, so the record it
// landed carried no failsafe set; its first renewal, carrying one, did not
// land (a partition), and it asked that set and extended on the grants —
// while a node outside the set, reading the set-less record, waited only
// W. Fixed: a holder asks only while every record of its that may be the
// newest carries a set (`FailsafeAskWithoutRecordedSet`).
regression!(
    r38_a_record_without_a_set_keeps_its_holder_off_grants,
    Profile::Failsafe,
    158459
);
regression!(
    r39_a_record_without_a_set_keeps_its_holder_off_grants_too,
    Profile::Failsafe,
    129307
);
regression!(
    r40_a_record_without_a_set_keeps_its_holder_off_grants_as_well,
    Profile::Failsafe,
    166279
);
