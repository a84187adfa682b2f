//! The checkers: pure functions over a recorded [`History`](crate::resource::History).
//!
//! Everything is judged on the harness's clock, from what the fenced
//! resource saw (service starts, writes, connection ends) and the faults the
//! harness recorded. No agent's log or clock is trusted for a verdict.
//!
//! - **Overlaps** ([`overlaps`]): two services running at once. A service
//!   runs from its `start` to its connection's end; one still running when
//!   the run ends is cut at the end. Two intervals overlap when one starts
//!   strictly before the other stops (equal stamps came out of the same
//!   `poll(2)`, so the harness cannot order them: not an overlap).
//! - **Stale writes accepted** ([`stale_accepted`]): a write that the
//!   resource accepted from a service after a service that started later
//!   had already started (the older tenure was superseded), or a write
//!   accepted with a token below one accepted before it (a broken fence).
//! - **Stale writes rejected** ([`stale_rejected`]): the resource turned a
//!   write away. Not a violation: proof that fencing was exercised, and
//!   required in scenarios built to provoke it.
//! - **Regressed tokens** ([`regressed`]): a service started with a token
//!   that is not above every token a service started with before it
//!   (fencing order; `docs/safety.md` S6 after a re-created bucket).
//! - **Failover time** ([`failovers`]): from a takeover fault to the next
//!   service start, against the bound B.
//! - **Transitions** ([`starts_between`], [`stops_between`]): service
//!   starts in a window, to count the spurious ones; where none is allowed,
//!   a service that stopped before the end counts too (a lapse with no
//!   takeover is an outage, not a ride-through).
//!
//! - **Guarded writes landed after a takeover** ([`guarded_after_takeover`]):
//!   where the resource is the store itself, every holder writes its
//!   tenure's token guardedly under a key of its own; the store's revisions
//!   order them. A write of tenure `t` that landed at revision `v` with some
//!   other tenure's acquisition `s` between (`t < s < v`: a takeover came
//!   first) is a write the store should have refused.
//! - **Tenures whose guarded writes never landed** ([`tenures_without_writes`]):
//!   the other side — a service that ran long enough wrote something.
//!
//! [`self_test`] feeds each checker a synthetic history with the fault it
//! exists to find, and fails if it does not find it (a check that cannot
//! fail is not a check).

use std::time::Duration;

use crate::resource::{show_token, Event, Tok, What};

/// A service's run on the harness clock.
#[derive(Clone, Debug, PartialEq)]
pub struct Interval {
    /// The connection.
    pub conn: u64,
    /// The node that ran it.
    pub node: String,
    /// Its fencing token.
    pub token: Tok,
    /// When it said `start`.
    pub start: u64,
    /// When its connection ended (`None`: still running at the end).
    pub stop: Option<u64>,
}

/// Every service run in `events`, in start order.
pub fn intervals(events: &[Event]) -> Vec<Interval> {
    let mut out: Vec<Interval> = Vec::new();
    for e in events {
        match &e.what {
            What::Start { node, token, .. } => out.push(Interval {
                conn: e.conn,
                node: node.clone(),
                token: *token,
                start: e.at,
                stop: None,
            }),
            What::Stop => {
                if let Some(i) = out.iter_mut().find(|i| i.conn == e.conn) {
                    i.stop = Some(e.at);
                }
            }
            _ => {}
        }
    }
    out.sort_by_key(|i| (i.start, i.conn));
    out
}

/// An overlap of two services: the earlier one, the later one, and how long
/// both ran.
#[derive(Clone, Debug)]
pub struct Overlap {
    /// The service that started first.
    pub first: Interval,
    /// The one that started while the first still ran.
    pub second: Interval,
    /// How long both ran, in nanoseconds.
    pub ns: u64,
}

