//! A small safe layer over the SQLite C API (through `libsqlite3-sys`, the same
//! library sqlx links), for the one connection the writer thread owns.
//!
//! Why not sqlx here: sqlx runs every statement on a connection thread of its own,
//! and each statement and each returned row is a cross-thread hand-off. The writer
//! runs a whole batch on its own thread instead, so a batch costs one hand-off.
//!
//! Safety rests on four rules this module enforces (and `open` refuses a library
//! built without thread safety): a [`Connection`] is owned by one
//! thread at a time (it is `Send`, not `Sync`, and every method takes `&mut self`),
//! and a statement is only used through a [`Query`] that mutably borrows the
//! connection, so no two statements step at once and none outlives the connection
//! (statements are finalized before the connection is closed, in `Drop`); a
//! value is bound only through a [`Slot`], which only [`Query::bind`] can make;
//! and an update hook is set only by a guard that borrows what the hook writes to
//! and removes it when dropped.

use std::{
    ffi::{CStr, CString, c_int},
    ptr::{self, NonNull},
};

use libsqlite3_sys as ffi;

/// A SQLite failure: the result code and SQLite's message.
#[derive(Debug, thiserror::Error)]
#[error("sqlite error {code}: {message}")]
pub struct SqliteError {
    pub code: c_int,
    pub message: String,
}

impl SqliteError {
    /// A failure this layer finds before SQLite is asked (`code` says which kind).
    fn new(code: c_int, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
        }
    }
}

pub type Result<T> = std::result::Result<T, SqliteError>;

/// A column that could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ColumnError {
    /// A text column whose bytes are not UTF-8 (a damaged row).
    #[error("column {column} is not valid UTF-8")]
    NotUtf8 { column: c_int },
    /// SQLite could not hand the value over (out of memory): the read failed,
    /// it is not an empty value.
    #[error(transparent)]
    Sqlite(SqliteError),
}

pub struct Connection {
    db: NonNull<ffi::sqlite3>,
    /// Prepared statements, kept for the connection's life, by where their SQL
    /// text is: every text is `'static`, so its address and length name it, and a
    /// lookup hashes two words instead of the statement (hashing the texts, up
    /// to 2 KB each, was 3.6 % of the writer thread's instructions).
    statements: foldhash::HashMap<(usize, usize), NonNull<ffi::sqlite3_stmt>>,
}

// Safety: SQLite connections opened with SQLITE_OPEN_NOMUTEX may move between
// threads as long as one thread uses them at a time, which `&mut self` ensures.
unsafe impl Send for Connection {}

impl Connection {
    /// Opens the database file (which must exist) for reading and writing.
    pub fn open(path: &std::path::Path) -> Result<Self> {
        // Safety: a pure query of how the library was compiled.
        if unsafe { ffi::sqlite3_threadsafe() } == 0 {
            // NOMUTEX connections moved between threads need a thread-safe build.
            return Err(SqliteError::new(
                ffi::SQLITE_MISUSE,
                "this SQLite library was built without thread safety",
            ));
        }
        let path = CString::new(path.to_string_lossy().as_bytes()).map_err(|_| {
            SqliteError::new(ffi::SQLITE_MISUSE, "database path contains a NUL byte")
        })?;
        let mut db = ptr::null_mut();
        let flags = ffi::SQLITE_OPEN_READWRITE | ffi::SQLITE_OPEN_NOMUTEX;
        // Safety: valid C string, out-pointer to a local.
        let rc = unsafe { ffi::sqlite3_open_v2(path.as_ptr(), &mut db, flags, ptr::null()) };
        let Some(db) = NonNull::new(db) else {
            return Err(SqliteError::new(rc, "cannot allocate a connection"));
        };
        let mut conn = Self {
            db,
            statements: Default::default(),
        };
        if rc != ffi::SQLITE_OK {
            return Err(conn.error(rc));
        }
        // Safety: the handle is open.
        unsafe {
            ffi::sqlite3_extended_result_codes(conn.db.as_ptr(), 1);
            ffi::sqlite3_busy_timeout(conn.db.as_ptr(), 10_000);
        }
        // A checkpoint copies each page once however often the WAL rewrote it, and
        // a transaction serving many concurrency keys dirties pages all over their
        // index: checkpointing every 4,000 frames (~16 MB of WAL) rather than
        // SQLite's 1,000 writes each hot page once per four times as much work.
        // A WAL grown past 64 MiB by one large transaction is cut back after the
        // next checkpoint. A statement's journal (the pages it changed, so it can
        // fail alone inside the batch) stays in memory: spilled to a temporary
        // file past SQLITE_STMTJRNL_SPILL, the journal of a batch rewriting
        // several rows of megabytes failed with SQLITE_FULL, and a row's pages are
        // in memory already while the writer reads or claims it.
        conn.batch(
            "PRAGMA journal_mode = WAL; PRAGMA synchronous = FULL; \
             PRAGMA wal_autocheckpoint = 4000; PRAGMA journal_size_limit = 67108864; \
             PRAGMA temp_store = MEMORY;",
        )?;
        conn.disable_reprepare();
        Ok(conn)
    }

