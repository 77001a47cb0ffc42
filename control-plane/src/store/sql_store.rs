//! The store over SQL: one database, for both backends. The core `Store` is implemented in
//! `sql.rs`, each other area's statements in its own file (`apps.rs`, `pools.rs`, …); all
//! of them reach the database through this struct.

use super::database::Database;

/// Looks a row up by id first, then by name, in one statement: a name that equals another
/// row's id never shadows that row.
pub(super) const ID_FIRST: &str =
    "(id = $2 OR name = $2) ORDER BY CASE WHEN id = $2 THEN 0 ELSE 1 END LIMIT 1";

pub struct SqlStore {
    database: Database,
}

impl SqlStore {
    pub fn new(database: Database) -> Self {
        Self { database }
    }

    pub(super) fn database(&self) -> &Database {
        &self.database
    }
}
