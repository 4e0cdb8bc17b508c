//! The statements etc_batch sends for itself, and how their rows are read.
//!
//! Each call connects SPI, runs one statement read-write (so SPI takes a fresh snapshot
//! for it, which matters right after a COMMIT, when no snapshot is active; a reader that
//! needs several statements to see one state runs them in_callers_snapshot), copies out
//! what it needs and disconnects: nothing from SPI outlives the call, so a COMMIT may
//! follow.
//!
//! Reads go through `row` rather than pgrx's `SpiClient::update`, which asks for a
//! transaction id before every statement. A runner that waits for a step's or a job's
//! row lock would then hold an xid older than the one it waits for, and audit txids
//! would not follow the order in which steps and chunks commit; a reader would burn an
//! xid for nothing. Here an xid is assigned when something is written or locked, as in
//! plain SQL.

use crate::error::{BatchError, Result};
use pgrx::datum::{DatumWithOid, FromDatum, IntoDatum};
use pgrx::pg_sys;
use std::any::TypeId;
use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::CString;
use std::os::raw::c_char;
use std::rc::Rc;

/// One row of a statement run by `row`, read while SPI still holds it.
pub struct Row<'a> {
    tuple: pg_sys::HeapTuple,
    result: &'a Columns,
}

/// What is learned of a statement's result once rather than once per row (a chunk's
/// change returns a row per item): the base type of each column (a domain reads as its
/// base type) and, for each reader (`row_reader!`) of its rows, the column of each of
/// the reader's fields.
struct Columns {
    desc: pg_sys::TupleDesc,
    types: Vec<pg_sys::Oid>,
    readers: RefCell<Vec<(TypeId, Rc<[usize]>)>>,
}

impl Columns {
    /// # Safety
    /// `desc` must be the tuple descriptor of an SPI result that is still held.
    unsafe fn of(desc: pg_sys::TupleDesc) -> Columns {
        Columns {
            desc,
            types: (1..=(*desc).natts)
                .map(|column| pg_sys::getBaseType(pg_sys::SPI_gettypeid(desc, column)))
                .collect(),
            readers: RefCell::new(Vec::new()),
        }
    }

    /// The name of each column, in order.
    fn names(&self) -> Vec<&[u8]> {
        (0..self.types.len())
            .map(|i| {
                // SAFETY: the descriptor is held (see `of`) for as long as self, and has
                // this attribute, whose name is a NUL-terminated NameData.
                unsafe {
                    attribute(self.desc, i, |a| {
                        std::ffi::CStr::from_ptr(a.attname.data.as_ptr()).to_bytes()
                    })
                }
            })
            .collect()
    }
}

/// The column number (1-based) of each of `fields` among a result's `columns`, found by
/// name; the error names a field that no column, or more than one, is named for.
fn column_numbers(columns: &[impl AsRef<[u8]>], fields: &[&str]) -> Result<Rc<[usize]>> {
    fields
        .iter()
        .map(|field| {
            let mut named =
                (1..=columns.len()).filter(|&n| columns[n - 1].as_ref() == field.as_bytes());
            match (named.next(), named.next()) {
                (Some(n), None) => Ok(n),
                (None, _) => Err(BatchError::Internal(format!(
                    "a result has no column \"{field}\""
                ))),
                (Some(_), Some(_)) => Err(BatchError::Internal(format!(
                    "a result has more than one column \"{field}\""
                ))),
            }
        })
        .collect()
}