    /// The bundled SQLite is built with STAT4, which marks statements whose plan
    /// could depend on a bound value for re-preparation whenever that value is
    /// rebound: a needless recompile per claim. The query planner stability
    /// guarantee turns that off; our plans do not depend on bound values.
    fn disable_reprepare(&mut self) {
        let mut current: c_int = 0;
        // Safety: the documented variadic form (int, int*).
        unsafe {
            ffi::sqlite3_db_config(
                self.db.as_ptr(),
                ffi::SQLITE_DBCONFIG_ENABLE_QPSG,
                1 as c_int,
                &mut current as *mut c_int,
            );
        }
    }

    /// Runs SQL text without parameters or results (several statements allowed).
    pub fn batch(&mut self, sql: &str) -> Result<()> {
        let sql = CString::new(sql)
            .map_err(|_| SqliteError::new(ffi::SQLITE_MISUSE, "SQL contains a NUL byte"))?;
        // Safety: open handle, valid C string, no callback.
        let rc = unsafe {
            ffi::sqlite3_exec(
                self.db.as_ptr(),
                sql.as_ptr(),
                None,
                ptr::null_mut(),
                ptr::null_mut(),
            )
        };
        self.check(rc)
    }

    /// Runs `sql` with the parameters `bind` binds: the rows it changed.
    pub fn run(
        &mut self,
        sql: &'static str,
        bind: impl for<'q> FnOnce(Query<'q>) -> Query<'q>,
    ) -> Result<u64> {
        self.query(sql).map(bind).and_then(Query::execute)
    }

    /// A prepared (and cached) statement, ready for binding from parameter 1.
    pub fn query(&mut self, sql: &'static str) -> Result<Query<'_>> {
        let key = (sql.as_ptr().addr(), sql.len());
        let stmt = match self.statements.get(&key) {
            Some(stmt) => *stmt,
            None => {
                let mut stmt = ptr::null_mut();
                let len = c_int::try_from(sql.len())
                    .map_err(|_| SqliteError::new(ffi::SQLITE_TOOBIG, "SQL text too long"))?;
                // Safety: open handle; the text lives for 'static; out-pointer to a local.
                let rc = unsafe {
                    ffi::sqlite3_prepare_v3(
                        self.db.as_ptr(),
                        sql.as_ptr().cast(),
                        len,
                        ffi::SQLITE_PREPARE_PERSISTENT as _,
                        &mut stmt,
                        ptr::null_mut(),
                    )
                };
                self.check(rc)?;
                let stmt = NonNull::new(stmt).ok_or_else(|| {
                    SqliteError::new(ffi::SQLITE_MISUSE, format!("no statement in {sql:?}"))
                })?;
                self.statements.insert(key, stmt);
                stmt
            }
        };
        Ok(Query {
            conn: self,
            stmt,
            next: 1,
            bind_error: None,
        })
    }

    /// True while a transaction is open (SQLite is not in autocommit mode).
    pub fn in_transaction(&mut self) -> bool {
        // Safety: open handle.
        unsafe { ffi::sqlite3_get_autocommit(self.db.as_ptr()) == 0 }
    }

    /// Rows changed by the last INSERT, UPDATE or DELETE.
    pub fn changes(&mut self) -> u64 {
        // Safety: open handle.
        u64::try_from(unsafe { ffi::sqlite3_changes64(self.db.as_ptr()) }).unwrap_or(0)
    }

    fn check(&self, rc: c_int) -> Result<()> {
        if rc == ffi::SQLITE_OK {
            Ok(())
        } else {
            Err(self.error(rc))
        }
    }

    fn error(&self, code: c_int) -> SqliteError {
        // Safety: open handle; errmsg returns a NUL-terminated string owned by SQLite,
        // copied at once.
        let message = unsafe { CStr::from_ptr(ffi::sqlite3_errmsg(self.db.as_ptr())) }
            .to_string_lossy()
            .into_owned();
        SqliteError { code, message }
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        // Safety: every statement belongs to this handle and none is in use (no
        // `Query` can outlive the `&mut self` it borrows).
        unsafe {
            for stmt in self.statements.values() {
                ffi::sqlite3_finalize(stmt.as_ptr());
            }
            ffi::sqlite3_close(self.db.as_ptr());
        }
    }
}

