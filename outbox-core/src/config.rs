//! Relay settings, validated before a relay starts.

use std::time::Duration;

use rand::Rng;

use crate::error::{Error, Result};

/// How the relay holds the rows it is publishing.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum ClaimMode {
    /// The default: [`Transaction`](ClaimMode::Transaction) where the database locks rows (PostgreSQL,
    /// MySQL/MariaDB), and a [`Lease`](ClaimMode::Lease) of [`auto_lease`](ClaimMode::auto_lease) where a
    /// transaction holds the database's only write lock (SQLite), so that the app's own writes never wait
    /// for a broker. [`Relay::new`](crate::Relay::new) resolves it from
    /// [`OutboxStore::claims_block_writers`](crate::store::OutboxStore::claims_block_writers).
    #[default]
    Auto,
    /// Lock the claimed rows (`FOR UPDATE SKIP LOCKED`) in a transaction that stays open while the
    /// publisher runs, then mark and commit. Fast; right for brokers that answer in milliseconds. On SQLite
    /// the transaction holds the database's write lock while the broker answers: business writes wait.
    Transaction,
    /// Stamp the rows with a lease token and expiry, commit, publish outside any transaction, then mark
    /// only rows whose token still matches. Right for slow destinations: no transaction stays open, and a
    /// relay that paused past its lease cannot overwrite the outcome of the relay that took over.
    Lease {
        /// How long a claim stays exclusive.
        duration: Duration,
    },
}

impl ClaimMode {
    /// The lease [`ClaimMode::Auto`] takes where it leases: three publish timeouts, at least 30 s.
    pub fn auto_lease(publish_timeout: Duration) -> Duration {
        publish_timeout.saturating_mul(3).clamp(Duration::from_secs(30), MAX_LEASE)
    }

    /// `self` with [`ClaimMode::Auto`] decided for a store whose claims do (`true`) or do not block
    /// writers.
    pub fn resolve(self, claims_block_writers: bool, publish_timeout: Duration) -> ClaimMode {
        match self {
            ClaimMode::Auto if claims_block_writers => ClaimMode::Lease { duration: Self::auto_lease(publish_timeout) },
            ClaimMode::Auto => ClaimMode::Transaction,
            mode => mode,
        }
    }
}

/// What happens to the later events of an aggregate whose earlier event is dead.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum DeadLetterPolicy {
    /// The aggregate stops until the dead event is replayed: order is never broken.
    #[default]
    BlockAggregate,
    /// Later events go on; the dead one is set aside (consumers see a gap in that aggregate).
    SkipDead,
}

/// Exponential backoff with equal jitter and a cap.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Backoff {
    /// Delay after the first failure.
    pub initial: Duration,
    /// No delay exceeds this (default 5 minutes).
    pub max: Duration,
    /// Growth factor per attempt (default 2).
    pub multiplier: u32,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff { initial: Duration::from_secs(1), max: Duration::from_secs(300), multiplier: 2 }
    }
}

impl Backoff {
    /// The delay before retrying after the `attempt`-th failure (1-based): the capped exponential
    /// delay `d`, jittered uniformly into `[d/2, d]` so that relays retrying together spread out.
    pub fn delay(&self, attempt: i32) -> Duration {
        let exponent = attempt.saturating_sub(1).clamp(0, 62) as u32;
        let factor = u64::from(self.multiplier.max(1)).saturating_pow(exponent);
        let millis = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
        let capped_ms = millis(self.initial).saturating_mul(factor).min(millis(self.max));
        let half = capped_ms / 2;
        let jitter = if half == 0 { 0 } else { rand::rng().random_range(0..=half) };
        Duration::from_millis(capped_ms - half + jitter)
    }
}

/// The relay loop's backoff after failed passes when nothing else is set: 500 ms doubling up to 30 s.
pub(crate) const DEFAULT_ERROR_BACKOFF: Backoff =
    Backoff { initial: Duration::from_millis(500), max: Duration::from_secs(30), multiplier: 2 };

