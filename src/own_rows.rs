//! Rows of etc_batch's own tables read, locked and written without a statement, for
//! what every chunk and every step does to them: the audit rows, inserted the way COPY
//! inserts them (a multi-insert into the heap, then each row into every index, unique
//! checks included); a step's or a job's own row, locked as FOR UPDATE locks it and
//! changed in place as catalog rows are (one heap update, the indexes only when it
//! could not be a HOT update); and single rows found by a unique index that their key
//! column leads. No statement is planned, started and ended for them, which is most of
//! what a statement of one row costs.
//!
//! What a statement would also do and this does not: evaluate defaults and check
//! constraints (etc_batch gives every column, with values it made). Triggers are the
//! exception that is kept: where a table has a trigger for the write (a DBA's, since
//! etc_batch puts none there), the write goes through a statement, so that it fires.
//! The table must have exactly the columns etc_batch writes: one added, dropped or
//! retyped by hand stops the writer with a clear error, never a row left to a default.

use crate::error::{BatchError, Result};
use crate::query;
use pgrx::datum::DatumWithOid;
use pgrx::pg_sys;
use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::{CStr, CString};

/// The columns a writer gives, by name and type (a domain's base type: a value is
/// written as it is, its domain's check not evaluated), in the order `fill` gives them.
pub type Columns = &'static [(&'static str, pg_sys::Oid)];

/// The compression for the values etc_batch writes out of line (its frozen lists' and
/// audits' arrays), for `with`: lz4 where PostgreSQL was built with it, which compresses
/// them about five times faster than pglz, the default, and nearly as small; none where
/// it was not. Looked up once per backend.
fn fast_compression() -> &'static [(&'static CStr, &'static str)] {
    thread_local! {
        static LZ4: std::cell::OnceCell<bool> = const { std::cell::OnceCell::new() };
    }
    let lz4 = LZ4.with(|known| {
        *known.get_or_init(|| {
            query::one::<bool>(
                "SELECT 'lz4' OPERATOR(pg_catalog.=) ANY (enumvals) FROM pg_catalog.pg_settings \
                  WHERE name OPERATOR(pg_catalog.=) 'default_toast_compression'",
                &[],
            )
            .ok()
            .flatten()
            .unwrap_or(false)
        })
    });
    if lz4 {
        &[(c"default_toast_compression", "lz4")]
    } else {
        &[]
    }
}

/// The most columns a writer gives.
const MAX_COLUMNS: usize = 16;

/// Writes rows into one table of schema etc_batch, one call (a drain, a chain run)
/// long. Its tuple slots are made once, in the memory context current when the writer
/// was made (which outlives every transaction of the call), over a copy of the table's
/// row type that no transaction's resources hold: a slot made per row and dropped again
/// would cost more than the row.
pub struct RowWriter {
    table: CString,
    columns: Columns,
    context: pg_sys::MemoryContext,
    /// For each attribute of the table, which of `columns` it holds; None: dropped.
    layout: Vec<Option<usize>>,
    desc: pg_sys::TupleDesc,
    slots: Vec<*mut pg_sys::TupleTableSlot>,
    /// The relation's descriptor and its number of attributes when the layout was last
    /// checked.
    checked: Option<(pg_sys::TupleDesc, i32)>,
}

impl RowWriter {
    pub fn new(table: &str, columns: Columns) -> Result<RowWriter> {
        assert!(columns.len() <= MAX_COLUMNS);
        Ok(RowWriter {
            table: CString::new(table)
                .map_err(|_| BatchError::Internal("a table name contains a zero byte".into()))?,
            columns,
            // SAFETY: reads the current context, which the caller keeps for the call.
            context: unsafe { pg_sys::CurrentMemoryContext },
            layout: Vec::new(),
            desc: std::ptr::null_mut(),
            slots: Vec::new(),
            checked: None,
        })
    }

    fn name(&self) -> String {
        self.table.to_string_lossy().into_owned()
    }