/// One parameter of a statement in use. Only [`Query::bind`] makes one, so a
/// [`Bind`] implementation can reach nothing but a live statement's parameter.
pub struct Slot<'q> {
    stmt: NonNull<ffi::sqlite3_stmt>,
    index: c_int,
    _query: std::marker::PhantomData<&'q mut ()>,
}

/// A value that can be bound to a statement parameter.
pub trait Bind {
    /// Binds into `slot`; returns SQLite's result code.
    fn bind_to(&self, slot: Slot<'_>) -> c_int;
}

impl Bind for i64 {
    fn bind_to(&self, slot: Slot<'_>) -> c_int {
        // Safety: a live statement (see `Query`).
        unsafe { ffi::sqlite3_bind_int64(slot.stmt.as_ptr(), slot.index, *self) }
    }
}

impl Bind for f64 {
    fn bind_to(&self, slot: Slot<'_>) -> c_int {
        // Safety: a live statement.
        unsafe { ffi::sqlite3_bind_double(slot.stmt.as_ptr(), slot.index, *self) }
    }
}

impl Bind for str {
    fn bind_to(&self, slot: Slot<'_>) -> c_int {
        bind_copied(slot, self.as_bytes(), true)
    }
}

impl Bind for String {
    fn bind_to(&self, slot: Slot<'_>) -> c_int {
        self.as_str().bind_to(slot)
    }
}

impl Bind for [u8] {
    fn bind_to(&self, slot: Slot<'_>) -> c_int {
        bind_copied(slot, self, false)
    }
}

/// Binds bytes as TEXT (`text`: UTF-8, as a `str` is) or as a BLOB.
fn bind_copied(slot: Slot<'_>, bytes: &[u8], text: bool) -> c_int {
    let Ok(len) = c_int::try_from(bytes.len()) else {
        return ffi::SQLITE_TOOBIG;
    };
    let (stmt, index, at) = (slot.stmt.as_ptr(), slot.index, bytes.as_ptr());
    // Safety: a live statement; SQLITE_TRANSIENT makes SQLite copy the bytes
    // before returning; an empty slice's dangling-but-aligned pointer is never
    // read.
    unsafe {
        if text {
            ffi::sqlite3_bind_text(stmt, index, at.cast(), len, ffi::SQLITE_TRANSIENT())
        } else {
            ffi::sqlite3_bind_blob(stmt, index, at.cast(), len, ffi::SQLITE_TRANSIENT())
        }
    }
}

impl Bind for Vec<u8> {
    fn bind_to(&self, slot: Slot<'_>) -> c_int {
        self.as_slice().bind_to(slot)
    }
}

impl<T: Bind + ?Sized> Bind for &T {
    fn bind_to(&self, slot: Slot<'_>) -> c_int {
        (**self).bind_to(slot)
    }
}

impl<T: Bind> Bind for Option<T> {
    fn bind_to(&self, slot: Slot<'_>) -> c_int {
        match self {
            Some(v) => v.bind_to(slot),
            // Safety: a live statement.
            None => unsafe { ffi::sqlite3_bind_null(slot.stmt.as_ptr(), slot.index) },
        }
    }
}

/// A statement in use: bind parameters in order, then `execute` or read rows.
/// Dropping it resets the statement for its next use.
pub struct Query<'c> {
    conn: &'c mut Connection,
    stmt: NonNull<ffi::sqlite3_stmt>,
    next: c_int,
    bind_error: Option<c_int>,
}