/// Pairs of services that ran at once; `end` cuts the ones still running.
pub fn overlaps(events: &[Event], end: u64) -> Vec<Overlap> {
    let iv = intervals(events);
    let mut out = Vec::new();
    for (i, a) in iv.iter().enumerate() {
        let a_stop = a.stop.unwrap_or(end);
        for b in &iv[i + 1..] {
            if b.start >= a_stop {
                continue;
            }
            let b_stop = b.stop.unwrap_or(end);
            if b.start > a.start || (b.start == a.start && b.conn != a.conn) {
                out.push(Overlap {
                    first: a.clone(),
                    second: b.clone(),
                    ns: a_stop.min(b_stop).saturating_sub(b.start),
                });
            }
        }
    }
    out
}

/// Writes the resource accepted that it should not have: from a tenure
/// after a later tenure started, or below an earlier accepted token.
pub fn stale_accepted(events: &[Event]) -> Vec<Event> {
    let iv = intervals(events);
    let mut highest: Option<Tok> = None;
    let mut out = Vec::new();
    for e in events {
        let (token, accepted) = match &e.what {
            What::Write {
                token, accepted, ..
            } => (*token, *accepted),
            What::Start {
                token, accepted, ..
            } => (*token, *accepted),
            _ => continue,
        };
        if !accepted {
            continue;
        }
        let Some(mine) = iv.iter().find(|i| i.conn == e.conn) else {
            continue;
        };
        let superseded = iv
            .iter()
            .any(|o| o.conn != mine.conn && o.start > mine.start && o.start < e.at);
        let below = highest.is_some_and(|h| token < h);
        if superseded || below {
            out.push(e.clone());
        }
        highest = Some(highest.map_or(token, |h| h.max(token)));
    }
    out
}

/// Writes the resource rejected.
pub fn stale_rejected(events: &[Event]) -> usize {
    events
        .iter()
        .filter(|e| {
            matches!(
                e.what,
                What::Write {
                    accepted: false,
                    ..
                } | What::Start {
                    accepted: false,
                    ..
                }
            )
        })
        .count()
}

/// A guarded write found in the store: the tenure's token it carries (its
/// key names it) and the store's token of the write itself.
#[derive(Clone, Debug, PartialEq)]
pub struct StoreWrite {
    /// The key.
    pub key: String,
    /// The tenure that wrote it.
    pub tenure: Tok,
    /// Where the store put it.
    pub at: Tok,
}

/// Guarded writes that landed where the lock was no longer their tenure's:
/// before their own acquisition, or after another tenure's (any token a
/// service started with or a write carries, of the same epoch, between
/// the write's tenure and the write).
pub fn guarded_after_takeover(writes: &[StoreWrite], events: &[Event]) -> Vec<String> {
    let mut tenures: Vec<Tok> = intervals(events).iter().map(|i| i.token).collect();
    tenures.extend(writes.iter().map(|w| w.tenure));
    tenures.sort_unstable();
    tenures.dedup();
    let mut out = Vec::new();
    for w in writes {
        if w.at.0 != w.tenure.0 {
            continue;
        }
        if w.at <= w.tenure {
            out.push(format!(
                "{} landed at {}, not after its tenure's acquisition {}",
                w.key,
                show_token(w.at),
                show_token(w.tenure)
            ));
        } else if let Some(s) = tenures
            .iter()
            .find(|s| s.0 == w.tenure.0 && **s > w.tenure && **s < w.at)
        {
            out.push(format!(
                "{} of tenure {} landed at {}, after tenure {} had taken the lock",
                w.key,
                show_token(w.tenure),
                show_token(w.at),
                show_token(*s)
            ));
        }
    }
    out
}

/// Services that ran for `min` or longer (to their stop, or to `end`) and
/// whose tenure has no guarded write in the store.
pub fn tenures_without_writes(
    writes: &[StoreWrite],
    events: &[Event],
    end: u64,
    min: Duration,
) -> Vec<Interval> {
    let min = u64::try_from(min.as_nanos()).unwrap_or(u64::MAX);
    intervals(events)
        .into_iter()
        .filter(|i| i.stop.unwrap_or(end).saturating_sub(i.start) >= min)
        .filter(|i| !writes.iter().any(|w| w.tenure == i.token))
        .collect()
}