    /// Writes `rows` rows in the current transaction, as the current user (etc_batch's
    /// owner: no privilege is checked here). `fill(i, values)` gives row i's values in
    /// the order of the columns, None for NULL, as datums that live until this returns.
    /// A row a unique index already has fails with unique_violation, as an INSERT would.
    pub fn write(
        &mut self,
        rows: usize,
        mut fill: impl FnMut(usize, &mut [Option<pg_sys::Datum>]),
    ) -> Result<()> {
        if rows == 0 {
            return Ok(());
        }
        let compression = fast_compression();
        // SAFETY: the table is opened (and locked until the end of the transaction) for
        // the span of the call and closed before returning; the executor state and the
        // index descriptors are made and freed here, the slots are the writer's. An
        // ERROR (a duplicate row, a dropped table) unwinds through this: the
        // transaction's abort releases the table, the locks and the memory.
        unsafe {
            let lock = pg_sys::RowExclusiveLock as pg_sys::LOCKMODE;
            let rel = open_own_table(&self.table, lock);
            if fires(rel, Write::Insert) {
                pg_sys::table_close(rel, pg_sys::NoLock as pg_sys::LOCKMODE);
                return self.insert_statements(rows, fill);
            }
            if let Err(e) = self.prepare(rel, rows) {
                // the lock stays until the transaction ends, as a failed INSERT's would
                pg_sys::table_close(rel, pg_sys::NoLock as pg_sys::LOCKMODE);
                return Err(e);
            }
            let estate = pg_sys::CreateExecutorState();
            let result_rel = pg_sys::palloc0(std::mem::size_of::<pg_sys::ResultRelInfo>())
                as *mut pg_sys::ResultRelInfo;
            pg_sys::InitResultRelInfo(result_rel, rel, 0, std::ptr::null_mut(), 0);
            pg_sys::ExecOpenIndices(result_rel, false);

            let mut values = [None; MAX_COLUMNS];
            let values = &mut values[..self.columns.len()];
            let slots = &mut self.slots[..rows];
            for (i, &slot) in slots.iter().enumerate() {
                values.fill(None);
                fill(i, values);
                pg_sys::ExecClearTuple(slot);
                for (a, column) in self.layout.iter().enumerate() {
                    let value = column.and_then(|c| values[c]);
                    *(*slot).tts_values.add(a) = value.unwrap_or(pg_sys::Datum::from(0));
                    *(*slot).tts_isnull.add(a) = value.is_none();
                }
                pg_sys::ExecStoreVirtualTuple(slot);
            }
            let command = pg_sys::GetCurrentCommandId(true);
            // the rows' long values are compressed as they are inserted
            crate::settings::with(compression, || {
                pg_sys::table_multi_insert(
                    rel,
                    slots.as_mut_ptr(),
                    rows as i32,
                    command,
                    0,
                    std::ptr::null_mut(),
                )
            });
            for &slot in slots.iter() {
                let recheck = insert_index_tuples(result_rel, slot, estate, false);
                // etc_batch's unique indexes are immediate: a duplicate has failed already
                if !recheck.is_null() {
                    return Err(BatchError::Internal(format!(
                        "a deferred unique constraint on etc_batch.{}",
                        self.name()
                    )));
                }
                pg_sys::ExecClearTuple(slot);
            }
            pg_sys::ExecCloseIndices(result_rel);
            pg_sys::FreeExecutorState(estate);
            // the lock stays until the transaction ends, as an INSERT's would
            pg_sys::table_close(rel, pg_sys::NoLock as pg_sys::LOCKMODE);
        }
        Ok(())
    }

    /// The rows written by INSERT statements, one per row, for a table with triggers.
    fn insert_statements(
        &self,
        rows: usize,
        mut fill: impl FnMut(usize, &mut [Option<pg_sys::Datum>]),
    ) -> Result<()> {
        let names: Vec<String> = self
            .columns
            .iter()
            .map(|(n, _)| pgrx::spi::quote_identifier(n))
            .collect();
        let params: Vec<String> = (1..=self.columns.len()).map(|i| format!("${i}")).collect();
        let sql = format!(
            "INSERT INTO etc_batch.{} ({}) OVERRIDING SYSTEM VALUE VALUES ({})",
            pgrx::spi::quote_identifier(self.name()),
            names.join(", "),
            params.join(", ")
        );
        let mut values = [None; MAX_COLUMNS];
        let values = &mut values[..self.columns.len()];
        for i in 0..rows {
            values.fill(None);
            fill(i, values);
            let args: Vec<DatumWithOid> = values
                .iter()
                .zip(self.columns)
                .map(|(value, (_, type_oid))| match value {
                    // SAFETY: a datum `fill` made for a column of this type
                    Some(datum) => unsafe { DatumWithOid::new(*datum, *type_oid) },
                    None => DatumWithOid::null_oid(*type_oid),
                })
                .collect();
            query::run(&sql, &args)?;
        }
        Ok(())
    }

    /// Checks the table's columns (again: they may have changed since the last
    /// transaction) and makes slots for `rows` rows, for the row type as it is now.
    ///
    /// # Safety
    /// `rel` must be the open table.
    unsafe fn prepare(&mut self, rel: pg_sys::Relation, rows: usize) -> Result<()> {
        // The relation's descriptor as checked last time: a change of columns gives the
        // relation a new one (the old one is freed only after it).
        let checked = ((*rel).rd_att, (*(*rel).rd_att).natts);
        if self.checked != Some(checked) {
            let layout = self.layout_of(rel)?;
            self.checked = Some(checked);
            if layout != self.layout || self.desc.is_null() || (*self.desc).natts != checked.1 {
                // the old slots are the writer context's memory, left to it
                self.slots.clear();
                let previous = pg_sys::MemoryContextSwitchTo(self.context);
                self.desc = pg_sys::CreateTupleDescCopy((*rel).rd_att);
                pg_sys::MemoryContextSwitchTo(previous);
                self.layout = layout;
            }
        }
        while self.slots.len() < rows {
            let previous = pg_sys::MemoryContextSwitchTo(self.context);
            let slot = pg_sys::MakeSingleTupleTableSlot(self.desc, &pg_sys::TTSOpsVirtual);
            pg_sys::MemoryContextSwitchTo(previous);
            self.slots.push(slot);
        }
        Ok(())
    }

