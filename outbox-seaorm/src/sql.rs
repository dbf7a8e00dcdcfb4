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

    /// The backend whose placeholders this statement uses.
    pub(crate) fn backend(&self) -> DbBackend {
        self.backend
    }

    /// The SQL text so far.
    pub(crate) fn text(&self) -> &str {
        &self.text
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

impl From<Sql> for Statement {
    fn from(sql: Sql) -> Statement {
        sql.build()
    }
}

/// `(columns) IN ((…), (…))` for a list of tuples, each written by `write` as comma-separated binds: MySQL
/// plans it as one index range per tuple.
pub(crate) fn in_tuples<T>(
    sql: &mut Sql,
    columns: &str,
    items: impl IntoIterator<Item = T>,
    mut write: impl FnMut(&mut Sql, T),
) {
    sql.push("(").push(columns).push(") IN (");
    sql.join(items, ", ", |sql, item| {
        sql.push("(");
        write(sql, item);
        sql.push(")");
    });
    sql.push(")");
}

/// `SELECT {select} FROM {table} WHERE {key columns} match one of the keys AND {filter} {suffix}`, with
/// one index lookup per key on every backend.
///
/// PostgreSQL factors a long `OR` (which a row-value `IN` list becomes) into a common index condition plus
/// a filter, which walks every row sharing, say, the aggregate type; there the keys become a `VALUES` list
/// joined `LATERAL`ly, so each is a parameterised index scan (and `FOR UPDATE` in `suffix` locks per key).
/// SQLite joins a `VALUES` list the same way; MySQL takes a row-value `IN` list as index ranges.
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
        } else if sql.backend == DbBackend::Sqlite {
            // A row-value `IN (VALUES …)` is planned as a scan of the table; a `CROSS JOIN` keeps the keys as
            // the outer loop (SQLite never reorders it), so each is an index lookup.
            sql.push("SELECT ").push(self.select).push(" FROM (VALUES ");
            sql.join(keys, ", ", |sql, key| {
                sql.push("(");
                write(sql, key);
                sql.push(")");
            });
            sql.push(") AS k CROSS JOIN ").push(self.table).push(" ON ");
            for (i, column) in self.key_columns.iter().enumerate() {
                if i > 0 {
                    sql.push(" AND ");
                }
                sql.push(column).push(" = k.column").push(&(i + 1).to_string());
            }
            sql.push(" WHERE ");
            filter(sql);
            sql.push(self.suffix);
        } else {
            sql.push("SELECT ").push(self.select).push(" FROM ").push(self.table).push(" WHERE ");
            in_tuples(sql, &self.key_columns.join(", "), keys, write);
            sql.push(" AND ");
            filter(sql);
            sql.push(self.suffix);
        }
    }
}