impl Row<'_> {
    /// Column `n` (1-based) as an opaque value, copied into the memory context that was
    /// current before the statement ran, so that it outlives SPI_finish.
    pub fn opaque(&self, n: usize) -> Result<Option<Opaque>> {
        let desc = self.result.desc;
        // SAFETY: as in get; SPI_datumTransfer copies into the context SPI_connect saved.
        unsafe {
            let column = n as i32;
            let oid = pg_sys::SPI_gettypeid(desc, column);
            let mut is_null = false;
            let datum = pg_sys::SPI_getbinval(self.tuple, desc, column, &mut is_null);
            if is_null {
                return Ok(None);
            }
            let (byval, len) = attribute(desc, n - 1, |a| (a.attbyval, a.attlen));
            let datum = pg_sys::SPI_datumTransfer(datum, byval, len as i32);
            Ok(Some(Opaque { datum, oid }))
        }
    }

    /// Column `n` (1-based), copied out as a Rust value of a compatible type.
    pub fn get<T: FromDatum + IntoDatum>(&self, n: usize) -> Result<Option<T>> {
        self.value(n, || format!("column {n}"))
    }

    /// Column `n` (1-based), which a reader's field `name` was found to be (`columns`),
    /// as that field's type.
    pub fn named<T: FromDatum + IntoDatum>(&self, n: usize, name: &str) -> Result<Option<T>> {
        self.value(n, || format!("column \"{name}\""))
    }

    /// Column `n`; `column` names it in an error.
    fn value<T: FromDatum + IntoDatum>(
        &self,
        n: usize,
        column: impl FnOnce() -> String,
    ) -> Result<Option<T>> {
        let Some(&type_oid) = n.checked_sub(1).and_then(|i| self.result.types.get(i)) else {
            return Err(BatchError::Internal(format!(
                "a result has no {}",
                column()
            )));
        };
        // SAFETY: tuple and desc come from SPI_tuptable of the statement just run, and
        // rows are read before SPI_finish frees them; the column exists.
        unsafe {
            if !T::is_compatible_with(type_oid) {
                return Err(BatchError::Internal(format!(
                    "{} has type oid {}, which {} cannot hold",
                    column(),
                    type_oid.to_u32(),
                    std::any::type_name::<T>()
                )));
            }
            let mut is_null = false;
            let datum = pg_sys::heap_getattr(self.tuple, n as i32, self.result.desc, &mut is_null);
            Ok(T::from_polymorphic_datum(datum, is_null, type_oid))
        }
    }

    /// The column number of each of `fields`, reader `R`'s, found by name on the first
    /// row of the result that `R` reads and kept for the others.
    pub fn columns<R: 'static>(&self, fields: &[&str]) -> Result<Rc<[usize]>> {
        let reader = TypeId::of::<R>();
        let kept = self
            .result
            .readers
            .borrow()
            .iter()
            .find(|(r, _)| *r == reader)
            .map(|(_, at)| at.clone());
        if let Some(at) = kept {
            return Ok(at);
        }
        let at = column_numbers(&self.result.names(), fields)?;
        self.result.readers.borrow_mut().push((reader, at.clone()));
        Ok(at)
    }
}