    /// For each attribute of the table, which of the columns it holds: every column must
    /// be there with its type, and nothing else.
    ///
    /// # Safety
    /// `rel` must be an open relation.
    unsafe fn layout_of(&self, rel: pg_sys::Relation) -> Result<Vec<Option<usize>>> {
        let desc = pgrx::tupdesc::PgTupleDesc::from_pg_unchecked((*rel).rd_att);
        let mismatch = |column: &str| BatchError::TableLayout {
            table: self.name(),
            column: column.to_string(),
        };
        let mut layout = Vec::with_capacity(desc.len());
        let mut seen = [false; MAX_COLUMNS];
        for i in 0..desc.len() {
            let attribute = desc.get(i).expect("the attribute exists");
            if attribute.attisdropped {
                layout.push(None);
                continue;
            }
            let name = attribute.name();
            let c = self
                .columns
                .iter()
                .position(|(n, _)| *n == name)
                .ok_or_else(|| mismatch(name))?;
            // a domain's base type is looked up only where the type is not the one given
            let type_oid = attribute.atttypid;
            if type_oid != self.columns[c].1 && pg_sys::getBaseType(type_oid) != self.columns[c].1 {
                return Err(mismatch(name));
            }
            seen[c] = true;
            layout.push(Some(c));
        }
        if let Some(missing) = (0..self.columns.len()).find(|&c| !seen[c]) {
            return Err(mismatch(self.columns[missing].0));
        }
        Ok(layout)
    }
}

/// ExecInsertIndexTuples for a new row or row version (into the summarizing indexes only,
/// for an update that needs no others), whose last argument came with PostgreSQL 16.
/// Never with "update": that only hints that an update left the indexed values alone,
/// and would read a statement's list of updated columns, which there is none of.
///
/// # Safety
/// As ExecInsertIndexTuples: the slot holds a tuple just written into the result
/// relation, whose indexes are open.
unsafe fn insert_index_tuples(
    result_rel: *mut pg_sys::ResultRelInfo,
    slot: *mut pg_sys::TupleTableSlot,
    estate: *mut pg_sys::EState,
    only_summarizing: bool,
) -> *mut pg_sys::List {
    // the arguments every version takes, then 16's only_summarizing
    macro_rules! insert {
        ($($since_16:expr)?) => {
            pg_sys::ExecInsertIndexTuples(
                result_rel,
                slot,
                estate,
                false,
                false,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                $($since_16)?
            )
        };
    }
    #[cfg(feature = "pg15")]
    {
        let _ = only_summarizing;
        insert!()
    }
    #[cfg(not(feature = "pg15"))]
    {
        insert!(only_summarizing)
    }
}

thread_local! {
    /// The OIDs of etc_batch's tables by name, looked up once per backend: a name
    /// looked up in the catalog every time costs a namespace search and a cache probe
    /// per open, several times per step or chunk.
    static OIDS: RefCell<HashMap<CString, (pg_sys::Oid, pg_sys::Oid)>> = RefCell::new(HashMap::new());
}

/// The table etc_batch.`name`, opened with `lock` (an ERROR if there is none). A kept
/// OID is used only if the relation it opens, once locked (so that it cannot go away
/// meanwhile), still has that name in the schema it had (by the schema's OID, kept
/// with it); otherwise (dropped, or a job's partitions pruned) the name is looked up
/// again.
///
/// # Safety
/// In a transaction; the caller closes the relation.
unsafe fn open_own_table(name: &CStr, lock: pg_sys::LOCKMODE) -> pg_sys::Relation {
    if let Some((oid, schema)) = OIDS.with(|o| o.borrow().get(name).copied()) {
        let rel = pg_sys::try_table_open(oid, lock);
        if !rel.is_null() {
            let form = &*(*rel).rd_rel;
            if form.relnamespace == schema && CStr::from_ptr(form.relname.data.as_ptr()) == name {
                return rel;
            }
            pg_sys::table_close(rel, lock);
        }
        OIDS.with(|o| o.borrow_mut().remove(name));
    }
    let range = pg_sys::makeRangeVar(c"etc_batch".as_ptr() as *mut _, name.as_ptr() as *mut _, -1);
    let rel = pg_sys::table_openrv(range, lock);
    OIDS.with(|o| {
        let mut oids = o.borrow_mut();
        // a backend that drains thousands of jobs keeps no more than this
        if oids.len() >= 256 {
            oids.clear();
        }
        oids.insert(
            name.to_owned(),
            ((*rel).rd_id, (*(*rel).rd_rel).relnamespace),
        )
    });
    rel
}

/// The kinds of write a trigger may be for.
#[derive(Clone, Copy)]
enum Write {
    Insert,
    Update,
}

/// Whether the relation has a trigger that an INSERT (or an UPDATE) would fire.
///
/// # Safety
/// `rel` must be an open relation.
unsafe fn fires(rel: pg_sys::Relation, write: Write) -> bool {
    let triggers = (*rel).trigdesc;
    if triggers.is_null() {
        return false;
    }
    let t = &*triggers;
    match write {
        Write::Insert => {
            t.trig_insert_before_row
                || t.trig_insert_after_row
                || t.trig_insert_instead_row
                || t.trig_insert_before_statement
                || t.trig_insert_after_statement
                || t.trig_insert_new_table
        }
        Write::Update => {
            t.trig_update_before_row
                || t.trig_update_after_row
                || t.trig_update_instead_row
                || t.trig_update_before_statement
                || t.trig_update_after_statement
                || t.trig_update_old_table
                || t.trig_update_new_table
        }
    }
}

