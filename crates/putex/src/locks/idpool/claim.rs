//! Claiming and releasing ids: the claim's steps (see the module docs of
//! [`super`]) and the give-backs that keep a crashed claim from leaving an
//! orphan.

use super::records::*;
use super::*;

/// How many times an unknown write outcome is looked into (a leader read,
/// and the same write sent again) before it is reported as unknown.
const SETTLE_ATTEMPTS: u32 = 12;

/// Creates (`expected: None`) or compare-and-swaps a record whose `write`
/// field is `write`. `Some(token)` when it was written, `None` when it
/// definitely was not (a conflict).
///
/// An unknown outcome (H4) is settled, never guessed: a write that timed
/// out may still land later. A leader read that shows our write id says it
/// landed. One that shows the record moved on without it says it never
/// will (its condition is gone). One that shows the record still where our
/// write expected it says nothing yet: the same write (same write id) is
/// sent again, and its definite answer — written, or a conflict that the
/// next read explains — settles both. Only a store that stays unreachable
/// through [`SETTLE_ATTEMPTS`] looks (with back-off) is an error, and the
/// error says the outcome is unknown: a claim is never reported as not
/// made while it might still land (an orphan).
async fn write_checked<S: Store>(
    store: &S,
    key: &str,
    value: &[u8],
    write: &str,
    expected: Option<Token>,
    timeout: Duration,
) -> Result<Option<Token>, IdError> {
    let send = || async {
        match expected {
            None => store.create(key, value, timeout).await,
            Some(t) => store.update(key, value, t, timeout).await,
        }
    };
    let mut last = match send().await {
        Ok(t) => return Ok(Some(t)),
        Err(e) if e.is_conflict() => return Ok(None),
        Err(e) if e.is_unknown() => e,
        Err(e) => return Err(e.into()),
    };
    let mut pause = FIRST_PAUSE;
    for _ in 0..SETTLE_ATTEMPTS {
        tracing::debug!(key, error = %last, "write outcome unknown; reading it back");
        match store.get(key, ReadMode::Leader, timeout).await {
            Ok(Some(b)) if write_of(&b.value).as_deref() == Some(write) => {
                return Ok(Some(b.token));
            }
            Ok(back) => {
                let unchanged = match (expected, &back) {
                    (None, None) => true,
                    (Some(t), Some(b)) => b.token == t,
                    _ => false,
                };
                if !unchanged {
                    // Moved on without our write: its condition is gone.
                    return Ok(None);
                }
                match send().await {
                    Ok(t) => return Ok(Some(t)),
                    // Ours landed meanwhile, or someone else's: read again.
                    Err(e) if e.is_conflict() => continue,
                    Err(e) if e.is_unknown() => last = e,
                    Err(e) => return Err(e.into()),
                }
            }
            Err(e) if e.is_unknown() => last = e,
            Err(e) => return Err(e.into()),
        }
        tokio::time::sleep(pause).await;
        pause = longer(pause);
    }
    Err(last.into())
}

/// The first pause before a store call is tried again.
const FIRST_PAUSE: Duration = Duration::from_millis(10);

/// The pause after `pause`: twice as long, at most 500 ms.
fn longer(pause: Duration) -> Duration {
    (pause * 2).min(Duration::from_millis(500))
}

/// Runs a read again while its answer does not come (a timeout, a lost
/// connection) and the claim still has time: a read changes nothing, so
/// trying it again is always safe, and a store that was slow for a moment
/// does not fail a claim that could still finish. Any other error, and
/// the last one at `give_up`, is returned.
async fn read_patiently<T, F, Fut>(give_up: Instant, mut read: F) -> Result<T, IdError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, IdError>>,
{
    let mut pause = FIRST_PAUSE;
    loop {
        match read().await {
            Err(IdError::Store(e)) if e.is_unknown() && Instant::now() + pause < give_up => {
                tracing::debug!(error = %e, "read unanswered; trying again");
                tokio::time::sleep(pause).await;
                pause = longer(pause);
            }
            other => return other,
        }
    }
}