impl Query<'_> {
    /// Binds the next parameter (`?1`, `?2`, … in call order).
    pub fn bind<T: Bind + ?Sized>(mut self, value: &T) -> Self {
        let rc = value.bind_to(Slot {
            stmt: self.stmt,
            index: self.next,
            _query: std::marker::PhantomData,
        });
        if rc != ffi::SQLITE_OK && self.bind_error.is_none() {
            self.bind_error = Some(rc);
        }
        self.next += 1;
        self
    }

    /// Runs to completion, ignoring rows; returns the rows changed.
    pub fn execute(mut self) -> Result<u64> {
        self.execute_in_place()
    }

    /// Runs to completion, as [`Query::execute`], and appends to `rowids` the rowid
    /// of every row of the main database's `table` it updated, in the order it
    /// updated them: what a `RETURNING id` would give, without its cost. SQLite
    /// runs a `RETURNING` as a trigger, and an `UPDATE` with a trigger goes in
    /// two passes (every changed row copied into a temporary table first); an
    /// update hook is told of each row as it is written, in the one pass.
    pub fn execute_updated(mut self, table: &CStr, rowids: &mut Vec<i64>) -> Result<u64> {
        let mut noted = Noted { table, rowids };
        let hook = UpdateHook::set(self.conn.db, &mut noted);
        let done = self.execute_in_place();
        drop(hook);
        done
    }

    fn execute_in_place(&mut self) -> Result<u64> {
        while self.step()? {}
        Ok(self.conn.changes())
    }

    /// Steps to the next row; false when done.
    pub fn step(&mut self) -> Result<bool> {
        if let Some(rc) = self.bind_error {
            return Err(self.conn.error(rc));
        }
        // Safety: a live, bound statement owned by this connection.
        match unsafe { ffi::sqlite3_step(self.stmt.as_ptr()) } {
            ffi::SQLITE_ROW => Ok(true),
            ffi::SQLITE_DONE => Ok(false),
            rc => Err(self.conn.error(rc)),
        }
    }

    /// The current row's column `i` (valid after `step` returned true).
    pub fn int(&self, i: c_int) -> i64 {
        // Safety: a live statement positioned on a row.
        unsafe { ffi::sqlite3_column_int64(self.stmt.as_ptr(), i) }
    }

    pub fn real(&self, i: c_int) -> f64 {
        // Safety: as above.
        unsafe { ffi::sqlite3_column_double(self.stmt.as_ptr(), i) }
    }

    /// The storage class of column `i` in the current row (`SQLITE_INTEGER`,
    /// `SQLITE_FLOAT`, `SQLITE_TEXT`, `SQLITE_BLOB` or `SQLITE_NULL`).
    pub fn column_type(&self, i: c_int) -> c_int {
        // Safety: a live statement positioned on a row.
        unsafe { ffi::sqlite3_column_type(self.stmt.as_ptr(), i) }
    }

    pub fn is_null(&self, i: c_int) -> bool {
        // Safety: as above.
        unsafe { ffi::sqlite3_column_type(self.stmt.as_ptr(), i) == ffi::SQLITE_NULL }
    }

    /// A text column, or `None` for NULL; bytes that are not UTF-8 are an error
    /// (a damaged row), not repaired.
    pub fn opt_text(&self, i: c_int) -> std::result::Result<Option<String>, ColumnError> {
        if self.is_null(i) {
            return Ok(None);
        }
        self.utf8(i).map(Some)
    }

    /// A text column; NULL reads as empty.
    pub fn text(&self, i: c_int) -> std::result::Result<String, ColumnError> {
        Ok(self.opt_text(i)?.unwrap_or_default())
    }

    /// A column's text, for a caller that has already read the column's type, as
    /// [`Query::opt_text`] reads it.
    pub fn utf8(&self, i: c_int) -> std::result::Result<String, ColumnError> {
        String::from_utf8(self.bytes(i, true)?).map_err(|_| ColumnError::NotUtf8 { column: i })
    }

    /// A column's bytes, as TEXT (`text`) or as a BLOB, copied, for a caller that
    /// has already read the column's type (a NULL reads as empty).
    pub fn bytes(&self, i: c_int, text: bool) -> std::result::Result<Vec<u8>, ColumnError> {
        let stmt = self.stmt.as_ptr();
        // Safety: the pointer and the byte count are read back to back (the
        // pointer first, as SQLite asks) and copied at once.
        unsafe {
            let ptr: *const u8 = if text {
                ffi::sqlite3_column_text(stmt, i)
            } else {
                ffi::sqlite3_column_blob(stmt, i).cast()
            };
            let len = usize::try_from(ffi::sqlite3_column_bytes(stmt, i)).unwrap_or(0);
            if ptr.is_null() {
                // A zero-length value is a null pointer too; out of memory is
                // told apart by the connection's error code.
                self.out_of_memory()?;
                return Ok(Vec::new());
            }
            Ok(std::slice::from_raw_parts(ptr, len).to_vec())
        }
    }

    /// An error if the last column read ran out of memory.
    fn out_of_memory(&self) -> std::result::Result<(), ColumnError> {
        // Safety: an open handle; the code is of the call just made on it.
        let code = unsafe { ffi::sqlite3_errcode(self.conn.db.as_ptr()) };
        if code == ffi::SQLITE_NOMEM {
            return Err(ColumnError::Sqlite(self.conn.error(code)));
        }
        Ok(())
    }
}