/// Where a row version lies: what a row lock found, for `update_locked`.
#[derive(Clone, Copy)]
pub struct Tid(pg_sys::ItemPointerData);

/// What locking a row came to.
pub enum Lock<R> {
    /// Locked, and read; the version locked is at the Tid.
    Row(R, Tid),
    /// Another transaction holds its lock, and the caller asked not to wait.
    HeldByAnother,
    /// There is no such row (any more).
    Missing,
}

/// A value of a key column that leads a btree index of the table: integer, bigint or
/// text (compared in the index's collation).
#[derive(Clone, Copy, Debug)]
pub enum Key<'a> {
    Int4(i32),
    Int8(i64),
    Text(&'a str),
}

/// How a read compares the key column to a `Key`.
#[derive(Clone, Copy)]
pub enum Compare {
    Equal,
    Greater,
    AtLeast,
}

impl Key<'_> {
    fn type_oid(self) -> pg_sys::Oid {
        match self {
            Key::Int4(_) => pg_sys::INT4OID,
            Key::Int8(_) => pg_sys::INT8OID,
            Key::Text(_) => pg_sys::TEXTOID,
        }
    }

    /// The btree strategy and comparison function for `compare`, and the key's datum.
    fn scan(self, compare: Compare) -> (u32, u32, pg_sys::Datum) {
        // each type's =, > and >= functions
        let (procedures, datum) = match self {
            Key::Int4(k) => (
                [pg_sys::F_INT4EQ, pg_sys::F_INT4GT, pg_sys::F_INT4GE],
                pg_sys::Datum::from(k),
            ),
            Key::Int8(k) => (
                [pg_sys::F_INT8EQ, pg_sys::F_INT8GT, pg_sys::F_INT8GE],
                pg_sys::Datum::from(k),
            ),
            Key::Text(k) => (
                [pg_sys::F_TEXTEQ, pg_sys::F_TEXT_GT, pg_sys::F_TEXT_GE],
                // a text datum in the current memory context, for the span of the scan
                pgrx::IntoDatum::into_datum(k).expect("text is never NULL"),
            ),
        };
        let (strategy, procedure) = match compare {
            Compare::Equal => (pg_sys::BTEqualStrategyNumber, procedures[0]),
            Compare::Greater => (pg_sys::BTGreaterStrategyNumber, procedures[1]),
            Compare::AtLeast => (pg_sys::BTGreaterEqualStrategyNumber, procedures[2]),
        };
        (strategy, procedure, datum)
    }
}

/// A row as read from one of etc_batch's tables, its columns by name.
pub struct Fields<'t> {
    table: &'t Table<'t>,
    tuple: pg_sys::HeapTuple,
}

impl Fields<'_> {
    /// Column `name` as a Rust value. A column whose type (a domain's base type) is not
    /// one `T` holds, retyped by hand, stops the read with a clear error, never a value
    /// misread.
    pub fn get<T: pgrx::FromDatum + pgrx::IntoDatum>(&self, name: &str) -> Result<Option<T>> {
        let column = self.table.attribute(name)?;
        if !holds::<T>(column.type_oid) {
            return Err(self.table.layout_error(name));
        }
        // SAFETY: the tuple is a row of the open table, whose descriptor this is.
        unsafe {
            let mut is_null = false;
            let datum =
                pg_sys::heap_getattr(self.tuple, column.attnum, self.table.desc(), &mut is_null);
            Ok(T::from_polymorphic_datum(datum, is_null, column.type_oid))
        }
    }

    /// Column `name`, a varlena column (an array, text), as it is: one flat copy in the
    /// current memory context, for a statement to bind (query::Opaque).
    pub fn value(&self, name: &str) -> Result<Option<query::Opaque>> {
        let column = self.table.attribute(name)?;
        // SAFETY: the tuple is a row of the open table, whose descriptor this is; the
        // column is a varlena one, checked before its value is copied.
        unsafe {
            if column.len != -1 {
                return Err(self.table.layout_error(name));
            }
            let mut is_null = false;
            let datum =
                pg_sys::heap_getattr(self.tuple, column.attnum, self.table.desc(), &mut is_null);
            Ok((!is_null).then(|| query::Opaque::flat_copy(datum, column.type_oid)))
        }
    }
}

/// Whether a column of type `type_oid` is read as a `T`: its own type, a domain's base
/// type, or an OID alias (regrole, regclass, ...) read as an oid, which is how it is
/// stored. The base type is looked up only when the type itself does not fit.
fn holds<T: pgrx::IntoDatum>(type_oid: pg_sys::Oid) -> bool {
    if T::is_compatible_with(type_oid) {
        return true;
    }
    const OID_ALIASES: [pg_sys::Oid; 5] = [
        pg_sys::REGROLEOID,
        pg_sys::REGCLASSOID,
        pg_sys::REGPROCEDUREOID,
        pg_sys::REGNAMESPACEOID,
        pg_sys::REGTYPEOID,
    ];
    if T::type_oid() == pg_sys::OIDOID && OID_ALIASES.contains(&type_oid) {
        return true;
    }
    // SAFETY: a catalog lookup; an unknown type raises an ERROR, as a statement would
    let base = unsafe { pg_sys::getBaseType(type_oid) };
    base != type_oid && T::is_compatible_with(base)
}