/// Reads the pool's range from its meta record, creating it with `asked`
/// on first use; refuses a different `asked` range.
pub(crate) async fn pool_range<S: Store>(
    store: &S,
    pool: &Name,
    asked: Option<IdRange>,
    timeout: Duration,
) -> Result<IdRange, IdError> {
    let key = keys::id_meta(pool);
    loop {
        let stored = match store.get(&key, ReadMode::Leader, timeout).await? {
            Some(e) => MetaRecord::decode(&e.value, pool).ok_or_else(|| IdError::Unreadable {
                pool: pool.to_string(),
                key: key.clone(),
                name: None,
            })?,
            None => {
                let Some(range) = asked else {
                    return Err(IdError::NoRange {
                        pool: pool.to_string(),
                    });
                };
                let meta = MetaRecord {
                    v: RECORD_VERSION,
                    kind: "meta".into(),
                    pool: pool.to_string(),
                    first: range.first,
                    last: range.last,
                };
                let bytes = serde_json::to_vec(&meta).expect("meta serialises");
                match store.create(&key, &bytes, timeout).await {
                    Ok(_) => return Ok(range),
                    // Created concurrently, or our create landed: read it.
                    Err(e) if e.is_conflict() || e.is_unknown() => continue,
                    Err(e) => return Err(e.into()),
                }
            }
        };
        return match asked {
            Some(asked) if asked != stored => Err(IdError::RangeMismatch {
                pool: pool.to_string(),
                stored,
                asked,
            }),
            _ => Ok(stored),
        };
    }
}

/// The outcome of a [`claim`].
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Claimed {
    /// The claimed id, within the pool's range; a claim with the same name
    /// gets the same id until it is released.
    pub id: u64,
    /// Whether the name already held it (an idempotent re-claim, or a
    /// concurrent claim with the same name that finished first).
    pub existing: bool,
}

/// Claims an id of `pool` for `who`, or returns the one it already holds.
///
/// `range` is the pool's range: required for the first claim of a pool
/// (it is stored), optional after it, refused if different. Fails with
/// [`IdError::Exhausted`] when no id is free, [`IdError::OtherMachine`]
/// when the name is held from another machine.
pub async fn claim<S: Store>(
    store: &S,
    pool: &Name,
    range: Option<IdRange>,
    who: &Claimant,
    opts: &Options,
) -> Result<Claimed, IdError> {
    let t = opts.timeout;
    let started = Instant::now();
    let give_up = started + opts.deadline;
    // Its create is settled by the read after it, so all of it may run again.
    let range = read_patiently(give_up, || pool_range(store, pool, range, t)).await?;
    let name_key = keys::id_name(pool, &who.name);
    let instance = instance_id();
    // The name record, from the leader.
    let read_name = || {
        read_patiently(give_up, || async {
            Ok(store.get(&name_key, ReadMode::Leader, t).await?)
        })
    };
    let busy = || IdError::Busy {
        pool: pool.to_string(),
        name: who.name.to_string(),
        waited: started.elapsed(),
    };
    // The pending record of another claim of this name we are waiting out,
    // and since when it has not changed.
    let mut waiting: Option<(Token, Instant)> = None;
    loop {
        if Instant::now() >= give_up {
            return Err(busy());
        }
        let pending = NameRecord::new(pool, who, NameState::Pending, None);
        let over = match read_name().await? {
            None => None,
            Some(entry) => {
                let Some(rec) = NameRecord::decode(&entry.value, pool, &who.name) else {
                    return Err(IdError::Unreadable {
                        pool: pool.to_string(),
                        key: name_key.clone(),
                        name: Some(who.name.to_string()),
                    });
                };
                if rec.machine != who.machine {
                    return Err(IdError::OtherMachine {
                        pool: pool.to_string(),
                        name: who.name.to_string(),
                        id: rec.id,
                        holder: rec.machine,
                        this: who.machine.clone(),
                    });
                }
                match (rec.state, rec.id) {
                    (NameState::Bound, Some(n)) => {
                        if read_patiently(give_up, || confirm(store, pool, n, who, t)).await? {
                            return Ok(Claimed {
                                id: n,
                                existing: true,
                            });
                        }
                        // The id record does not name us back (an
                        // interrupted release, a hand edit): claim anew.
                        tracing::debug!(pool = %pool, name = %who.name, id = n, "broken binding; claiming anew");
                        Some(entry.token)
                    }
                    _ => {
                        // Another claim of this name is under way: wait for
                        // it, or take over a record that stopped changing.
                        let now = Instant::now();
                        match waiting {
                            Some((tok, since)) if tok == entry.token => {
                                if now.duration_since(since) < opts.pending_takeover {
                                    tokio::time::sleep(PENDING_POLL).await;
                                    continue;
                                }
                                tracing::debug!(pool = %pool, name = %who.name, "taking over a stalled pending claim");
                                Some(entry.token)
                            }
                            _ => {
                                waiting = Some((entry.token, now));
                                tokio::time::sleep(PENDING_POLL).await;
                                continue;
                            }
                        }
                    }
                }
            }
        };
        let Some(ours) =
            write_checked(store, &name_key, &pending.encode(), &pending.write, over, t).await?
        else {
            continue; // someone else wrote the name record first: look again
        };
        waiting = None;
        let (n, id_token) = match take_id(store, pool, range, who, &instance, opts, give_up).await {
            Ok(x) => x,
            Err(e) => {
                // Leave no pending record behind (best effort).
                let _ = store.retire(&name_key, ours, t).await;
                return Err(e);
            }
        };
        let bound = NameRecord::new(pool, who, NameState::Bound, Some(n));
        if write_checked(
            store,
            &name_key,
            &bound.encode(),
            &bound.write,
            Some(ours),
            t,
        )
        .await?
        .is_some()
        {
            return Ok(Claimed {
                id: n,
                existing: false,
            });
        }
        // Our pending record was changed: a takeover (which may have bound
        // this very id to the name), or a release. Give the id back unless
        // it is bound; the compare-and-swap is on our own write, so an id
        // record someone else has written since is never touched.
        let now_bound = read_name()
            .await?
            .and_then(|e| NameRecord::decode(&e.value, pool, &who.name))
            .is_some_and(|r| r.state == NameState::Bound && r.id == Some(n));
        if !now_bound {
            give_back(store, pool, n, who, &instance, id_token, t).await?;
        }
    }
}

