//! Tests of the store's shared types.

use super::error::postgres_class;
use super::*;

#[test]
fn only_what_may_pass_is_transient() {
    let sqlite = |code| {
        Error::Sqlite {
            code,
            message: String::new(),
        }
        .class()
    };
    assert_eq!(sqlite(5), Class::Transient, "SQLITE_BUSY");
    assert_eq!(
        sqlite(5 | (1 << 8)),
        Class::Transient,
        "SQLITE_BUSY_RECOVERY"
    );
    assert_eq!(sqlite(13), Class::Transient, "SQLITE_FULL");
    assert_eq!(
        sqlite(10 | (3 << 8)),
        Class::Transient,
        "SQLITE_IOERR_WRITE"
    );
    assert_eq!(sqlite(20), Class::InvalidInput, "SQLITE_MISMATCH");
    assert_eq!(sqlite(18), Class::InvalidInput, "SQLITE_TOOBIG");
    assert_eq!(sqlite(19), Class::Conflict, "SQLITE_CONSTRAINT");
    assert_eq!(sqlite(11), Class::Internal, "SQLITE_CORRUPT");
    assert_eq!(
        postgres_class("08006"),
        Class::Transient,
        "connection failure"
    );
    assert_eq!(postgres_class("40001"), Class::Transient, "serialization");
    assert_eq!(
        postgres_class("57014"),
        Class::Transient,
        "statement timeout"
    );
    assert_eq!(postgres_class("55P03"), Class::Transient, "lock timeout");
    assert_eq!(postgres_class("22003"), Class::InvalidInput, "out of range");
    assert_eq!(postgres_class("22021"), Class::InvalidInput, "NUL in text");
    assert_eq!(postgres_class("23505"), Class::Conflict, "unique violation");
    assert_eq!(postgres_class("42P01"), Class::Internal, "undefined table");
    assert_eq!(
        Error::Database(sqlx::Error::PoolTimedOut).class(),
        Class::Transient
    );
    assert_eq!(Error::Corrupt(String::new()).class(), Class::Internal);
}