/// A live column of a table: its attribute number (1-based) and its type.
struct TableColumn {
    attnum: i32,
    type_oid: pg_sys::Oid,
    /// Its length in bytes; -1 for a varlena type.
    len: i16,
}

/// One of etc_batch's tables, open for the span of `with_table`'s closure, its rows read
/// in one snapshot taken when it was opened, which sees this transaction's own writes so
/// far.
pub struct Table<'a> {
    name: &'a str,
    rel: pg_sys::Relation,
    snapshot: pg_sys::Snapshot,
}

/// The table etc_batch.`table`, open to be written (RowExclusiveLock, kept until the
/// transaction ends, as a statement's would be) for the span of `work`.
pub fn with_table<R>(table: &str, work: impl FnOnce(&Table) -> Result<R>) -> Result<R> {
    open_table(table, pg_sys::RowExclusiveLock, work)
}

/// The table etc_batch.`table`, open to be read (AccessShareLock, as a SELECT's).
pub fn reading_table<R>(table: &str, work: impl FnOnce(&Table) -> Result<R>) -> Result<R> {
    open_table(table, pg_sys::AccessShareLock, work)
}

fn open_table<R>(table: &str, lock: u32, work: impl FnOnce(&Table) -> Result<R>) -> Result<R> {
    let name = CString::new(table)
        .map_err(|_| BatchError::Internal("a table name contains a zero byte".into()))?;
    // SAFETY: the snapshot is registered and the relation open until the closure
    // returns; an ERROR inside leaves both to the transaction's abort.
    unsafe {
        let rel = open_own_table(&name, lock as pg_sys::LOCKMODE);
        // what the statements of this transaction wrote so far is visible
        pg_sys::CommandCounterIncrement();
        let snapshot = pg_sys::RegisterSnapshot(pg_sys::GetLatestSnapshot());
        let t = Table {
            name: table,
            rel,
            snapshot,
        };
        let result = work(&t);
        pg_sys::UnregisterSnapshot(snapshot);
        pg_sys::table_close(rel, pg_sys::NoLock as pg_sys::LOCKMODE);
        result
    }
}