/// Starts whose token is not above every token started with before:
/// (the earlier start with the highest token, the regressed start).
pub fn regressed(events: &[Event]) -> Vec<(Interval, Interval)> {
    let iv = intervals(events);
    let mut out = Vec::new();
    let mut best: Option<&Interval> = None;
    for i in &iv {
        if let Some(b) = best {
            if i.token <= b.token {
                out.push((b.clone(), i.clone()));
                continue;
            }
        }
        best = Some(i);
    }
    out
}

/// For each takeover fault instant, the time to the next service start
/// (`None` if none came before `end`).
pub fn failovers(events: &[Event], faults: &[u64], end: u64) -> Vec<Option<Duration>> {
    let starts: Vec<u64> = intervals(events).iter().map(|i| i.start).collect();
    faults
        .iter()
        .map(|&f| {
            starts
                .iter()
                .find(|&&s| s > f && s <= end)
                .map(|&s| Duration::from_nanos(s - f))
        })
        .collect()
}

/// Service starts in `(from, to]`.
pub fn starts_between(events: &[Event], from: u64, to: u64) -> usize {
    intervals(events)
        .iter()
        .filter(|i| i.start > from && i.start <= to)
        .count()
}

/// Services that stopped in `(from, to]`: in a scenario that allows no
/// transition, a holder that stopped before the end is one, even when
/// nobody took over (the service was down, not moved).
pub fn stops_between(events: &[Event], from: u64, to: u64) -> usize {
    intervals(events)
        .iter()
        .filter(|i| i.stop.is_some_and(|s| s > from && s <= to))
        .count()
}

/// Percentile (0–100) of durations, nearest rank.
pub fn percentile(v: &[Duration], p: usize) -> Option<Duration> {
    if v.is_empty() {
        return None;
    }
    let mut s = v.to_vec();
    s.sort();
    let rank = (p * s.len()).div_ceil(100).clamp(1, s.len());
    Some(s[rank - 1])
}