/// Whether id record `n` is an active claim of `who`. An active claim of
/// this name from another machine is refused.
async fn confirm<S: Store>(
    store: &S,
    pool: &Name,
    n: u64,
    who: &Claimant,
    timeout: Duration,
) -> Result<bool, IdError> {
    let key = keys::id_record(pool, n);
    let Some(e) = store.get(&key, ReadMode::Leader, timeout).await? else {
        return Ok(false);
    };
    match Observed::decode(&e.value) {
        Observed::Record(r) if r.node == who.name.as_str() && r.state == LockState::Active => {
            if r.machine != who.machine {
                return Err(IdError::OtherMachine {
                    pool: pool.to_string(),
                    name: who.name.to_string(),
                    id: Some(n),
                    holder: r.machine,
                    this: who.machine.clone(),
                });
            }
            Ok(true)
        }
        _ => Ok(false),
    }
}

/// Writes `released` over an id record we took (on its token); a conflict
/// means someone else has written it since, and it is left alone.
async fn give_back<S: Store>(
    store: &S,
    pool: &Name,
    n: u64,
    who: &Claimant,
    instance: &str,
    token: Token,
    timeout: Duration,
) -> Result<(), IdError> {
    let key = keys::id_record(pool, n);
    let mut rec = claim_record(who, instance);
    rec.state = LockState::Released;
    write_checked(
        store,
        &key,
        &encode_id(pool, n, &rec),
        &rec.write,
        Some(token),
        timeout,
    )
    .await?;
    Ok(())
}

/// Step 3 of a claim: takes an id record for `who`.
async fn take_id<S: Store>(
    store: &S,
    pool: &Name,
    range: IdRange,
    who: &Claimant,
    instance: &str,
    opts: &Options,
    give_up: Instant,
) -> Result<(u64, Token), IdError> {
    let started = Instant::now();
    loop {
        if Instant::now() >= give_up {
            return Err(IdError::Busy {
                pool: pool.to_string(),
                name: who.name.to_string(),
                waited: started.elapsed(),
            });
        }
        let view = read_patiently(give_up, || PoolView::read(store, pool, opts.timeout)).await?;
        // An id of ours left by an interrupted claim comes first: resume it.
        let mut order: Vec<(u64, Option<Token>)> = view
            .ids
            .iter()
            .filter(|(n, s)| {
                range.contains(**n)
                    && s.held_by_name(&who.name)
                        .is_some_and(|r| r.machine == who.machine)
            })
            .map(|(n, s)| (*n, Some(s.token)))
            .collect();
        order.extend(view.candidates(range));
        if order.is_empty() {
            let count = |label: &str| {
                view.ids
                    .iter()
                    .filter(|(n, s)| range.contains(**n) && s.state_label() == label)
                    .count()
            };
            let (revoked, garbage) = (count("revoked"), count("garbage"));
            let detail = if revoked + garbage > 0 {
                format!(
                    " ({revoked} of them revoked, {garbage} unreadable: see `putex id list {pool}`)"
                )
            } else {
                String::new()
            };
            return Err(IdError::Exhausted {
                pool: pool.to_string(),
                size: range.size(),
                detail,
            });
        }
        let mut conflicts = 0;
        for (n, expected) in order {
            let key = keys::id_record(pool, n);
            let rec = claim_record(who, instance);
            let bytes = encode_id(pool, n, &rec);
            match write_checked(store, &key, &bytes, &rec.write, expected, opts.timeout).await? {
                Some(token) => return Ok((n, token)),
                None => {
                    conflicts += 1;
                    if conflicts >= RESNAPSHOT_AFTER {
                        break;
                    }
                }
            }
        }
    }
}