/// Declares a struct whose fields are read from the columns of a statement's row, each
/// from the column of its own name (the statement names its columns so, with AS), and
/// its `read(row)`. A field is `Option<T>` where the column may be NULL, or `T = value`
/// to read NULL as `value`. A column missing, or of a type the field cannot hold, is an
/// internal error that names it. Columns are found by name once per result, not per row.
///
/// ```ignore
/// query::row_reader! {
///     struct Lease {
///         holder: String = String::new(),
///         expires_at: Option<TimestampWithTimeZone>,
///     }
/// }
/// query::row(sql::LEASE, &[name.into()], Lease::read)
/// ```
macro_rules! row_reader {
    (
        $(#[$doc:meta])*
        $vis:vis struct $name:ident {
            $($(#[$field_doc:meta])* $field_vis:vis $field:ident: $type:ty $(= $default:expr)?),+ $(,)?
        }
    ) => {
        $(#[$doc])*
        $vis struct $name {
            $($(#[$field_doc])* $field_vis $field: $type,)+
        }

        impl $name {
            $vis fn read(row: &$crate::query::Row<'_>) -> $crate::error::Result<Self> {
                const FIELDS: &[&str] = &[$(stringify!($field)),+];
                let at = row.columns::<Self>(FIELDS)?;
                let mut at = at.iter().zip(FIELDS);
                Ok(Self {
                    $($field: {
                        let (&n, name) = at.next().expect("a column for every field");
                        row.named(n, name)? $(.unwrap_or_else(|| $default))?
                    },)+
                })
            }
        }
    };
}
pub(crate) use row_reader;

/// Reads attribute `i` (0-based) of a tuple descriptor. The one place that knows how a
/// descriptor lays out its attributes, which PostgreSQL 18 changed; pgrx's PgTupleDesc
/// reads it the same way on every version.
///
/// # Safety
/// `desc` must be a valid tuple descriptor with more than `i` attributes.
pub(crate) unsafe fn attribute<R>(
    desc: pg_sys::TupleDesc,
    i: usize,
    read: impl FnOnce(&pg_sys::FormData_pg_attribute) -> R,
) -> R {
    let desc = pgrx::tupdesc::PgTupleDesc::from_pg_unchecked(desc);
    read(desc.get(i).expect("the attribute exists"))
}

thread_local! {
    /// Plans of the statements etc_batch sends, prepared once per backend and kept.
    /// PostgreSQL revalidates a kept plan before each use, so a dropped and recreated
    /// table or a changed search_path never runs a stale one.
    static PLANS: RefCell<HashMap<String, Vec<KeptPlan>>> = RefCell::new(HashMap::new());
}

/// A kept plan, with the types of the parameters it was prepared for and how it plans.
type KeptPlan = (Vec<pg_sys::Oid>, Planning, SendPlan);

/// How a kept statement is planned.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Planning {
    /// Once, for any values: the statements run once per step or chunk, whose plan does
    /// not depend on the values bound.
    Generic,
    /// For the values bound, each time it runs (its parse and analysis kept): a
    /// statement whose best plan does depend on them, when planning costs little next to
    /// running it.
    ForTheValues,
}

/// A kept SPI plan; only ever used by the backend's one thread.
#[derive(Clone, Copy)]
struct SendPlan(pg_sys::SPIPlanPtr);

/// Kept plans beyond this are dropped (all of them), so a backend that drains thousands of
/// different jobs does not keep thousands of plans.
const MAX_PLANS: usize = 256;

thread_local! {
    /// How many of etc_batch's statements are running right now, one inside another (a
    /// handler or a trigger that calls etc_batch while a chunk's statement runs). Kept
    /// plans are freed only when none is: one of them may be the plan that is running.
    static RUNNING: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
}

/// Counts a running statement for as long as it lives, errors included (a PostgreSQL
/// error unwinds through it).
struct Running;

impl Running {
    fn start() -> Running {
        RUNNING.with(|r| r.set(r.get() + 1));
        Running
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        RUNNING.with(|r| r.set(r.get() - 1));
    }
}

/// The kept plan for `sql` with these argument types, prepared on first use.
/// Must be called while SPI is connected.
unsafe fn plan_for(
    sql: &str,
    types: &mut [pg_sys::Oid],
    planning: Planning,
) -> Result<pg_sys::SPIPlanPtr> {
    // Looked up by the statement's text without copying it: this runs for every
    // statement of every step and chunk.
    let kept = PLANS.with(|p| {
        p.borrow().get(sql).and_then(|plans| {
            plans
                .iter()
                .find(|(t, p, _)| t.as_slice() == &types[..] && *p == planning)
                .map(|(_, _, plan)| *plan)
        })
    });
    if let Some(plan) = kept {
        return Ok(plan.0);
    }
    let text = CString::new(sql)
        .map_err(|_| BatchError::Internal("a statement contains a zero byte".into()))?;
    let options = match planning {
        Planning::Generic => pg_sys::CURSOR_OPT_GENERIC_PLAN,
        Planning::ForTheValues => pg_sys::CURSOR_OPT_CUSTOM_PLAN,
    };
    let plan = pg_sys::SPI_prepare_cursor(
        text.as_ptr(),
        types.len() as i32,
        types.as_mut_ptr(),
        options as i32,
    );
    if plan.is_null() {
        let code = pg_sys::SPI_result;
        return Err(BatchError::Internal(format!(
            "SPI_prepare failed with {code}"
        )));
    }
    pg_sys::SPI_keepplan(plan);
    PLANS.with(|p| {
        let mut plans = p.borrow_mut();
        if plans.len() >= MAX_PLANS && RUNNING.with(|r| r.get()) == 0 {
            for (_, kept) in plans.drain() {
                for (_, _, old) in kept {
                    pg_sys::SPI_freeplan(old.0);
                }
            }
        }
        plans
            .entry(sql.to_string())
            .or_default()
            .push((types.to_vec(), planning, SendPlan(plan)));
    });
    Ok(plan)
}

/// A value read from one statement and handed to another as it is, without turning it
/// into a Rust value and back: values read once and bound in every chunk.
pub struct Opaque {
    datum: pg_sys::Datum,
    oid: pg_sys::Oid,
}

impl Opaque {
    /// A varlena value of type `oid` (an array, text), as one flat copy in the current
    /// memory context: compressed or kept out of line, it is read once here and not again
    /// by every statement it is bound to.
    ///
    /// # Safety
    /// `datum` is a live varlena value of type `oid`.
    pub unsafe fn flat_copy(datum: pg_sys::Datum, oid: pg_sys::Oid) -> Opaque {
        let copy = pg_sys::pg_detoast_datum_copy(datum.cast_mut_ptr());
        Opaque {
            datum: pg_sys::Datum::from(copy),
            oid,
        }
    }

    pub fn datum(&self) -> pg_sys::Datum {
        self.datum
    }

    pub fn arg(&self) -> DatumWithOid<'static> {
        // SAFETY: the datum was copied out of SPI into the memory context that was current
        // when the statement ran (see Row::opaque), and holds a value of type `oid`.
        unsafe { DatumWithOid::new(self.datum, self.oid) }
    }
}

/// Runs `work` with sequential scans priced out (enable_seqscan off), for etc_batch's
/// probes of a job's own tables, planned once and kept: their plans must not depend on
/// statistics. A table analyzed while empty makes a scan look cheapest, and a kept plan
/// would go on scanning as the table grows: every chunk would read the whole audit
/// before it. Both the planning and the run are inside, so a plan made again after an
/// invalidation is made the same way.
pub fn by_index<R>(work: impl FnOnce() -> R) -> R {
    crate::settings::with(&[(c"enable_seqscan", "off")], work)
}

/// `text` read as a value of type `type_oid` by the type's input function, as a literal of
/// that type is read, into the current memory context.
pub fn typed(type_oid: pg_sys::Oid, text: &str) -> Result<Opaque> {
    let text = CString::new(text)
        .map_err(|_| BatchError::Internal("a value contains a zero byte".into()))?;
    // SAFETY: looks the type up and calls its input function; bad input raises an ERROR.
    unsafe {
        let mut input = pg_sys::Oid::INVALID;
        let mut io_param = pg_sys::Oid::INVALID;
        pg_sys::getTypeInputInfo(type_oid, &mut input, &mut io_param);
        let datum = pg_sys::OidInputFunctionCall(input, text.as_ptr() as *mut c_char, io_param, -1);
        Ok(Opaque {
            datum,
            oid: type_oid,
        })
    }
}

/// Bound parameters as SPI takes them: their types, their values, and ' ' or 'n' for
/// each (not NULL, NULL).
struct SpiArgs {
    types: Vec<pg_sys::Oid>,
    values: Vec<pg_sys::Datum>,
    nulls: Vec<c_char>,
}

impl SpiArgs {
    fn of(args: &[DatumWithOid]) -> SpiArgs {
        SpiArgs {
            types: args.iter().map(|a| a.oid()).collect(),
            values: args
                .iter()
                .map(|a| {
                    a.datum()
                        .map(|d| d.sans_lifetime())
                        .unwrap_or(pg_sys::Datum::from(0usize))
                })
                .collect(),
            nulls: args
                .iter()
                .map(|a| (if a.datum().is_some() { b' ' } else { b'n' }) as c_char)
                .collect(),
        }
    }
}

/// Every row of the result SPI holds now, read with `read`.
///
/// # Safety
/// SPI is connected, and SPI_tuptable is the result of its last statement (or NULL).
unsafe fn read_result<R>(mut read: impl FnMut(&Row) -> Result<R>) -> Result<Vec<R>> {
    if pg_sys::SPI_tuptable.is_null() {
        return Ok(Vec::new());
    }
    let table = &*pg_sys::SPI_tuptable;
    let result = Columns::of(table.tupdesc);
    (0..pg_sys::SPI_processed as usize)
        .map(|i| {
            read(&Row {
                tuple: *table.vals.add(i),
                result: &result,
            })
        })
        .collect()
}

thread_local! {
    /// Whether statements run read-only, in the snapshot of the query that called
    /// etc_batch, rather than each in a fresh one (see in_callers_snapshot).
    static IN_CALLERS_SNAPSHOT: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Runs `work` with etc_batch's statements read-only, in the snapshot of the query that
/// called it (SPI's read_only), so that several of them see one state, as one statement
/// would: for a function called from a query, which reads and writes nothing else.
pub fn in_callers_snapshot<R>(work: impl FnOnce() -> R) -> R {
    struct Restore(bool);
    impl Drop for Restore {
        fn drop(&mut self) {
            IN_CALLERS_SNAPSHOT.with(|r| r.set(self.0));
        }
    }
    let _restore = Restore(IN_CALLERS_SNAPSHOT.with(|r| r.replace(true)));
    work()
}

/// Runs `sql` and reads every row it returns with `read` (at most `limit`, 0 = all).
pub fn rows<R>(
    sql: &str,
    args: &[DatumWithOid],
    limit: i64,
    read: impl FnMut(&Row) -> Result<R>,
) -> Result<Vec<R>> {
    rows_planned(sql, args, Planning::Generic, limit, read)
}

/// `rows`, with its plan made as `planning` says.
pub fn rows_planned<R>(
    sql: &str,
    args: &[DatumWithOid],
    planning: Planning,
    limit: i64,
    read: impl FnMut(&Row) -> Result<R>,
) -> Result<Vec<R>> {
    let mut args = SpiArgs::of(args);
    // SAFETY: a plain atomic SPI connection, finished before returning. An error raised
    // by PostgreSQL unwinds through pgrx's guard, and the transaction's (or the
    // subtransaction's) abort pops the connection.
    unsafe {
        pg_sys::SPI_connect();
        let plan = match plan_for(sql, &mut args.types, planning) {
            Ok(plan) => plan,
            Err(e) => {
                pg_sys::SPI_finish();
                return Err(e);
            }
        };
        let running = Running::start();
        let rc = pg_sys::SPI_execute_plan(
            plan,
            args.values.as_mut_ptr(),
            args.nulls.as_ptr(),
            IN_CALLERS_SNAPSHOT.with(|r| r.get()),
            limit,
        );
        drop(running);
        let result = if rc < 0 {
            Err(BatchError::Internal(format!(
                "SPI_execute_plan returned {rc}"
            )))
        } else {
            read_result(read)
        };
        pg_sys::SPI_finish();
        result
    }
}

/// Reads the first row with `read`, or `None` when the statement returned no row.
pub fn row<R>(
    sql: &str,
    args: &[DatumWithOid],
    read: impl FnOnce(&Row) -> Result<R>,
) -> Result<Option<R>> {
    let mut read = Some(read);
    Ok(rows(sql, args, 1, |r| (read.take().expect("one row"))(r))?.pop())
}

/// The first column of the first row, or `None` when there is no row (or it is NULL).
pub fn one<T: FromDatum + IntoDatum>(sql: &str, args: &[DatumWithOid]) -> Result<Option<T>> {
    row(sql, args, |row| row.get::<T>(1)).map(Option::flatten)
}

/// Runs a statement for its effect.
pub fn run(sql: &str, args: &[DatumWithOid]) -> Result<()> {
    rows(sql, args, 0, |_| Ok(())).map(|_| ())
}

/// Runs SQL text as written (one statement or several, no parameters), planned for this
/// one run and never cached: a chain step's command. Unlike pgrx's `Spi::run`, it asks
/// for no transaction id first (see the top of this file): a step that only reads, or
/// calls a function that writes nothing, costs its subtransaction no xid.
pub fn run_text(sql: &str) -> Result<()> {
    let text = CString::new(sql)
        .map_err(|_| BatchError::Internal("a statement contains a zero byte".into()))?;
    // SAFETY: a plain atomic SPI connection, finished before returning; an error raised
    // by PostgreSQL unwinds through pgrx's guard, and the (sub)transaction's abort pops
    // the connection.
    let rc = unsafe {
        pg_sys::SPI_connect();
        let rc = pg_sys::SPI_execute(text.as_ptr(), false, 0);
        pg_sys::SPI_finish();
        rc
    };
    // a statement SPI refuses (COMMIT, COPY to the client) comes back as a code
    pgrx::spi::Spi::check_status(rc)
        .map(|_| ())
        .map_err(BatchError::from)
}

/// A column of a statement's result, as `describe` finds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResultColumn {
    pub name: String,
    pub type_oid: pg_sys::Oid,
    pub typmod: i32,
}

/// The columns `sql` returns, read from its result without fetching a row (the caller
/// makes it return none, with LIMIT 0). It runs as the current user, so a privilege the
/// user lacks fails here.
pub fn describe(sql: &str) -> Result<Vec<ResultColumn>> {
    let text = CString::new(sql)
        .map_err(|_| BatchError::Internal("a statement contains a zero byte".into()))?;
    // SAFETY: a plain atomic SPI connection, finished before returning; the tuple
    // descriptor is read before SPI_finish frees it.
    unsafe {
        pg_sys::SPI_connect();
        let rc = pg_sys::SPI_execute(text.as_ptr(), false, 0);
        let out = if rc < 0 || pg_sys::SPI_tuptable.is_null() {
            Err(BatchError::Internal(format!("SPI_execute returned {rc}")))
        } else {
            let desc = (*pg_sys::SPI_tuptable).tupdesc;
            let natts = (*desc).natts as usize;
            Ok((0..natts)
                .map(|i| {
                    attribute(desc, i, |a| ResultColumn {
                        name: std::ffi::CStr::from_ptr(a.attname.data.as_ptr())
                            .to_string_lossy()
                            .into_owned(),
                        type_oid: a.atttypid,
                        typmod: a.atttypmod,
                    })
                })
                .collect())
        };
        pg_sys::SPI_finish();
        out
    }
}

/// What a statement is, as PostgreSQL parses and analyzes it, without running it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shape {
    /// A plain SELECT: no INSERT, UPDATE, DELETE or MERGE, not in a WITH either, and no
    /// FOR UPDATE or FOR SHARE.
    pub reads_only: bool,
    /// The types of the columns it returns (the last statement's).
    pub columns: Vec<pg_sys::Oid>,
    /// How many statements it is.
    pub statements: usize,
}

/// The shape of `sql`, prepared as the current user with the current search_path: a
/// statement that does not parse, names what does not exist or what the user may not
/// read fails here with PostgreSQL's own error.
pub fn shape(sql: &str) -> Result<Shape> {
    let text = CString::new(sql)
        .map_err(|_| BatchError::Internal("a statement contains a zero byte".into()))?;
    // SAFETY: a plain atomic SPI connection, finished before returning; the plan's
    // sources and their analyzed queries are read before the plan is freed.
    unsafe {
        pg_sys::SPI_connect();
        let plan = pg_sys::SPI_prepare(text.as_ptr(), 0, std::ptr::null_mut());
        if plan.is_null() {
            pg_sys::SPI_finish();
            return Err(BatchError::Internal(format!(
                "SPI_prepare returned {}",
                std::ptr::addr_of!(pg_sys::SPI_result).read()
            )));
        }
        let sources = list_pointers(pg_sys::SPI_plan_get_plan_sources(plan));
        let mut shape = Shape {
            reads_only: true,
            columns: Vec::new(),
            statements: sources.len(),
        };
        for source in sources {
            let source = source as *mut pg_sys::CachedPlanSource;
            for query in list_pointers((*source).query_list) {
                let query = query as *mut pg_sys::Query;
                if (*query).commandType != pg_sys::CmdType::CMD_SELECT
                    || (*query).hasModifyingCTE
                    || !(*query).rowMarks.is_null()
                    || !(*query).utilityStmt.is_null()
                {
                    shape.reads_only = false;
                }
            }
            let desc = (*source).resultDesc;
            if !desc.is_null() {
                shape.columns = (0..(*desc).natts as usize)
                    .map(|i| attribute(desc, i, |a| a.atttypid))
                    .collect();
            }
        }
        pg_sys::SPI_freeplan(plan);
        pg_sys::SPI_finish();
        Ok(shape)
    }
}

/// One expression over one table, as PostgreSQL analyzes `SELECT (<expression>) FROM ONLY
/// <table> AS <alias>` (set_expressions'): what it reads and calls, its type, and its text
/// as PostgreSQL prints it back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Expression {
    /// The statement is one SELECT of one value from the one table, and nothing else.
    pub one_value_of: Option<pg_sys::Oid>,
    pub has_subquery: bool,
    pub has_aggregate: bool,
    pub has_window_function: bool,
    pub returns_set: bool,
    pub volatile: bool,
    pub type_oid: pg_sys::Oid,
    /// The expression deparsed (ruleutils' deparse_expression) under the search_path
    /// `printed_with`, each column prefixed with the alias: every object the path does
    /// not find by its bare name comes out schema-qualified.
    pub text: String,
}

/// The analysis of `sql`, a `SELECT (<expression>) FROM ONLY <table> AS <alias>` with
/// `alias` the alias, prepared as the current user with the current search_path (a
/// column, function or type it names that does not exist, or that the user may not
/// read, fails here with PostgreSQL's own error), printed back under `printed_with`.
pub fn expression(sql: &str, alias: &std::ffi::CStr, printed_with: &str) -> Result<Expression> {
    let text = CString::new(sql)
        .map_err(|_| BatchError::Internal("a statement contains a zero byte".into()))?;
    // SAFETY: a plain atomic SPI connection, finished before returning; the plan's
    // sources and their analyzed queries are read, and the expression deparsed, before
    // the plan is freed. Every node is checked for its tag before it is read as one.
    unsafe {
        pg_sys::SPI_connect();
        let plan = pg_sys::SPI_prepare(text.as_ptr(), 0, std::ptr::null_mut());
        if plan.is_null() {
            pg_sys::SPI_finish();
            return Err(BatchError::Internal(format!(
                "SPI_prepare returned {}",
                std::ptr::addr_of!(pg_sys::SPI_result).read()
            )));
        }
        let queries: Vec<*mut pg_sys::Query> =
            list_pointers(pg_sys::SPI_plan_get_plan_sources(plan))
                .into_iter()
                .flat_map(|source| {
                    list_pointers((*(source as *mut pg_sys::CachedPlanSource)).query_list)
                })
                .map(|query| query as *mut pg_sys::Query)
                .collect();
        let mut analyzed = Expression {
            one_value_of: None,
            has_subquery: false,
            has_aggregate: false,
            has_window_function: false,
            returns_set: false,
            volatile: false,
            type_oid: pg_sys::Oid::INVALID,
            text: String::new(),
        };
        if let [query] = queries[..] {
            let q = &*query;
            let rtable = list_pointers(q.rtable);
            let targets: Vec<*mut pg_sys::TargetEntry> = list_pointers(q.targetList)
                .into_iter()
                .map(|t| t as *mut pg_sys::TargetEntry)
                .collect();
            let relation = match rtable[..] {
                [rte] => {
                    let rte = &*(rte as *mut pg_sys::RangeTblEntry);
                    (rte.rtekind == pg_sys::RTEKind::RTE_RELATION && !rte.inh).then_some(rte.relid)
                }
                _ => None,
            };
            let plain = q.commandType == pg_sys::CmdType::CMD_SELECT
                && q.utilityStmt.is_null()
                && q.cteList.is_null()
                && q.setOperations.is_null()
                && q.sortClause.is_null()
                && q.groupClause.is_null()
                && q.distinctClause.is_null()
                && q.havingQual.is_null()
                && q.limitCount.is_null()
                && q.limitOffset.is_null()
                && q.rowMarks.is_null()
                && !q.jointree.is_null()
                && (*q.jointree).quals.is_null()
                && list_pointers((*q.jointree).fromlist).len() == 1
                && targets.len() == 1
                && !(*targets[0]).resjunk;
            analyzed.has_subquery = q.hasSubLinks;
            analyzed.has_aggregate = q.hasAggs;
            analyzed.has_window_function = q.hasWindowFuncs;
            analyzed.returns_set = q.hasTargetSRFs;
            // printed back only when it could be kept: ruleutils cannot print a window
            // function without its window clause (PostgreSQL 18 raises XX000)
            let refused = q.hasSubLinks || q.hasAggs || q.hasWindowFuncs || q.hasTargetSRFs;
            if let (true, Some(relid)) = (plain, relation) {
                let expr = (*targets[0]).expr as *mut pg_sys::Node;
                analyzed.one_value_of = Some(relid);
                analyzed.volatile = pg_sys::contain_volatile_functions(expr);
                analyzed.type_oid = pg_sys::exprType(expr);
            }
            if let (true, Some(relid), false) = (plain, relation, refused) {
                let expr = (*targets[0]).expr as *mut pg_sys::Node;
                analyzed.text = crate::settings::with(&[(c"search_path", printed_with)], || {
                    let context = pg_sys::deparse_context_for(alias.as_ptr(), relid);
                    let printed = pg_sys::deparse_expression(expr, context, true, false);
                    std::ffi::CStr::from_ptr(printed)
                        .to_string_lossy()
                        .into_owned()
                });
            }
        }
        pg_sys::SPI_freeplan(plan);
        pg_sys::SPI_finish();
        Ok(analyzed)
    }
}

/// The pointers a List holds.
unsafe fn list_pointers(list: *mut pg_sys::List) -> Vec<*mut std::ffi::c_void> {
    if list.is_null() {
        return Vec::new();
    }
    (0..(*list).length as usize)
        .map(|i| (*(*list).elements.add(i)).ptr_value)
        .collect()
}

/// A cursor over the rows of one statement, fetched a batch at a time so that a
/// statement of any size is read in the memory of one batch. It runs in one snapshot,
/// the one it was opened with, and lives until it is closed or the transaction ends.
/// Functions the statement calls run as whoever fetches; privileges were checked, as
/// whoever opened it, when it was opened.
pub struct Cursor {
    name: CString,
}

impl Cursor {
    pub fn open(sql: &str, args: &[DatumWithOid]) -> Result<Cursor> {
        let text = CString::new(sql)
            .map_err(|_| BatchError::Internal("a statement contains a zero byte".into()))?;
        let mut args = SpiArgs::of(args);
        // SAFETY: an atomic SPI connection, finished before returning; the portal the
        // cursor opens copies the plan and the parameter values, and belongs to the
        // transaction, not to the connection.
        unsafe {
            pg_sys::SPI_connect();
            let plan = pg_sys::SPI_prepare(
                text.as_ptr(),
                args.types.len() as i32,
                args.types.as_mut_ptr(),
            );
            if plan.is_null() {
                let code = pg_sys::SPI_result;
                pg_sys::SPI_finish();
                return Err(BatchError::Internal(format!(
                    "SPI_prepare failed with {code}"
                )));
            }
            let portal = pg_sys::SPI_cursor_open(
                std::ptr::null(),
                plan,
                args.values.as_mut_ptr(),
                args.nulls.as_ptr(),
                false,
            );
            let name = std::ffi::CStr::from_ptr((*portal).name).to_owned();
            pg_sys::SPI_freeplan(plan);
            pg_sys::SPI_finish();
            Ok(Cursor { name })
        }
    }

    /// The next `count` rows (fewer at the end, none after it), read with `read`.
    pub fn fetch<R>(&self, count: i64, read: impl FnMut(&Row) -> Result<R>) -> Result<Vec<R>> {
        // SAFETY: as in `rows`; the portal is found by name, since SPI hands out no
        // pointer that outlives a connection.
        unsafe {
            pg_sys::SPI_connect();
            let portal = pg_sys::SPI_cursor_find(self.name.as_ptr());
            if portal.is_null() {
                pg_sys::SPI_finish();
                return Err(BatchError::Internal(
                    "a cursor vanished while it was read".into(),
                ));
            }
            pg_sys::SPI_cursor_fetch(portal, true, count as std::os::raw::c_long);
            let result = read_result(read);
            pg_sys::SPI_finish();
            result
        }
    }

    pub fn close(self) {
        // SAFETY: as in fetch.
        unsafe {
            pg_sys::SPI_connect();
            let portal = pg_sys::SPI_cursor_find(self.name.as_ptr());
            if !portal.is_null() {
                pg_sys::SPI_cursor_close(portal);
            }
            pg_sys::SPI_finish();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_are_found_by_name_in_any_order() {
        let columns = ["holder", "generation", "live"];
        assert_eq!(
            column_numbers(&columns, &["live", "holder"]).unwrap()[..],
            [3, 1]
        );
        assert!(column_numbers(&columns, &[]).unwrap().is_empty());
    }

    #[test]
    fn a_field_without_its_one_column_is_named() {
        let columns = ["holder", "?column?", "?column?"];
        assert_eq!(
            column_numbers(&columns, &["holder", "generation"]),
            Err(BatchError::Internal(
                "a result has no column \"generation\"".into()
            ))
        );
        assert_eq!(
            column_numbers(&columns, &["?column?"]),
            Err(BatchError::Internal(
                "a result has more than one column \"?column?\"".into()
            ))
        );
    }
}
