//! The selection of dead events or consumer dead letters, as a page's query string or an action's form:
//! parsed, checked, and written back into links.

use outbox_seaorm::EventId;
use outbox_seaorm::consume::DeadFilter;

/// Longest value accepted in a field (a filter text, an id).
const MAX_FIELD: usize = 500;
/// Most event ids in one selection.
pub(super) const MAX_IDS: usize = 500;

/// The `name=value` pairs of a query string or an `application/x-www-form-urlencoded` body.
pub(super) fn pairs(raw: &[u8]) -> Vec<(String, String)> {
    form_urlencoded::parse(raw).map(|(k, v)| (k.into_owned(), v.into_owned())).collect()
}

/// The first value of `name`, trimmed; `None` when absent or empty.
pub(super) fn field<'a>(pairs: &'a [(String, String)], name: &str) -> Option<&'a str> {
    pairs.iter().find(|(k, _)| k == name).map(|(_, v)| v.trim()).filter(|v| !v.is_empty())
}

/// The filter a person typed, over dead rows or (with `consumer`) consumer dead letters.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(super) struct DeadQuery {
    /// Consumer dead letters only: the consumer that dead-lettered them.
    pub consumer: Option<String>,
    pub aggregate_type: Option<String>,
    pub aggregate_id: Option<String>,
    pub event_type: Option<String>,
    pub error: Option<String>,
    /// As typed, e.g. `15m`.
    pub older_than: Option<String>,
}

/// The filter's fields, in the order the form shows them.
pub(super) const FILTER_FIELDS: [(&str, &str); 5] = [
    ("aggregate_type", "aggregate type"),
    ("aggregate_id", "aggregate id"),
    ("event_type", "event type"),
    ("error", "error contains"),
    ("older_than", "died more than … ago (30s, 15m, 2h, 7d)"),
];

/// The consumer dead letters' filter fields: the consumer, then the dead rows' ones.
pub(super) const LETTER_FIELDS: [(&str, &str); 6] = [
    ("consumer", "consumer"),
    FILTER_FIELDS[0],
    FILTER_FIELDS[1],
    FILTER_FIELDS[2],
    FILTER_FIELDS[3],
    FILTER_FIELDS[4],
];

impl DeadQuery {
    pub fn from_pairs(pairs: &[(String, String)]) -> Self {
        let get = |name| field(pairs, name).map(str::to_owned);
        DeadQuery {
            consumer: get("consumer"),
            aggregate_type: get("aggregate_type"),
            aggregate_id: get("aggregate_id"),
            event_type: get("event_type"),
            error: get("error"),
            older_than: get("older_than"),
        }
    }

    pub fn value(&self, name: &str) -> Option<&str> {
        match name {
            "consumer" => self.consumer.as_deref(),
            "aggregate_type" => self.aggregate_type.as_deref(),
            "aggregate_id" => self.aggregate_id.as_deref(),
            "event_type" => self.event_type.as_deref(),
            "error" => self.error.as_deref(),
            "older_than" => self.older_than.as_deref(),
            _ => None,
        }
    }

    pub fn is_empty(&self) -> bool {
        LETTER_FIELDS.iter().all(|(name, _)| self.value(name).is_none())
    }

    fn check_lengths(&self) -> Result<(), String> {
        for (name, label) in LETTER_FIELDS {
            if self.value(name).is_some_and(|v| v.len() > MAX_FIELD) {
                return Err(format!("{label}: longer than {MAX_FIELD} bytes"));
            }
        }
        Ok(())
    }

    /// The filter typed, for dead rows or consumer dead letters alike ([`DeadFilter::default`] when no field
    /// is set), or what is wrong with a field. The dead rows' form has no consumer field; a consumer in
    /// their query is refused where the rows are read.
    pub fn filter(&self) -> Result<DeadFilter, String> {
        self.check_lengths()?;
        let mut filter = DeadFilter::default();
        if let Some(v) = &self.consumer {
            filter = filter.consumer(v.as_str());
        }
        if let Some(v) = &self.aggregate_type {
            filter = filter.aggregate_type(v.as_str());
        }
        if let Some(v) = &self.aggregate_id {
            filter = filter.aggregate_id(v.as_str());
        }
        if let Some(v) = &self.event_type {
            filter = filter.event_type(v.as_str());
        }
        if let Some(v) = &self.error {
            filter = filter.error_contains(v.as_str());
        }
        if let Some(v) = &self.older_than {
            filter = filter.older_than(outbox_seaorm::text::parse_duration(v)?);
        }
        Ok(filter)
    }

