//! Hand-written statements with bound values, for the few places where the SQL differs too much per
//! backend for sea-query (upserts that return, `UPDATE … FROM`, row locks with `SKIP LOCKED` in a
//! sub-select).

use sea_orm::{DbBackend, Statement, Value};

/// SQL text with its bound values; placeholders follow the backend (`$1` on PostgreSQL, `?` elsewhere).
pub(crate) struct Sql {
    backend: DbBackend,
    text: String,
    values: Vec<Value>,
}

impl Sql {
    pub(crate) fn new(backend: DbBackend) -> Self {
        Sql { backend, text: String::new(), values: Vec::new() }
    }

    /// Appends SQL text.
    pub(crate) fn push(&mut self, text: &str) -> &mut Self {
        self.text.push_str(text);
        self
    }

    /// Appends a placeholder bound to `value`.
    pub(crate) fn bind(&mut self, value: impl Into<Value>) -> &mut Self {
        self.values.push(value.into());
        match self.backend {
            DbBackend::Postgres => {
                self.text.push('$');
                self.text.push_str(&self.values.len().to_string());
            }
            _ => self.text.push('?'),
        }
        self
    }

    /// Appends `items` separated by `separator`, each written by `write`.
    pub(crate) fn join<T>(
        &mut self,
        items: impl IntoIterator<Item = T>,
        separator: &str,
        mut write: impl FnMut(&mut Self, T),
    ) -> &mut Self {
        for (i, item) in items.into_iter().enumerate() {
            if i > 0 {
                self.push(separator);
            }
            write(self, item);
        }
        self
    }

    pub(crate) fn build(self) -> Statement {
        Statement::from_sql_and_values(self.backend, self.text, self.values)
    }
}

/// `(aggregate_type = ? AND aggregate_id = ?)` for each key, joined by `OR`, with an optional column
/// prefix such as `a.`.
pub(crate) fn any_aggregate<'k>(sql: &mut Sql, prefix: &str, keys: impl IntoIterator<Item = (&'k str, &'k str)>) {
    sql.push("(");
    sql.join(keys, " OR ", |sql, (aggregate_type, aggregate_id)| {
        sql.push("(")
            .push(prefix)
            .push("aggregate_type = ")
            .bind(aggregate_type)
            .push(" AND ")
            .push(prefix)
            .push("aggregate_id = ")
            .bind(aggregate_id)
            .push(")");
    });
    sql.push(")");
}