/// The free ids of `pool` within `range`, in the order a claimer tries
/// them: never-used ids ascending, then `released` ids, oldest first. Held
/// (`active`/`confirming`), `revoked` and unreadable ids are left out.
///
/// For claimers that hold an id only for a while (the lock state machine
/// on `id.<pool>.<n>`): each candidate may be gone by the time it is
/// tried, so the claim itself must still be a create or compare-and-swap.
pub async fn free_candidates<S: Store>(
    store: &S,
    pool: &Name,
    range: IdRange,
) -> Result<Vec<u64>, IdError> {
    let view = PoolView::read(store, pool, Options::default().timeout).await?;
    Ok(view.candidates(range).into_iter().map(|(n, _)| n).collect())
}

/// The outcome of a [`release`].
#[derive(Clone, PartialEq, Eq, Debug, Default)]
pub struct Released {
    /// The ids written, with the state written: `released` for the owner's
    /// own claims, `revoked` for another machine's (`force`).
    pub ids: Vec<(u64, LockState)>,
    /// Whether a name record was removed.
    pub name_record: bool,
}

impl Released {
    /// Whether there was nothing to release.
    pub fn is_empty(&self) -> bool {
        self.ids.is_empty() && !self.name_record
    }
}

/// Releases what `who`'s name holds in `pool`: its id record becomes
/// `released` (or `revoked` when it belongs to another machine and `force`
/// is set), its name record is removed. Without `force`, another machine's
/// claim is refused with [`IdError::NotOwner`]. Nothing to release is not
/// an error (an empty [`Released`]).
pub async fn release<S: Store>(
    store: &S,
    pool: &Name,
    who: &Claimant,
    force: bool,
    opts: &Options,
) -> Result<Released, IdError> {
    let t = opts.timeout;
    let name_key = keys::id_name(pool, &who.name);
    let started = Instant::now();
    let mut done = Released::default();
    for _ in 0..RELEASE_ATTEMPTS {
        let name_entry = store.get(&name_key, ReadMode::Leader, t).await?;
        if let Some(e) = &name_entry {
            match NameRecord::decode(&e.value, pool, &who.name) {
                Some(rec) if rec.machine != who.machine && !force => {
                    return Err(IdError::NotOwner {
                        pool: pool.to_string(),
                        name: who.name.to_string(),
                        id: rec.id,
                        holder: rec.machine,
                        this: who.machine.clone(),
                    })
                }
                None if !force => {
                    return Err(IdError::Unreadable {
                        pool: pool.to_string(),
                        key: name_key.clone(),
                        name: Some(who.name.to_string()),
                    })
                }
                _ => {}
            }
        }
        let view = PoolView::read(store, pool, t).await?;
        let held: Vec<(u64, Token, LockRecord)> = view
            .ids
            .iter()
            .filter_map(|(n, s)| s.held_by_name(&who.name).map(|r| (*n, s.token, r.clone())))
            .collect();
        if !force {
            if let Some((n, _, r)) = held.iter().find(|(_, _, r)| r.machine != who.machine) {
                return Err(IdError::NotOwner {
                    pool: pool.to_string(),
                    name: who.name.to_string(),
                    id: Some(*n),
                    holder: r.machine.clone(),
                    this: who.machine.clone(),
                });
            }
        }
        let mut conflict = false;
        for (n, token, mut rec) in held {
            let key = keys::id_record(pool, n);
            if rec.machine == who.machine {
                rec.state = LockState::Released;
                rec.instance = instance_id();
            } else {
                // S7: a revocation keeps the holder's identity and timing.
                rec.state = LockState::Revoked;
            }
            rec.write = instance_id();
            let bytes = encode_id(pool, n, &rec);
            if write_checked(store, &key, &bytes, &rec.write, Some(token), t)
                .await?
                .is_some()
            {
                done.ids.push((n, rec.state));
            } else {
                conflict = true;
                break;
            }
        }
        if conflict {
            continue;
        }
        if let Some(e) = name_entry {
            match store.retire(&name_key, e.token, t).await {
                Ok(()) => done.name_record = true,
                Err(err) if err.is_conflict() => continue,
                Err(err) if err.is_unknown() => {
                    if store.get(&name_key, ReadMode::Leader, t).await?.is_some() {
                        continue;
                    }
                    done.name_record = true;
                }
                Err(err) => return Err(err.into()),
            }
        }
        return Ok(done);
    }
    Err(IdError::Busy {
        pool: pool.to_string(),
        name: who.name.to_string(),
        waited: started.elapsed(),
    })
}
