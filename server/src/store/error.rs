//! Storage failures, and which of them may pass: only a transient one is
//! offered to callers as retryable.

/// A storage failure. [`Error::class`] says whether it may pass ([`Class::Transient`])
/// or would fail the same way again; the API maps each class to its own status.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The database refused or failed a statement; the transaction was rolled back.
    #[error("database error: {0}")]
    Database(#[from] sqlx::Error),
    /// The embedded schema migrations could not be applied; the server cannot start.
    #[error("schema migration failed: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    /// A stored row holds a value this version cannot read.
    #[error("stored row is unreadable: {0}")]
    Corrupt(String),
    /// Another process holds the database; only one `spool serve` may use a SQLite file.
    #[error("database {0} is in use by another spool process")]
    Locked(String),
    /// The database URL names nothing this build can open.
    #[error("unsupported database URL {0:?}: expected sqlite://PATH or postgres://…")]
    UnsupportedUrl(String),
    /// SQLite failed a statement on the writing connection (`code` is its extended
    /// result code); the transaction was rolled back.
    #[error("database error: sqlite error {code}: {message}")]
    Sqlite { code: i32, message: String },
    /// Opening or locking the database file failed.
    #[error("cannot open database {path}: {source}")]
    Open {
        path: String,
        source: std::io::Error,
    },
}

/// What kind of failure a storage error is, for the caller deciding whether to retry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Class {
    /// It may pass: busy, locked, out of space, a connection lost, a timeout.
    /// Retrying the same request later can succeed.
    Transient,
    /// The data did not fit the database (a value out of range): the same request
    /// fails the same way.
    InvalidInput,
    /// A constraint refused the write.
    Conflict,
    /// A fault of this server or its database: report it.
    Internal,
}

impl Error {
    pub fn class(&self) -> Class {
        match self {
            Error::Database(e) => sqlx_class(e),
            Error::Sqlite { code, .. } => sqlite_class(*code),
            Error::Migrate(_)
            | Error::Corrupt(_)
            | Error::Locked(_)
            | Error::UnsupportedUrl(_)
            | Error::Open { .. } => Class::Internal,
        }
    }
}

fn sqlx_class(e: &sqlx::Error) -> Class {
    match e {
        sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed => Class::Transient,
        sqlx::Error::Database(db) => {
            if let Some(pg) = db.try_downcast_ref::<sqlx::postgres::PgDatabaseError>() {
                postgres_class(pg.code())
            } else {
                db.code()
                    .and_then(|c| c.parse::<i32>().ok())
                    .map_or(Class::Internal, sqlite_class)
            }
        }
        _ => Class::Internal,
    }
}

/// By SQLSTATE class.
pub(super) fn postgres_class(sqlstate: &str) -> Class {
    match sqlstate.get(..2).unwrap_or_default() {
        // Connection exception, transaction rollback (serialization, deadlock),
        // insufficient resources, operator intervention (a statement timeout, an
        // administrator's shutdown), system error.
        "08" | "40" | "53" | "57" | "58" => Class::Transient,
        // Object not in prerequisite state: 55P03 is a lock timeout.
        "55" if sqlstate == "55P03" => Class::Transient,
        "22" => Class::InvalidInput,
        "23" => Class::Conflict,
        _ => Class::Internal,
    }
}

/// By primary result code (the low byte of an extended one).
fn sqlite_class(code: i32) -> Class {
    use libsqlite3_sys as ffi;
    match code & 0xff {
        ffi::SQLITE_BUSY
        | ffi::SQLITE_LOCKED
        | ffi::SQLITE_NOMEM
        | ffi::SQLITE_IOERR
        | ffi::SQLITE_FULL
        | ffi::SQLITE_CANTOPEN
        | ffi::SQLITE_PROTOCOL => Class::Transient,
        ffi::SQLITE_TOOBIG | ffi::SQLITE_MISMATCH | ffi::SQLITE_RANGE => Class::InvalidInput,
        ffi::SQLITE_CONSTRAINT => Class::Conflict,
        _ => Class::Internal,
    }
}