impl Table<'_> {
    fn desc(&self) -> pg_sys::TupleDesc {
        // SAFETY: the relation is open.
        unsafe { (*self.rel).rd_att }
    }

    /// Whether the table has a trigger an UPDATE would fire: then the caller changes the
    /// row with a statement, so that it fires.
    pub fn fires_on_update(&self) -> bool {
        // SAFETY: the relation is open.
        unsafe { fires(self.rel, Write::Update) }
    }

    fn layout_error(&self, column: &str) -> BatchError {
        BatchError::TableLayout {
            table: self.name.to_string(),
            column: column.to_string(),
        }
    }

    /// Column `name`, looked up in the relation's descriptor by its bytes (a few
    /// columns: cheaper than building a map at every open).
    fn attribute(&self, name: &str) -> Result<TableColumn> {
        // SAFETY: the relation is open; its descriptor and attribute names live as long,
        // and each name is NUL-terminated within its NameData.
        unsafe {
            let desc = self.desc();
            for i in 0..(*desc).natts as usize {
                let found = query::attribute(desc, i, |a| {
                    (!a.attisdropped
                        && std::ffi::CStr::from_ptr(a.attname.data.as_ptr()).to_bytes()
                            == name.as_bytes())
                    .then_some((a.atttypid, a.attlen))
                });
                if let Some((type_oid, len)) = found {
                    return Ok(TableColumn {
                        attnum: i as i32 + 1,
                        type_oid,
                        len,
                    });
                }
            }
        }
        Err(self.layout_error(name))
    }

    /// The first row, in the order of a unique btree index that `column` leads, whose
    /// `column` compares to `key` as `compare` says, read with `read`. None: there is none.
    pub fn first<R>(
        &self,
        column: &str,
        compare: Compare,
        key: Key,
        read: impl FnOnce(&Fields) -> Result<R>,
    ) -> Result<Option<R>> {
        let mut read = Some(read);
        self.scan(column, compare, key, |row, _| {
            let read = read.take().expect("the scan breaks off at the first row");
            read(row).map(std::ops::ControlFlow::Break)
        })
    }

    /// Visits the rows, in the order of a unique btree index that `column` leads, whose
    /// `column` compares to `key` as `compare` says, each with where it lies, until
    /// `visit` breaks off with a value. None: every such row was visited.
    ///
    /// Read by the index itself, never by systable_beginscan: that scans the heap, in no
    /// order, when a session starts with ignore_system_indexes, which any role may set,
    /// and "the next step" would be whichever came first.
    pub fn scan<R>(
        &self,
        column: &str,
        compare: Compare,
        key: Key,
        mut visit: impl FnMut(&Fields, Tid) -> Result<std::ops::ControlFlow<R>>,
    ) -> Result<Option<R>> {
        let attribute = self.attribute(column)?;
        if attribute.type_oid != key.type_oid() {
            return Err(self.layout_error(column));
        }
        let (strategy, procedure, datum) = key.scan(compare);
        // SAFETY: an index scan of the open table in the table's snapshot; the index is
        // opened and closed here, the scan and its slot ended and dropped before
        // returning, and each row read while the slot holds it. `visit` may lock the row
        // it is given, as the executor locks rows under an index scan. An ERROR leaves
        // them to the transaction's abort.
        unsafe {
            let index = self.leading_index(attribute.attnum)?;
            let mut scankey = pg_sys::ScanKeyData::default();
            // attribute 1: the index's own first column
            pg_sys::ScanKeyInit(
                &mut scankey,
                1,
                strategy as pg_sys::StrategyNumber,
                pg_sys::Oid::from(procedure),
                datum,
            );
            // compared as the index orders its first column (text: its collation)
            scankey.sk_collation = *(*index).rd_indcollation;
            let scan = begin_index_scan(self.rel, index, self.snapshot);
            pg_sys::index_rescan(scan, &mut scankey, 1, std::ptr::null_mut(), 0);
            let slot = pg_sys::table_slot_create(self.rel, std::ptr::null_mut());
            let mut result = Ok(None);
            while pg_sys::index_getnext_slot(
                scan,
                pg_sys::ScanDirection::ForwardScanDirection,
                slot,
            ) {
                let mut free = false;
                let tuple = pg_sys::ExecFetchSlotHeapTuple(slot, false, &mut free);
                let at = Tid((*tuple).t_self);
                match visit(&Fields { table: self, tuple }, at) {
                    Ok(std::ops::ControlFlow::Continue(())) => continue,
                    Ok(std::ops::ControlFlow::Break(value)) => result = Ok(Some(value)),
                    Err(e) => result = Err(e),
                }
                break;
            }
            pg_sys::ExecDropSingleTupleTableSlot(slot);
            pg_sys::index_endscan(scan);
            pg_sys::index_close(index, pg_sys::AccessShareLock as pg_sys::LOCKMODE);
            result
        }
    }

    /// A unique btree index of the table whose first column is attribute `attnum`, open
    /// (AccessShareLock): every table etc_batch reads this way has one.
    ///
    /// # Safety
    /// The relation is open.
    unsafe fn leading_index(&self, attnum: i32) -> Result<pg_sys::Relation> {
        let indexes = pg_sys::RelationGetIndexList(self.rel);
        let mut found = std::ptr::null_mut();
        if !indexes.is_null() {
            for i in 0..(*indexes).length {
                let oid = pg_sys::list_nth_oid(indexes, i);
                let index = pg_sys::index_open(oid, pg_sys::AccessShareLock as pg_sys::LOCKMODE);
                let form = &*(*index).rd_index;
                // an expression's column number is 0, never a column's; a partial index
                // would not hold every row
                let leads = form.indnatts >= 1
                    && form.indisunique
                    && form.indisvalid
                    && form.indkey.values.as_slice(1)[0] as i32 == attnum
                    && (*(*index).rd_rel).relam == pg_sys::BTREE_AM_OID
                    && pg_sys::heap_attisnull(
                        (*index).rd_indextuple,
                        pg_sys::Anum_pg_index_indpred as i32,
                        std::ptr::null_mut(),
                    );
                if leads {
                    found = index;
                    break;
                }
                pg_sys::index_close(index, pg_sys::AccessShareLock as pg_sys::LOCKMODE);
            }
            pg_sys::list_free(indexes);
        }
        if found.is_null() {
            return Err(BatchError::TableLayout {
                table: self.name.to_string(),
                column: format!("{} (no unique index it leads)", self.column_name(attnum)),
            });
        }
        Ok(found)
    }

    fn column_name(&self, attnum: i32) -> String {
        // SAFETY: the relation is open.
        let desc = unsafe { pgrx::tupdesc::PgTupleDesc::from_pg_unchecked(self.desc()) };
        desc.get(attnum as usize - 1)
            .map_or_else(|| "?".to_string(), |a| a.name().to_string())
    }

    /// Locks the row whose key column `column` equals `key`, as `SELECT ... WHERE column
    /// = key FOR UPDATE` (`SKIP LOCKED` unless `wait`) would, and reads its latest
    /// version with `read`: a row another transaction changed while this one waited is
    /// read as that one committed it.
    pub fn lock_by_key<R>(
        &self,
        column: &str,
        key: Key,
        wait: bool,
        read: impl FnOnce(&Fields) -> Result<R>,
    ) -> Result<Lock<R>> {
        let found = self.first(column, Compare::Equal, key, |row| {
            // SAFETY: the slot holds the row
            Ok(Tid(unsafe { (*row.tuple).t_self }))
        })?;
        match found {
            Some(at) => self.lock_at(at, wait, read),
            None => Ok(Lock::Missing),
        }
    }

    /// Locks the row whose version this snapshot sees at `at` (FOR UPDATE, SKIP LOCKED
    /// unless `wait`), and reads its latest version with `read`.
    pub fn lock_at<R>(
        &self,
        at: Tid,
        wait: bool,
        read: impl FnOnce(&Fields) -> Result<R>,
    ) -> Result<Lock<R>> {
        let mut tid = at.0;
        // SAFETY: the row's lock taken as ExecLockRows takes it: in READ COMMITTED the
        // latest version of the row (its update chain followed), in REPEATABLE READ and
        // SERIALIZABLE the version this transaction's snapshot sees, or a serialization
        // failure. The slot is dropped before returning.
        unsafe {
            let slot = pg_sys::table_slot_create(self.rel, std::ptr::null_mut());
            let repeatable = pg_sys::XactIsoLevel >= pg_sys::XACT_REPEATABLE_READ as i32;
            let flags = if repeatable {
                0
            } else {
                pg_sys::TUPLE_LOCK_FLAG_FIND_LAST_VERSION as u8
            };
            let mut failure = pg_sys::TM_FailureData::default();
            let outcome = pg_sys::table_tuple_lock(
                self.rel,
                &mut tid,
                self.snapshot,
                slot,
                pg_sys::GetCurrentCommandId(true),
                pg_sys::LockTupleMode::LockTupleExclusive,
                if wait {
                    pg_sys::LockWaitPolicy::LockWaitBlock
                } else {
                    pg_sys::LockWaitPolicy::LockWaitSkip
                },
                flags,
                &mut failure,
            );
            let result = match outcome {
                pg_sys::TM_Result::TM_Ok => {
                    let mut free = false;
                    let tuple = pg_sys::ExecFetchSlotHeapTuple(slot, false, &mut free);
                    let at = Tid((*tuple).t_self);
                    read(&Fields { table: self, tuple }).map(|row| Lock::Row(row, at))
                }
                pg_sys::TM_Result::TM_WouldBlock => Ok(Lock::HeldByAnother),
                pg_sys::TM_Result::TM_Deleted => Ok(Lock::Missing),
                pg_sys::TM_Result::TM_Updated if repeatable => {
                    Err(BatchError::SerializationFailure)
                }
                other => Err(BatchError::Internal(format!(
                    "locking a row of etc_batch.{} returned {other}",
                    self.name
                ))),
            };
            pg_sys::ExecDropSingleTupleTableSlot(slot);
            result
        }
    }

    /// Changes the row this transaction locked at `at` (lock_by_key, lock_at), whose key
    /// column `column` is `key`, as `UPDATE ... WHERE column = key` would: `change` reads
    /// the row as it is now and returns the new values of the columns it changes (None
    /// for NULL), with what the caller wants to know of it. The row is read at `at`
    /// unless a statement of this transaction has changed it since; then found again by
    /// its key. No other transaction can have changed it: the caller holds its lock.
    ///
    /// The new version is written in place, without a statement; where the table has a
    /// trigger an UPDATE would fire (a DBA's, since etc_batch puts none there), the same
    /// changes are written by an UPDATE built from them, so that it fires. None: there is
    /// no such row.
    pub fn update_locked<R>(
        &self,
        at: Tid,
        column: &str,
        key: Key,
        change: impl FnOnce(&Fields) -> Result<(Vec<Change>, R)>,
    ) -> Result<Option<R>> {
        let mut change = Some(change);
        let mut read = |row: &Fields| {
            // SAFETY: a copy of the row, which outlives the slot it was read from
            let old = unsafe { pg_sys::heap_copytuple(row.tuple) };
            let (changes, result) = (change.take().expect("one row is read"))(row)?;
            Ok((old, changes, result))
        };
        // SAFETY: the version at `at` is fetched into a slot of the open table if this
        // snapshot sees it (no later version of this transaction hides it), read, and the
        // slot dropped before anything is written.
        let at_tid = unsafe {
            let slot = pg_sys::table_slot_create(self.rel, std::ptr::null_mut());
            let mut tid = at.0;
            let found =
                if pg_sys::table_tuple_fetch_row_version(self.rel, &mut tid, self.snapshot, slot) {
                    let mut free = false;
                    let tuple = pg_sys::ExecFetchSlotHeapTuple(slot, false, &mut free);
                    Some(read(&Fields { table: self, tuple }))
                } else {
                    None
                };
            pg_sys::ExecDropSingleTupleTableSlot(slot);
            found.transpose()?
        };
        let found = match at_tid {
            Some(found) => Some(found),
            None => self.first(column, Compare::Equal, key, &mut read)?,
        };
        let Some((old, changes, result)) = found else {
            return Ok(None);
        };
        if self.fires_on_update() {
            self.update_statement(column, key, &changes)?;
        } else {
            // SAFETY: `old` is a copy of the row's latest version, which the caller's lock
            // keeps latest
            unsafe { self.write_new_version(old, changes)? };
        }
        Ok(Some(result))
    }

    /// `changes` written to the row whose `column` is `key` by an UPDATE statement, built
    /// from them, with every value bound as a parameter of its column's type.
    fn update_statement(&self, column: &str, key: Key, changes: &[Change]) -> Result<()> {
        let mut sets = Vec::with_capacity(changes.len());
        let mut args = Vec::with_capacity(changes.len() + 1);
        for (i, (name, value)) in changes.iter().enumerate() {
            // a domain's base type: the value was made as one
            // SAFETY: a catalog lookup of a type the open table has
            let type_oid = unsafe { pg_sys::getBaseType(self.attribute(name)?.type_oid) };
            sets.push(format!(
                "{} = ${}",
                pgrx::spi::quote_identifier(name),
                i + 1
            ));
            args.push(match value {
                // SAFETY: a datum `change` made for a column of this type
                Some(datum) => unsafe { DatumWithOid::new(*datum, type_oid) },
                None => DatumWithOid::null_oid(type_oid),
            });
        }
        let (_, _, key_datum) = key.scan(Compare::Equal);
        // SAFETY: the key's datum, of the key's type
        args.push(unsafe { DatumWithOid::new(key_datum, key.type_oid()) });
        let sql = format!(
            "UPDATE etc_batch.{} SET {} WHERE {} OPERATOR(pg_catalog.=) ${}",
            pgrx::spi::quote_identifier(self.name),
            sets.join(", "),
            pgrx::spi::quote_identifier(column),
            args.len()
        );
        query::run(&sql, &args)
    }

    /// Writes the new version of row `old` with `changes`, in its place.
    ///
    /// # Safety
    /// `old` is a copy of the latest version of a row of this table that the
    /// transaction holds the lock of.
    unsafe fn write_new_version(&self, old: pg_sys::HeapTuple, changes: Vec<Change>) -> Result<()> {
        let mut columns = Vec::with_capacity(changes.len());
        let mut values = Vec::with_capacity(changes.len());
        let mut nulls = Vec::with_capacity(changes.len());
        for (name, value) in changes {
            columns.push(self.attribute(name)?.attnum);
            values.push(value.unwrap_or(pg_sys::Datum::from(0)));
            nulls.push(value.is_none());
        }
        // the new version written in its place as the caller's row lock allows; its index
        // entries follow unless it was HOT
        let new = pg_sys::heap_modify_tuple_by_cols(
            old,
            self.desc(),
            columns.len() as i32,
            columns.as_mut_ptr(),
            values.as_mut_ptr(),
            nulls.as_mut_ptr(),
        );
        if let Some(only_summarizing) = heap_update(self.rel, old, new) {
            index_new_version(self.rel, new, only_summarizing);
        }
        Ok(())
    }
}

