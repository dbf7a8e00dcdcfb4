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

/// `(columns) IN (…)` for a list of tuples, each written by `write` as comma-separated binds. SQLite takes
/// a row-value `IN` only over a subquery, so it gets `IN (VALUES …)`; PostgreSQL and MySQL get a plain list,
/// which they plan as index lookups.
pub(crate) fn in_tuples<T>(
    sql: &mut Sql,
    columns: &str,
    items: impl IntoIterator<Item = T>,
    mut write: impl FnMut(&mut Sql, T),
) {
    sql.push("(").push(columns).push(") IN (");
    if sql.backend == DbBackend::Sqlite {
        sql.push("VALUES ");
    }
    sql.join(items, ", ", |sql, item| {
        sql.push("(");
        write(sql, item);
        sql.push(")");
    });
    sql.push(")");
}

/// `(aggregate_type, aggregate_id) IN (…)` for `keys`.
pub(crate) fn any_aggregate<'k>(sql: &mut Sql, keys: impl IntoIterator<Item = (&'k str, &'k str)>) {
    in_tuples(sql, "aggregate_type, aggregate_id", keys, |sql, (aggregate_type, aggregate_id)| {
        sql.bind(aggregate_type).push(", ").bind(aggregate_id);
    });
}

/// `SELECT {select} FROM {table} WHERE {key columns} match one of the keys AND {filter} {suffix}`, with
/// one index lookup per key on every backend.
///
/// PostgreSQL factors a long `OR` (which a row-value `IN` list becomes) into a common index condition plus
/// a filter, which walks every row sharing, say, the aggregate type; there the keys become a `VALUES` list
/// joined `LATERAL`ly, so each is a parameterised index scan (and `FOR UPDATE` in `suffix` locks per key).
pub(crate) struct KeyedSelect<'a> {
    pub(crate) select: &'a str,
    pub(crate) table: &'a str,
    pub(crate) key_columns: &'a [&'a str],
    pub(crate) suffix: &'a str,
}

impl KeyedSelect<'_> {
    /// Writes the statement into `sql`: `write` binds one key's values, `filter` adds the other conditions.
    pub(crate) fn write<T>(
        &self,
        sql: &mut Sql,
        keys: impl IntoIterator<Item = T>,
        mut write: impl FnMut(&mut Sql, T),
        filter: impl FnOnce(&mut Sql),
    ) {
        if sql.backend == DbBackend::Postgres {
            let names: Vec<String> = (0..self.key_columns.len()).map(|i| format!("k{i}")).collect();
            sql.push("SELECT x.* FROM (VALUES ");
            sql.join(keys, ", ", |sql, key| {
                sql.push("(");
                write(sql, key);
                sql.push(")");
            });
            sql.push(") AS k (").push(&names.join(", ")).push(") CROSS JOIN LATERAL (SELECT ").push(self.select);
            sql.push(" FROM ").push(self.table).push(" WHERE ");
            for (column, name) in self.key_columns.iter().zip(&names) {
                sql.push(column).push(" = k.").push(name).push(" AND ");
            }
            filter(sql);
            sql.push(self.suffix).push(") x");
        } else {
            sql.push("SELECT ").push(self.select).push(" FROM ").push(self.table).push(" WHERE ");
            in_tuples(sql, &self.key_columns.join(", "), keys, write);
            sql.push(" AND ");
            filter(sql);
            sql.push(self.suffix);
        }
    }
}
