//! The licence deadline as a pure value: armed, extended, fired, and
//! which late requests it refuses.

use super::*;

/// Why the keeper refused an `arm` or `extend`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// No deadline is armed.
    #[error("not armed")]
    NotArmed,
    /// The deadline had passed when the request arrived: the licence ended.
    #[error("deadline passed")]
    Passed,
    /// The keeper fired; only a new `arm` starts another tenure.
    #[error("fired")]
    Fired,
}

/// The keeper's licence deadline: a pure state machine taking `now`.
///
/// Time comes in as a boot-time reading, so a suspend is just a jump of
/// `now`: after one that passes the deadline, [`Deadline::poll`] fires at once
/// and a late [`Deadline::extend`] is refused.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Deadline {
    /// No tenure: nothing to stop at any time.
    #[default]
    Disarmed,
    /// Stop at this instant unless extended first.
    Armed(Instant),
    /// The deadline passed; the emergency stop was made.
    Fired(Instant),
}

impl Deadline {
    /// Starts a tenure ending at `at`. Refused if `at` is not in the future.
    pub fn arm(&mut self, now: Instant, at: Instant) -> Result<(), Refusal> {
        if let Deadline::Armed(d) = *self {
            if now >= d {
                self.poll(now);
                return Err(Refusal::Passed);
            }
        }
        if at <= now {
            return Err(Refusal::Passed);
        }
        *self = Deadline::Armed(at);
        Ok(())
    }

    /// Moves the deadline to `at` (never backwards). Refused when the
    /// current deadline has passed — even if the timer has not been
    /// serviced yet — or when not armed.
    pub fn extend(&mut self, now: Instant, at: Instant) -> Result<(), Refusal> {
        match *self {
            Deadline::Disarmed => Err(Refusal::NotArmed),
            Deadline::Fired(_) => Err(Refusal::Fired),
            Deadline::Armed(d) if now >= d => {
                *self = Deadline::Fired(d);
                Err(Refusal::Passed)
            }
            Deadline::Armed(d) => {
                *self = Deadline::Armed(d.max(at));
                Ok(())
            }
        }
    }

    /// Ends the tenure without a stop (the service was stopped gracefully).
    pub fn disarm(&mut self) {
        *self = Deadline::Disarmed;
    }

    /// Returns `true` exactly once, when `now` has reached the deadline: the
    /// caller makes the emergency stop.
    pub fn poll(&mut self, now: Instant) -> bool {
        match *self {
            Deadline::Armed(d) if now >= d => {
                *self = Deadline::Fired(d);
                true
            }
            _ => false,
        }
    }

    /// The armed deadline, if any.
    pub fn armed(&self) -> Option<Instant> {
        match *self {
            Deadline::Armed(d) => Some(d),
            _ => None,
        }
    }
}
