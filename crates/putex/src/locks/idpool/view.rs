//! A consistent read of every record of a pool, and what a claimer may take
//! from it.

use super::records::*;
use super::*;

/// A consistent read of every record of a pool.
#[derive(Clone, Debug)]
pub(crate) struct PoolView {
    pub pool: String,
    /// The range from the meta record (`None`: absent or unreadable).
    pub range: Option<IdRange>,
    /// Whether a meta record exists but cannot be read.
    pub meta_unreadable: bool,
    pub ids: BTreeMap<u64, IdSlot>,
    pub names: BTreeMap<String, NameSlot>,
    /// Keys under the pool's prefix that are none of the above.
    pub strays: Vec<String>,
    /// The store's clock at the time of the read.
    pub now: StoreTime,
}

impl PoolView {
    /// Reads every record of `pool` (one marker write, one watch).
    pub async fn read<S: Store>(
        store: &S,
        pool: &Name,
        timeout: Duration,
    ) -> Result<PoolView, IdError> {
        let prefix = keys::id_pool(pool);
        let marker = keys::id_scan(pool);
        let (entries, now) = snapshot_synced(store, &prefix, &marker, timeout).await?;
        let mut view = PoolView {
            pool: pool.to_string(),
            range: None,
            meta_unreadable: false,
            ids: BTreeMap::new(),
            names: BTreeMap::new(),
            strays: Vec::new(),
            now,
        };
        for (key, e) in entries {
            let rest = &key[prefix.len()..];
            if rest == "meta" {
                view.range = MetaRecord::decode(&e.value, pool);
                view.meta_unreadable = view.range.is_none();
            } else if let Some(name) = rest.strip_prefix("name.") {
                view.names.insert(
                    name.to_owned(),
                    NameSlot {
                        token: e.token,
                        time: e.time,
                        record: NameRecord::decode(&e.value, pool, name),
                    },
                );
            } else if let Some(n) = rest.parse::<u64>().ok().filter(|n| n.to_string() == rest) {
                view.ids.insert(n, IdSlot::from_entry(e));
            } else {
                view.strays.push(key);
            }
        }
        Ok(view)
    }

    /// The free ids of `range` in the order a claimer tries them, with the
    /// token to compare-and-swap on (`None`: create). Never-used ids first,
    /// ascending; then `released` ones, oldest (lowest revision) first.
    /// Held, `revoked` and unreadable ids are never candidates.
    pub fn candidates(&self, range: IdRange) -> Vec<(u64, Option<Token>)> {
        let mut out: Vec<(u64, Option<Token>)> = (range.first..=range.last)
            .filter(|n| !self.ids.contains_key(n))
            .map(|n| (n, None))
            .collect();
        let mut released: Vec<(u64, Token)> = self
            .ids
            .iter()
            .filter(|(n, s)| {
                range.contains(**n)
                    && s.record.as_ref().map(|r| r.state) == Some(LockState::Released)
            })
            .map(|(n, s)| (*n, s.token))
            .collect();
        released.sort_by_key(|(n, t)| (t.revision, *n));
        out.extend(released.into_iter().map(|(n, t)| (n, Some(t))));
        out
    }

    /// How long ago (store time) a record was written; `None` if unknown
    /// (another clock domain).
    pub fn age(&self, then: StoreTime) -> Option<Duration> {
        match self.now.gap_since(then) {
            StoreGap::Forward(d) => Some(d),
            StoreGap::Backwards => Some(Duration::ZERO),
            StoreGap::Unbounded => None,
        }
    }

    /// The number of ids held by persistent claims.
    pub fn claimed(&self) -> usize {
        self.ids.values().filter(|s| s.claim && s.is_held()).count()
    }
}
