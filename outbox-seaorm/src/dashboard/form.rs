//! The dead-event selection as a page's query string or an action's form: parsed, checked, and written
//! back into links.

use outbox_runtime::EventId;

use crate::admin::DeadFilter;

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

/// The dead-row filter a person typed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(super) struct DeadQuery {
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

impl DeadQuery {
    pub fn from_pairs(pairs: &[(String, String)]) -> Self {
        let get = |name| field(pairs, name).map(str::to_owned);
        DeadQuery {
            aggregate_type: get("aggregate_type"),
            aggregate_id: get("aggregate_id"),
            event_type: get("event_type"),
            error: get("error"),
            older_than: get("older_than"),
        }
    }

    pub fn value(&self, name: &str) -> Option<&str> {
        match name {
            "aggregate_type" => self.aggregate_type.as_deref(),
            "aggregate_id" => self.aggregate_id.as_deref(),
            "event_type" => self.event_type.as_deref(),
            "error" => self.error.as_deref(),
            "older_than" => self.older_than.as_deref(),
            _ => None,
        }
    }

    pub fn is_empty(&self) -> bool {
        FILTER_FIELDS.iter().all(|(name, _)| self.value(name).is_none())
    }

    /// The filter, or what is wrong with a field.
    pub fn filter(&self) -> Result<DeadFilter, String> {
        for (name, label) in FILTER_FIELDS {
            if self.value(name).is_some_and(|v| v.len() > MAX_FIELD) {
                return Err(format!("{label}: longer than {MAX_FIELD} bytes"));
            }
        }
        let mut filter = DeadFilter::default();
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
            filter = filter.older_than(crate::__support::parse_duration(v)?);
        }
        Ok(filter)
    }

    /// `name=value&…` of the non-empty fields, plus `extra`.
    pub fn query_string(&self, extra: &[(&str, &str)]) -> String {
        let mut out = form_urlencoded::Serializer::new(String::new());
        for (name, _) in FILTER_FIELDS {
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
            id.parse::<EventId>().map_err(|_| format!("`{}` is not an event id", crate::__support::truncate(id, 60)))
        })
        .collect()
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