/// What [`Query::execute_updated`] lends its update hook: the table watched, and
/// where the rowids of its updated rows go.
struct Noted<'a> {
    table: &'a CStr,
    rowids: &'a mut Vec<i64>,
}

/// The update hook set on a connection for as long as this lives: it borrows
/// what the hook writes to, so nothing else can touch it meanwhile, and removes
/// the hook when dropped (so also if a step unwound).
struct UpdateHook<'n> {
    db: NonNull<ffi::sqlite3>,
    _noted: std::marker::PhantomData<&'n mut Noted<'n>>,
}

impl<'n> UpdateHook<'n> {
    fn set(db: NonNull<ffi::sqlite3>, noted: &'n mut Noted<'n>) -> Self {
        // Safety: an open handle; the hook's argument is `noted`, borrowed by the
        // guard returned, which removes the hook before the borrow ends.
        unsafe {
            ffi::sqlite3_update_hook(
                db.as_ptr(),
                Some(note_updated),
                ptr::from_mut(noted).cast::<std::ffi::c_void>(),
            );
        }
        Self {
            db,
            _noted: std::marker::PhantomData,
        }
    }
}

impl Drop for UpdateHook<'_> {
    fn drop(&mut self) {
        // Safety: an open handle (the guard lives within a `Query`'s use of it);
        // removing the hook.
        unsafe {
            ffi::sqlite3_update_hook(self.db.as_ptr(), None, ptr::null_mut());
        }
    }
}

/// The update hook of [`Query::execute_updated`]. It must not unwind into
/// SQLite: it only compares two C strings and pushes an integer (which can
/// abort on out of memory, never unwind).
unsafe extern "C" fn note_updated(
    noted: *mut std::ffi::c_void,
    op: c_int,
    db: *const std::ffi::c_char,
    table: *const std::ffi::c_char,
    rowid: ffi::sqlite3_int64,
) {
    if op != ffi::SQLITE_UPDATE || noted.is_null() || db.is_null() || table.is_null() {
        return;
    }
    // Safety: `noted` is the `Noted` an `UpdateHook` borrows for as long as this
    // hook is set, so nothing else uses it meanwhile; SQLite passes the names as
    // NUL-terminated strings valid for the call.
    unsafe {
        let noted = &mut *noted.cast::<Noted<'_>>();
        if CStr::from_ptr(db) == c"main" && CStr::from_ptr(table) == noted.table {
            noted.rowids.push(rowid);
        }
    }
}