/// The longest backoff cap a relay accepts: a week. Longer waits are a dead letter in disguise.
pub const MAX_BACKOFF: Duration = Duration::from_secs(7 * 24 * 3600);
/// The longest lease a relay accepts: a day (a lease only has to outlast one publish).
pub const MAX_LEASE: Duration = Duration::from_secs(24 * 3600);
/// The longest `poll_interval` and `publish_timeout` a relay accepts: an hour.
pub const MAX_RELAY_INTERVAL: Duration = Duration::from_secs(3600);

/// Relay settings. Build with [`RelayConfig::default`] and the `with_*` methods; [`RelayConfig::validate`]
/// runs when a relay is created.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RelayConfig {
    /// Most rows claimed per pass (default 100).
    pub batch_size: u32,
    /// Failed attempts after which an event is dead (default 10).
    pub max_attempts: i32,
    /// Retry delays.
    pub backoff: Backoff,
    /// Transaction or lease claims.
    pub claim_mode: ClaimMode,
    /// What a dead event does to its aggregate.
    pub dead_letters: DeadLetterPolicy,
    /// Sleep between passes when nothing was due (default 500 ms).
    pub poll_interval: Duration,
    /// A publish that takes longer fails the whole batch (default 10 s). In lease mode it must be shorter
    /// than the lease.
    pub publish_timeout: Duration,
}

impl Default for RelayConfig {
    fn default() -> Self {
        RelayConfig {
            batch_size: 100,
            max_attempts: 10,
            backoff: Backoff::default(),
            claim_mode: ClaimMode::Auto,
            dead_letters: DeadLetterPolicy::BlockAggregate,
            poll_interval: Duration::from_millis(500),
            publish_timeout: Duration::from_secs(10),
        }
    }
}

impl RelayConfig {
    /// Sets [`RelayConfig::batch_size`].
    pub fn with_batch_size(mut self, batch_size: u32) -> Self {
        self.batch_size = batch_size;
        self
    }
    /// Sets [`RelayConfig::max_attempts`].
    pub fn with_max_attempts(mut self, max_attempts: i32) -> Self {
        self.max_attempts = max_attempts;
        self
    }
    /// Sets [`RelayConfig::backoff`].
    pub fn with_backoff(mut self, backoff: Backoff) -> Self {
        self.backoff = backoff;
        self
    }
    /// Sets [`RelayConfig::claim_mode`].
    pub fn with_claim_mode(mut self, claim_mode: ClaimMode) -> Self {
        self.claim_mode = claim_mode;
        self
    }
    /// Sets [`RelayConfig::dead_letters`].
    pub fn with_dead_letters(mut self, policy: DeadLetterPolicy) -> Self {
        self.dead_letters = policy;
        self
    }
    /// Sets [`RelayConfig::poll_interval`].
    pub fn with_poll_interval(mut self, interval: Duration) -> Self {
        self.poll_interval = interval;
        self
    }
    /// Sets [`RelayConfig::publish_timeout`].
    pub fn with_publish_timeout(mut self, timeout: Duration) -> Self {
        self.publish_timeout = timeout;
        self
    }

    /// The longest time after an event's first publish attempt at which this relay may send it again by
    /// itself: every retry delay at its cap (no jitter), plus a `publish_timeout` per attempt, plus one
    /// lease in lease mode (a relay that stalls past its lease is replaced by one that sends again).
    ///
    /// A consumer's inbox must remember an event at least this long, or a late retry of an event whose ack
    /// was lost is processed twice. Broker-side redelivery and operator replays (`replay_dead`) come on
    /// top: keep inbox rows for days, not minutes.
    pub fn redelivery_horizon(&self) -> Duration {
        let retries = self.max_attempts.saturating_sub(1).max(0) as u32;
        let mut total = Duration::ZERO;
        let mut delay = self.backoff.initial;
        for done in 0..retries {
            if delay >= self.backoff.max {
                // Every delay from here on is the cap.
                total = total.saturating_add(self.backoff.max.saturating_mul(retries - done));
                break;
            }
            total = total.saturating_add(delay);
            delay = delay.saturating_mul(self.backoff.multiplier.max(1));
        }
        let attempts = self.max_attempts.max(1) as u32;
        total = total.saturating_add(self.publish_timeout.saturating_mul(attempts));
        match self.claim_mode {
            ClaimMode::Lease { duration } => total = total.saturating_add(duration),
            // It may become a lease (SQLite).
            ClaimMode::Auto => total = total.saturating_add(ClaimMode::auto_lease(self.publish_timeout)),
            ClaimMode::Transaction => {}
        }
        total
    }