/// A column's new value, None for NULL.
pub type Change = (&'static str, Option<pg_sys::Datum>);

/// index_beginscan, which PostgreSQL 18 gave an argument for instrumentation.
///
/// # Safety
/// As index_beginscan: both relations open, the snapshot registered.
unsafe fn begin_index_scan(
    heap: pg_sys::Relation,
    index: pg_sys::Relation,
    snapshot: pg_sys::Snapshot,
) -> pg_sys::IndexScanDesc {
    #[cfg(not(feature = "pg18"))]
    {
        pg_sys::index_beginscan(heap, index, snapshot, 1, 0)
    }
    #[cfg(feature = "pg18")]
    {
        pg_sys::index_beginscan(heap, index, snapshot, std::ptr::null_mut(), 1, 0)
    }
}

/// simple_heap_update; returns whether the indexes need entries for the new version, and
/// if so whether only the summarizing ones (PostgreSQL 16 on; 15 tells HOT or not).
///
/// # Safety
/// `old` is the latest version of a row of `rel` that no other transaction can update.
unsafe fn heap_update(
    rel: pg_sys::Relation,
    old: pg_sys::HeapTuple,
    new: pg_sys::HeapTuple,
) -> Option<bool> {
    #[cfg(feature = "pg15")]
    {
        pg_sys::simple_heap_update(rel, &mut (*old).t_self, new);
        if pg_sys::HeapTupleHeaderIsHeapOnly((*new).t_data) {
            None
        } else {
            Some(false)
        }
    }
    #[cfg(not(feature = "pg15"))]
    {
        let mut update = pg_sys::TU_UpdateIndexes::TU_None;
        pg_sys::simple_heap_update(rel, &mut (*old).t_self, new, &mut update);
        match update {
            pg_sys::TU_UpdateIndexes::TU_None => None,
            pg_sys::TU_UpdateIndexes::TU_Summarizing => Some(true),
            _ => Some(false),
        }
    }
}

/// Index entries for a new row version that was not a HOT update.
///
/// # Safety
/// `new` was just written into `rel` by heap_update.
unsafe fn index_new_version(rel: pg_sys::Relation, new: pg_sys::HeapTuple, only_summarizing: bool) {
    let estate = pg_sys::CreateExecutorState();
    let result_rel =
        pg_sys::palloc0(std::mem::size_of::<pg_sys::ResultRelInfo>()) as *mut pg_sys::ResultRelInfo;
    pg_sys::InitResultRelInfo(result_rel, rel, 0, std::ptr::null_mut(), 0);
    pg_sys::ExecOpenIndices(result_rel, false);
    let slot = pg_sys::MakeSingleTupleTableSlot((*rel).rd_att, &pg_sys::TTSOpsHeapTuple);
    pg_sys::ExecStoreHeapTuple(new, slot, false);
    (*slot).tts_tableOid = (*rel).rd_id;
    insert_index_tuples(result_rel, slot, estate, only_summarizing);
    pg_sys::ExecDropSingleTupleTableSlot(slot);
    pg_sys::ExecCloseIndices(result_rel);
    pg_sys::FreeExecutorState(estate);
}

/// The next value of sequence `sequence`, as nextval() gives it.
pub fn nextval(sequence: pg_sys::Oid) -> i64 {
    // SAFETY: nextval(regclass) takes the sequence's OID and returns an int8 datum; it
    // raises an ERROR (a missing sequence, a privilege) as nextval() would.
    let datum = unsafe {
        pg_sys::OidFunctionCall1Coll(
            pg_sys::Oid::from(pg_sys::F_NEXTVAL),
            pg_sys::InvalidOid,
            pg_sys::Datum::from(sequence.to_u32()),
        )
    };
    datum.value() as i64
}