impl Drop for Query<'_> {
    fn drop(&mut self) {
        // Safety: a live statement; reset ends any step in progress.
        unsafe {
            ffi::sqlite3_reset(self.stmt.as_ptr());
            ffi::sqlite3_clear_bindings(self.stmt.as_ptr());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `execute_updated` notes the rows of its table the statement updated, and
    /// only those: not the rows its `WHERE` passed over, not a trigger's rows of
    /// another table, and nothing once it returned, even with an error.
    #[test]
    fn execute_updated_notes_the_rows_it_updated() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let path = dir.path().join("hook.db");
        std::fs::File::create(&path).unwrap_or_else(|e| panic!("{e}"));
        let mut conn = Connection::open(&path).unwrap_or_else(|e| panic!("{e}"));
        conn.batch(
            "CREATE TABLE t (id INTEGER PRIMARY KEY, v INTEGER NOT NULL); \
             CREATE TABLE u (id INTEGER PRIMARY KEY, n INTEGER NOT NULL); \
             INSERT INTO t VALUES (1, 0), (2, 0), (3, 0), (4, 0), (5, 0); \
             INSERT INTO u VALUES (7, 0); \
             CREATE TRIGGER t_counted AFTER UPDATE ON t BEGIN \
                 UPDATE u SET n = n + 1 WHERE id = 7; END;",
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let mut rowids = Vec::new();
        let changed = conn
            .query("UPDATE t SET v = v + 1 WHERE id IN (4, 2, 9)")
            .and_then(|q| q.execute_updated(c"t", &mut rowids))
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(changed, 2);
        rowids.sort_unstable();
        assert_eq!(rowids, [2, 4]);
        assert_no_update_hook(&mut conn);

        let failed = conn
            .query("UPDATE t SET v = NULL WHERE id = 3")
            .and_then(|q| q.execute_updated(c"t", &mut rowids));
        assert!(failed.is_err(), "a NOT NULL column was set to NULL");
        assert_no_update_hook(&mut conn);
        conn.run("UPDATE t SET v = 5 WHERE id = 5", |q| q)
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(rowids, [2, 4], "rows noted outside execute_updated");
    }

    /// No update hook is left set on `conn` (SQLite hands back the argument of the
    /// hook it replaces).
    fn assert_no_update_hook(conn: &mut Connection) {
        // Safety: an open handle; setting no hook in place of whatever was set.
        let left = unsafe { ffi::sqlite3_update_hook(conn.db.as_ptr(), None, ptr::null_mut()) };
        assert!(left.is_null(), "an update hook was left set");
    }

    /// Reading a value SQLite runs out of memory handing over is an error, not an
    /// empty value: run again in a process of its own, whose heap limit only it
    /// sets.
    #[test]
    fn an_out_of_memory_read_is_an_error() {
        const CHILD: &str = "SPOOL_OOM_CHILD";
        if std::env::var_os(CHILD).is_some() {
            out_of_memory_read();
            return;
        }
        let exe = std::env::current_exe().unwrap_or_else(|e| panic!("{e}"));
        let out = std::process::Command::new(exe)
            .args([
                "store::sqlite::raw::tests::an_out_of_memory_read_is_an_error",
                "--exact",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(CHILD, "1")
            .output()
            .unwrap_or_else(|e| panic!("{e}"));
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && stdout.contains("1 passed"),
            "{stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// In the child: memory statistics on (the build turns them off, and the heap
    /// limit needs them), no lookaside (small allocations would come from it), a
    /// heap limit at what is in use, then a read that must allocate to convert: a
    /// 16 MiB blob as text.
    fn out_of_memory_read() {
        // Safety: before SQLite is first used in this process.
        let rc = unsafe { ffi::sqlite3_config(ffi::SQLITE_CONFIG_MEMSTATUS, 1 as c_int) };
        assert_eq!(rc, ffi::SQLITE_OK);
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let path = dir.path().join("oom.db");
        std::fs::File::create(&path).unwrap_or_else(|e| panic!("{e}"));
        let mut conn = Connection::open(&path).unwrap_or_else(|e| panic!("{e}"));
        // Safety: an open handle with no statement yet.
        let rc = unsafe {
            ffi::sqlite3_db_config(
                conn.db.as_ptr(),
                ffi::SQLITE_DBCONFIG_LOOKASIDE,
                std::ptr::null_mut::<std::ffi::c_void>(),
                0 as c_int,
                0 as c_int,
            )
        };
        assert_eq!(rc, ffi::SQLITE_OK);
        let mut q = conn
            .query("SELECT zeroblob(16777216)")
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(q.step().unwrap_or_else(|e| panic!("{e}")));
        // Safety: plain settings and queries of the library's allocator.
        unsafe {
            ffi::sqlite3_hard_heap_limit64(ffi::sqlite3_memory_used());
        }
        assert!(
            matches!(
                q.opt_text(0),
                Err(ColumnError::Sqlite(SqliteError {
                    code: ffi::SQLITE_NOMEM,
                    ..
                }))
            ),
            "a text read out of memory came back as a value"
        );
    }
}