    /// Checks every setting, naming the first that is out of range.
    pub fn validate(&self) -> Result<()> {
        if self.batch_size == 0 || self.batch_size > 10_000 {
            return Err(Error::invalid_config("batch_size", format!("is {}; expected 1..=10000", self.batch_size)));
        }
        if self.max_attempts < 1 {
            return Err(Error::invalid_config(
                "max_attempts",
                format!("is {}; expected at least 1 (1 means no retry)", self.max_attempts),
            ));
        }
        if self.backoff.initial.is_zero() || self.backoff.initial > self.backoff.max {
            return Err(Error::invalid_config(
                "backoff",
                format!(
                    "initial delay {:?} must be positive and at most the cap {:?}",
                    self.backoff.initial, self.backoff.max
                ),
            ));
        }
        if self.backoff.max > MAX_BACKOFF {
            return Err(Error::invalid_config(
                "backoff",
                format!(
                    "cap {:?} is over the limit of {MAX_BACKOFF:?}; lower `max_attempts` instead",
                    self.backoff.max
                ),
            ));
        }
        if self.backoff.multiplier == 0 {
            return Err(Error::invalid_config("backoff.multiplier", "is 0; expected at least 1"));
        }
        if self.poll_interval.is_zero() {
            return Err(Error::invalid_config("poll_interval", "is zero; a relay would spin"));
        }
        if self.poll_interval > MAX_RELAY_INTERVAL {
            return Err(Error::invalid_config(
                "poll_interval",
                format!("is {:?}; expected at most {MAX_RELAY_INTERVAL:?}", self.poll_interval),
            ));
        }
        if self.publish_timeout.is_zero() {
            return Err(Error::invalid_config("publish_timeout", "is zero; every publish would time out"));
        }
        if self.publish_timeout > MAX_RELAY_INTERVAL {
            return Err(Error::invalid_config(
                "publish_timeout",
                format!("is {:?}; expected at most {MAX_RELAY_INTERVAL:?}", self.publish_timeout),
            ));
        }
        if let ClaimMode::Lease { duration } = self.claim_mode
            && duration > MAX_LEASE
        {
            return Err(Error::invalid_config(
                "claim_mode",
                format!(
                    "lease of {duration:?} is over the limit of {MAX_LEASE:?}; a lease only has to outlast one publish"
                ),
            ));
        }
        if let ClaimMode::Lease { duration } = self.claim_mode
            && duration <= self.publish_timeout
        {
            return Err(Error::invalid_config(
                "claim_mode",
                format!(
                    "lease of {duration:?} is not longer than publish_timeout {:?}; a publish could outlive its lease",
                    self.publish_timeout
                ),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_grows_exponentially_with_jitter_and_stays_under_the_cap() {
        let backoff = Backoff::default();
        for _ in 0..100 {
            let first = backoff.delay(1);
            assert!(first >= Duration::from_millis(500) && first <= Duration::from_secs(1), "{first:?}");
            let fourth = backoff.delay(4);
            assert!(fourth >= Duration::from_secs(4) && fourth <= Duration::from_secs(8), "{fourth:?}");
            assert!(backoff.delay(60) <= Duration::from_secs(300));
            assert!(backoff.delay(60) >= Duration::from_secs(150));
        }
    }

    #[test]
    fn the_redelivery_horizon_adds_every_capped_retry_delay_and_publish_timeout() {
        // 1+2+4+…+256 s for the nine retries of the defaults, plus ten publish timeouts of 10 s.
        let transaction = || RelayConfig::default().with_claim_mode(ClaimMode::Transaction);
        assert_eq!(transaction().redelivery_horizon(), Duration::from_secs(511 + 100));
        let capped = transaction().with_max_attempts(12); // …, 256, 300, 300
        assert_eq!(capped.redelivery_horizon(), Duration::from_secs(511 + 600 + 120));
        // The default may lease (on SQLite): its 30 s lease counts.
        assert_eq!(RelayConfig::default().redelivery_horizon(), Duration::from_secs(511 + 100 + 30));
        let huge = RelayConfig::default().with_max_attempts(i32::MAX);
        assert!(huge.redelivery_horizon() > Duration::from_secs(300 * 1_000_000), "and it returns at once");
        let lease = RelayConfig::default().with_claim_mode(ClaimMode::Lease { duration: Duration::from_secs(60) });
        assert_eq!(lease.redelivery_horizon(), Duration::from_secs(511 + 100 + 60));
    }

    #[test]
    fn zero_batch_size_and_zero_attempts_are_rejected_by_name() {
        let err = RelayConfig::default().with_batch_size(0).validate().unwrap_err();
        assert!(err.to_string().contains("`batch_size` is 0"), "{err}");
        let err = RelayConfig::default().with_max_attempts(0).validate().unwrap_err();
        assert!(err.to_string().contains("`max_attempts` is 0"), "{err}");
        let err = RelayConfig::default()
            .with_claim_mode(ClaimMode::Lease { duration: Duration::from_secs(1) })
            .validate()
            .unwrap_err();
        assert!(err.to_string().contains("claim_mode"), "{err}");
        RelayConfig::default().validate().unwrap();
    }

    #[test]
    fn auto_claims_lease_only_where_a_claim_would_block_writers() {
        let timeout = Duration::from_secs(10);
        assert_eq!(ClaimMode::Auto.resolve(false, timeout), ClaimMode::Transaction);
        assert_eq!(ClaimMode::Auto.resolve(true, timeout), ClaimMode::Lease { duration: Duration::from_secs(30) });
        let slow = ClaimMode::Auto.resolve(true, Duration::from_secs(60));
        assert_eq!(slow, ClaimMode::Lease { duration: Duration::from_secs(180) });
        assert_eq!(ClaimMode::Transaction.resolve(true, timeout), ClaimMode::Transaction, "an explicit choice stays");
        let config = RelayConfig::default().with_claim_mode(slow).with_publish_timeout(Duration::from_secs(60));
        config.validate().unwrap();
    }

    #[test]
    fn durations_beyond_what_the_relay_can_represent_are_rejected_by_name() {
        let field = |config: RelayConfig| match config.validate() {
            Err(Error::InvalidConfig { field, .. }) => field,
            other => panic!("{config:?}: expected InvalidConfig, got {other:?}"),
        };
        let lease = |duration| RelayConfig::default().with_claim_mode(ClaimMode::Lease { duration });
        assert_eq!(field(lease(Duration::MAX)), "claim_mode");
        assert_eq!(field(lease(MAX_LEASE + Duration::from_millis(1))), "claim_mode");
        lease(MAX_LEASE).validate().unwrap();
        let uncapped = Backoff { max: Duration::MAX, ..Backoff::default() };
        assert_eq!(field(RelayConfig::default().with_backoff(uncapped)), "backoff");
        assert_eq!(field(RelayConfig::default().with_poll_interval(Duration::MAX)), "poll_interval");
        assert_eq!(field(RelayConfig::default().with_publish_timeout(Duration::MAX)), "publish_timeout");
        // The longest accepted settings still give delays the clock can add, at any attempt count.
        let longest = Backoff { initial: MAX_BACKOFF, max: MAX_BACKOFF, multiplier: u32::MAX };
        RelayConfig::default().with_backoff(longest).validate().unwrap();
        assert!(longest.delay(i32::MAX) <= MAX_BACKOFF);
    }
}