/// Synthetic histories with a known violation each; every checker must
/// find its own. Returns the failures (empty: all checkers work).
pub fn self_test() -> Vec<String> {
    let ms = |m: u64| m * 1_000_000;
    let start = |at, conn, node: &str, token: Tok| Event {
        at: ms(at),
        conn,
        what: What::Start {
            node: node.into(),
            token,
            pid: 1,
            accepted: true,
        },
    };
    let write = |at, conn, token: Tok, accepted| Event {
        at: ms(at),
        conn,
        what: What::Write {
            token,
            accepted,
            highest: None,
        },
    };
    let stop = |at, conn| Event {
        at: ms(at),
        conn,
        what: What::Stop,
    };
    let mut failures = Vec::new();
    let mut expect = |ok: bool, what: &str| {
        if !ok {
            failures.push(what.to_owned());
        }
    };

    // A clean handover: no finding anywhere.
    let clean = vec![
        start(0, 1, "a", (1, 10)),
        write(50, 1, (1, 10), true),
        stop(100, 1),
        start(101, 2, "b", (1, 12)),
        write(150, 2, (1, 12), true),
    ];
    expect(overlaps(&clean, ms(200)).is_empty(), "clean: no overlap");
    expect(stale_accepted(&clean).is_empty(), "clean: no stale write");
    expect(stale_rejected(&clean) == 0, "clean: nothing rejected");
    expect(regressed(&clean).is_empty(), "clean: tokens increase");
    // Stamps from one poll: not an overlap.
    let tie = vec![
        start(0, 1, "a", (1, 10)),
        stop(100, 1),
        start(100, 2, "b", (1, 12)),
    ];
    expect(overlaps(&tie, ms(200)).is_empty(), "tie: not an overlap");

    // b starts while a still runs: one overlap of 40 ms.
    let overlap = vec![
        start(0, 1, "a", (1, 10)),
        start(60, 2, "b", (1, 12)),
        stop(100, 1),
    ];
    let found = overlaps(&overlap, ms(200));
    expect(
        found.len() == 1 && found[0].ns == ms(40),
        "overlap: found, 40 ms",
    );
    // A service still running at the end overlaps too.
    let open = vec![start(0, 1, "a", (1, 10)), start(60, 2, "b", (1, 12))];
    expect(
        overlaps(&open, ms(200)).len() == 1,
        "overlap: open interval",
    );

    // a's write after b started, accepted: stale (a broken resource, or a
    // regressed token that let the old holder win).
    let stale = vec![
        start(0, 1, "a", (1, 10)),
        stop(90, 1),
        start(100, 2, "b", (1, 12)),
        write(110, 1, (1, 10), true),
    ];
    expect(
        stale_accepted(&stale).len() == 1,
        "stale accepted: superseded",
    );
    let below = vec![
        start(0, 1, "a", (1, 10)),
        write(10, 1, (1, 10), true),
        write(20, 1, (1, 9), true),
    ];
    expect(stale_accepted(&below).len() == 1, "stale accepted: below");
    let rejected = vec![
        start(0, 1, "a", (1, 10)),
        start(100, 2, "b", (1, 12)),
        write(110, 1, (1, 10), false),
    ];
    expect(stale_rejected(&rejected) == 1, "stale rejected: counted");
    expect(
        stale_accepted(&rejected).is_empty(),
        "stale rejected: not accepted",
    );

    // A re-created bucket that handed out a lower token.
    let regress = vec![
        start(0, 1, "a", (5, 900)),
        stop(90, 1),
        start(100, 2, "b", (5, 3)),
    ];
    expect(regressed(&regress).len() == 1, "regressed: found");
    let new_epoch = vec![
        start(0, 1, "a", (5, 900)),
        stop(90, 1),
        start(100, 2, "b", (6, 3)),
    ];
    expect(regressed(&new_epoch).is_empty(), "new epoch: not regressed");

    // The store as the resource: a at 10, b took it at 12, c at 20.
    let sw = |key: &str, tenure: u64, at: u64| StoreWrite {
        key: key.into(),
        tenure: (1, tenure),
        at: (1, at),
    };
    let fine = [sw("a1", 10, 11), sw("b1", 12, 13), sw("b2", 12, 15)];
    let three = vec![
        start(0, 1, "a", (1, 10)),
        stop(90, 1),
        start(100, 2, "b", (1, 12)),
        stop(190, 2),
        start(200, 3, "c", (1, 20)),
    ];
    expect(
        guarded_after_takeover(&fine, &three).is_empty(),
        "guarded: in order",
    );
    expect(
        guarded_after_takeover(&[sw("a2", 10, 14)], &three).len() == 1,
        "guarded: a's write after b's acquisition",
    );
    // c's acquisition is known only from its start, not from a write.
    expect(
        guarded_after_takeover(&[sw("b3", 12, 21)], &three).len() == 1,
        "guarded: b's write after c's acquisition",
    );
    expect(
        guarded_after_takeover(&[sw("a0", 10, 9)], &three).len() == 1,
        "guarded: a write before its own acquisition",
    );
    let idle = tenures_without_writes(&fine, &three, ms(1000), Duration::from_millis(500));
    expect(
        idle.len() == 1 && idle[0].node == "c",
        "guarded: c ran 800 ms and wrote nothing",
    );

    // Failover: a fault at 0 and the next start 500 ms later.
    let f = failovers(&clean, &[ms(0) + 1, ms(120)], ms(200));
    expect(
        f == vec![Some(Duration::from_nanos(ms(101) - 1)), None],
        "failover: timed, and missing when nothing started",
    );
    expect(
        starts_between(&clean, ms(50), ms(200)) == 1,
        "transitions: counted",
    );
    expect(
        stops_between(&clean, 0, ms(200)) == 1 && stops_between(&clean, ms(100), ms(200)) == 0,
        "stops: counted",
    );
    expect(
        percentile(&[Duration::from_millis(1), Duration::from_millis(9)], 50)
            == Some(Duration::from_millis(1)),
        "percentile: p50 of two",
    );
    failures
}

#[cfg(test)]
mod tests {
    #[test]
    fn every_checker_finds_its_violation() {
        let f = super::self_test();
        assert!(f.is_empty(), "{f:?}");
    }
}
