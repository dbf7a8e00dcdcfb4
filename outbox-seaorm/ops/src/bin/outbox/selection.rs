//! Which dead things a command acts on: one set of flags for `outbox dead` (dead outbox rows) and
//! `outbox dead-letters` (a consumer's dead letters), read into the one [`DeadFilter`].

use std::time::Duration;

use clap::Args;
use outbox_seaorm::DeadFilter;

use crate::{CliError, duration};

/// Which dead events or letters; criteria combine with AND.
#[derive(Args)]
pub struct SelectionArgs {
    /// Only letters these consumers dead-lettered (the outbox_dead_consumer header; repeat, or
    /// comma-separate). Dead letters only: a dead outbox row has no consumer.
    #[arg(long = "consumer", env = "OUTBOX_CONSUMER", value_delimiter = ',', value_name = "CONSUMER")]
    consumers: Vec<String>,
    /// Only these event types (repeat, or comma-separate).
    #[arg(long = "event-type", env = "OUTBOX_EVENT_TYPE", value_delimiter = ',', value_name = "TYPE")]
    event_types: Vec<String>,
    /// Only this aggregate type.
    #[arg(long, env = "OUTBOX_AGGREGATE_TYPE")]
    aggregate_type: Option<String>,
    /// Only this aggregate id.
    #[arg(long, env = "OUTBOX_AGGREGATE_ID")]
    aggregate_id: Option<String>,
    /// Only those whose last error (a letter's reason) contains this text (ignoring case).
    #[arg(long, env = "OUTBOX_ERROR_CONTAINS")]
    error_contains: Option<String>,
    /// Only those that died longer ago than this.
    #[arg(long, env = "OUTBOX_OLDER_THAN", value_parser = duration::parse, value_name = "DURATION")]
    older_than: Option<Duration>,
    /// Only those that died less long ago than this.
    #[arg(long, env = "OUTBOX_NEWER_THAN", value_parser = duration::parse, value_name = "DURATION")]
    newer_than: Option<Duration>,
    /// Only these, by id as listed: event ids for dead events, dead-letter ids for letters (repeat, or
    /// comma-separate).
    #[arg(long = "id", env = "OUTBOX_ID", value_delimiter = ',', value_name = "ID")]
    ids: Vec<String>,
    /// Every one: `replay` and `discard` need a filter or this.
    #[arg(long, env = "OUTBOX_DEAD_ALL")]
    all: bool,
}

impl SelectionArgs {
    /// The filter these flags ask for, each id checked by `check_id` (its shape differs per kind).
    pub fn filter(&self, check_id: impl Fn(&str) -> Result<String, CliError>) -> Result<DeadFilter, CliError> {
        let mut filter = if self.all { DeadFilter::all() } else { DeadFilter::default() };
        for consumer in &self.consumers {
            filter = filter.consumer(consumer);
        }
        for event_type in &self.event_types {
            filter = filter.event_type(event_type);
        }
        if let Some(aggregate_type) = &self.aggregate_type {
            filter = filter.aggregate_type(aggregate_type);
        }
        if let Some(aggregate_id) = &self.aggregate_id {
            filter = filter.aggregate_id(aggregate_id);
        }
        if let Some(text) = &self.error_contains {
            filter = filter.error_contains(text);
        }
        if let Some(age) = self.older_than {
            filter = filter.older_than(age);
        }
        if let Some(age) = self.newer_than {
            filter = filter.newer_than(age);
        }
        for id in &self.ids {
            filter = filter.id(check_id(id)?);
        }
        Ok(filter)
    }

    /// The filter of a command that changes what it selects (`command`, e.g. `dead replay`): at least one
    /// criterion, or `--all`.
    pub fn selective(
        &self,
        command: &str,
        check_id: impl Fn(&str) -> Result<String, CliError>,
    ) -> Result<DeadFilter, CliError> {
        let filter = self.filter(check_id)?;
        if filter.is_empty() && !self.all {
            return Err(CliError::Refused(format!(
                "`{command}` needs a filter (--consumer, --event-type, --aggregate-type, --aggregate-id, \
                 --error-contains, --older-than, --newer-than, --id) or --all"
            )));
        }
        Ok(filter)
    }
}