    /// `name=value&…` of the non-empty fields, plus `extra`.
    pub fn query_string(&self, extra: &[(&str, &str)]) -> String {
        let mut out = form_urlencoded::Serializer::new(String::new());
        for (name, _) in LETTER_FIELDS {
            if let Some(v) = self.value(name) {
                out.append_pair(name, v);
            }
        }
        for (name, value) in extra {
            out.append_pair(name, value);
        }
        out.finish()
    }
}

/// The event ids of a selection (`id` fields), each checked.
pub(super) fn ids(pairs: &[(String, String)]) -> Result<Vec<EventId>, String> {
    let ids: Vec<&str> = pairs.iter().filter(|(k, _)| k == "id").map(|(_, v)| v.trim()).collect();
    if ids.len() > MAX_IDS {
        return Err(format!("{} events selected; at most {MAX_IDS} at once (use the filter instead)", ids.len()));
    }
    ids.into_iter()
        .map(|id| {
            id.parse::<EventId>().map_err(|_| format!("`{}` is not an event id", outbox_seaorm::text::truncate(id, 60)))
        })
        .collect()
}

/// The dead-letter ids of a selection (`id` fields): broker-specific, so only their number and length are
/// checked; a letter matches only when its id is equal.
pub(super) fn letter_ids(pairs: &[(String, String)]) -> Result<Vec<String>, String> {
    let ids: Vec<&str> = pairs.iter().filter(|(k, _)| k == "id").map(|(_, v)| v.trim()).collect();
    if ids.len() > MAX_IDS {
        return Err(format!("{} letters selected; at most {MAX_IDS} at once (use the filter instead)", ids.len()));
    }
    ids.into_iter()
        .map(|id| match id.len() {
            1..=200 => Ok(id.to_owned()),
            _ => Err(format!("`{}` is not a dead-letter id", outbox_seaorm::text::truncate(id, 60))),
        })
        .collect()
}

/// The source index of a consumer dead-letter page or action (`s`), checked against how many there are.
pub(super) fn source(pairs: &[(String, String)], sources: usize) -> Result<usize, String> {
    let raw = field(pairs, "s").unwrap_or("0");
    raw.parse::<usize>().ok().filter(|s| *s < sources).ok_or_else(|| {
        format!("no dead-letter source `{}` (there are {sources})", outbox_seaorm::text::truncate(raw, 20))
    })
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn a_typed_filter_round_trips_through_its_query_string() {
        let query = DeadQuery::from_pairs(&pairs(b"event_type=order.placed&error=time%20out&older_than=15m&x=1"));
        assert_eq!(query.error.as_deref(), Some("time out"));
        assert!(query.filter().is_ok());
        let again = DeadQuery::from_pairs(&pairs(query.query_string(&[("after", "7")]).as_bytes()));
        assert_eq!(again, query);
        let letters = DeadQuery::from_pairs(&pairs(b"consumer=billing&aggregate_id=o-1"));
        assert_eq!(letters.filter(), Ok(DeadFilter::default().consumer("billing").aggregate_id("o-1")));
        assert_eq!(DeadQuery::from_pairs(&pairs(letters.query_string(&[]).as_bytes())), letters);
        assert_eq!(source(&pairs(b"s=1"), 2), Ok(1));
        assert!(source(&pairs(b"s=2"), 2).unwrap_err().contains("no dead-letter source"));
        assert_eq!(letter_ids(&pairs(b"id=1-0&id=2-0")), Ok(vec!["1-0".to_owned(), "2-0".to_owned()]));
        assert!(letter_ids(&pairs(b"id=")).is_err());
    }

    #[test]
    fn bad_fields_are_refused_with_what_to_type() {
        let query = DeadQuery { older_than: Some("soon".into()), ..DeadQuery::default() };
        assert!(query.filter().unwrap_err().contains("expected e.g. 30s"));
        let long = DeadQuery { error: Some("x".repeat(MAX_FIELD + 1)), ..DeadQuery::default() };
        assert!(long.filter().unwrap_err().contains("longer than"));
        assert!(ids(&pairs(b"id=<script>")).unwrap_err().contains("is not an event id"));
        let two_hours = DeadQuery { older_than: Some("2h".into()), ..DeadQuery::default() };
        assert_eq!(two_hours.filter(), Ok(DeadFilter::default().older_than(Duration::from_secs(7200))));
    }
}
