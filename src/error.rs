//! The one error type of etc_batch.
//!
//! Every error a user can see is a variant here, with its SQLSTATE, its message in
//! PostgreSQL's style (lower case, no period, names in double quotes), a detail that
//! states the facts, and a hint that says what to do. Callers branch on the SQLSTATE,
//! so it is the most specific one that fits, and all four are chosen together, in one
//! place: `BatchError::report`.

use pgrx::pg_sys::panic::ErrorReport;
use pgrx::prelude::*;
use pgrx::PgSqlErrorCode as Code;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BatchError {
    /// A procedure that commits was called where it cannot commit.
    AtomicContext {
        procedure: String,
        /// Inside BEGIN ... COMMIT, as a driver with autocommit off puts every statement.
        in_transaction_block: bool,
    },
    /// A routine that writes was called on a hot standby.
    OnStandby {
        routine: String,
        /// Where the primary is, as this standby's primary_conninfo names it.
        primary: Option<String>,
    },
    /// A chain whose steps would run it again.
    ChainRunsItself {
        batch: String,
        /// From the batch to itself: "a (step 3) → b (step 9) → a".
        path: String,
    },
    /// A step that commits, added by another role than the runner, for which no
    /// background worker connected as its author can be had.
    NoStepWorker {
        id: i64,
        batch: String,
        reason: String,
    },
    /// A required argument was NULL.
    NullArgument {
        argument: &'static str,
    },
    /// An argument has a value that is never valid.
    InvalidArgument {
        message: String,
        detail: Option<String>,
    },
    /// A step command that etc_batch will never be able to run as one step.
    InvalidCommand {
        detail: String,
    },
    /// SQL given as an argument (a step command, an items query) that does not parse.
    Syntax {
        what: &'static str,
        detail: String,
    },
    /// A value of one type where a column of another takes it.
    TypeMismatch {
        message: String,
        detail: String,
    },
    UnknownStep {
        id: i64,
    },
    UnknownBatch {
        batch: String,
    },
    /// run_chain of a chain nobody defined.
    UnknownChain {
        chain: String,
    },
    /// run_chain of a chain defined with no steps.
    EmptyChain {
        chain: String,
    },
    /// A run ended on purpose by abandon_run: it never runs again.
    RunAbandoned {
        chain: String,
        run_key: String,
        by: String,
        at: String,
    },
    UnknownRun {
        chain: String,
        run_key: String,
    },
    /// abandon_run of a run whose steps are all done.
    RunDone {
        chain: String,
        run_key: String,
        batch: String,
    },
    /// exec_batch_from_id of a step of a chain's definition, which never runs itself.
    DefinitionStep {
        id: i64,
        chain: String,
    },
    StepExists {
        id: i64,
        batch: String,
    },
    /// The chain reached a step that failed earlier and was not retried.
    StepFailed {
        id: i64,
        batch: String,
        attempts: i32,
        sqlstate: Option<String>,
        error: Option<String>,
    },
    /// `retry_step` on a step that is not failed.
    StepNotFailed {
        id: i64,
        status: String,
    },
    /// A step that was added by a role that no longer exists.
    StepOwnerMissing {
        id: i64,
        batch: String,
    },
    /// A relation named by OID that does not exist (a regclass given as a number).
    UnknownRelation {
        oid: u32,
    },
    /// A job's target that is gone: dropped, or dropped and made again (another OID).
    TargetGone {
        job: String,
        table: String,
    },
    /// A key that does not name one row: no unique index has only its columns.
    KeyNotUnique {
        table: String,
        key: String,
    },
    /// set_values or set_expressions (`argument`) naming a generated column.
    GeneratedColumn {
        column: String,
        argument: &'static str,
    },
    /// A job continued as another by register_remainder.
    JobContinued {
        job: String,
        successor: Option<String>,
    },
    /// A job reverted by register_revert: stopped for good, its committed items set back
    /// by another job.
    JobReverted {
        job: String,
        by: Option<String>,
    },
    /// A cancel ended the wait of a chunk's or a step's commit for the synchronous
    /// standbys: committed here, unconfirmed there (txn/sync_wait.rs).
    SyncWaitCanceled {
        /// What committed: `chunk 7 of job "x"`, `step 12 of batch "nightly"`.
        what: String,
        /// The call that goes on from there.
        again: String,
    },
    /// A function named by OID that does not exist (a regprocedure given as a number).
    UnknownFunction {
        oid: u32,
    },
    /// A handler job whose handler function was dropped.
    HandlerMissing {
        job: String,
    },
    /// A row locked in a REPEATABLE READ or SERIALIZABLE transaction had been changed
    /// since its snapshot, as SELECT ... FOR UPDATE reports it.
    SerializationFailure,
    /// One of etc_batch's tables whose columns are not the ones etc_batch writes into
    /// it (one was added, dropped or retyped by hand).
    TableLayout {
        table: String,
        column: String,
    },
    /// set_values sets a NOT NULL column to null: every chunk would fail.
    NotNullViolation {
        column: String,
    },
    /// set_values sets a column to a value a CHECK constraint on it alone refuses.
    CheckViolation {
        column: String,
        constraint: String,
        value: String,
    },
    /// A column named in a job that the target does not have: `named_by` says where it
    /// was named (set_values, expect, an item, an argument), `default` when it is an
    /// argument's default, taken because the call did not give the argument.
    UndefinedColumn {
        column: String,
        named_by: Option<String>,
        default: Option<Defaulted>,
    },
    /// A job that deletes rows of `table`, whose foreign keys would delete or change rows
    /// of other tables with them (job/change/cascade.rs): `detail` names the keys.
    DeleteReachesOtherRows {
        table: String,
        detail: String,
    },
    /// Something etc_batch does not support (yet), such as a key of an unusual type.
    Unsupported {
        message: String,
        detail: String,
    },
    UnknownJob {
        job: String,
    },
    /// The database's etc_batch objects are of another version than this library.
    VersionMismatch {
        installed: String,
    },
    PermissionDenied {
        message: String,
        detail: String,
    },
    /// The same job id registered again with different content.
    JobMismatch {
        job: String,
        detail: String,
    },
    /// An item no longer holds what was approved: a business decision is needed.
    JobConflict {
        job: String,
        detail: String,
    },
    /// The job's progress does not match its approved list.
    JobCorrupt {
        job: String,
        detail: String,
    },
    JobAborted {
        job: String,
        reason: Option<String>,
    },
    /// `abort_job` on a job that finished: there is nothing left to stop.
    JobFinished {
        job: String,
    },
    /// A fence check failed: the holder no longer holds that generation of the lease.
    LeaseLost {
        name: String,
        holder: String,
        generation: i64,
        detail: String,
    },
    UnknownLease {
        name: String,
    },
    /// release_lease by a holder that does not hold the lease.
    LeaseNotHeld {
        name: String,
        holder: String,
        detail: String,
    },
    /// SPI refused a statement etc_batch sent for a reason of its own (not an error
    /// PostgreSQL raised while running it, which propagates as it was).
    Spi {
        code: Code,
        message: String,
    },
    /// A launch that would run more of etc_batch's workers than etc_batch.max_workers.
    TooManyWorkers {
        asked: i32,
        running: i32,
        max: i32,
    },
    /// A launch for which max_worker_processes has no free slot: none of its workers start.
    NoWorkerSlot {
        asked: i32,
        started: i32,
        max_worker_processes: i32,
        in_use: i32,
    },
    /// A launch by a role that cannot log in, as its workers would.
    LaunchRoleCannotLogIn {
        role: String,
    },
    /// A sequential job launched with more than one worker.
    SequentialWorkers {
        job: String,
        workers: i32,
    },
    UnknownLaunch {
        id: i64,
    },
    /// Something etc_batch itself did not expect; a bug, never a user error.
    Internal(String),
}

/// The four parts of an error as PostgreSQL reports it.
pub struct Report {
    pub code: Code,
    pub message: String,
    pub detail: Option<String>,
    pub hint: Option<String>,
}

/// An argument of registration that names a column and was not given: what the job
/// took instead, said when that column is not there.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Defaulted {
    /// revision_column, 'revision' unless given.
    RevisionColumn,
    /// tenant_column, 'tenant' unless given.
    TenantColumn,
    /// The key of a table without a primary key, when neither key_column nor key_columns
    /// is given: its column "id".
    Key,
}

impl Defaulted {
    fn detail(self, column: &str) -> String {
        match self {
            Defaulted::RevisionColumn => format!(
                "Column \"{column}\" is revision_column's default, taken when a call does not give one."
            ),
            Defaulted::TenantColumn => format!(
                "Column \"{column}\" is tenant_column's default, taken when a call gives a tenant and no tenant_column."
            ),
            Defaulted::Key => format!(
                "The table has no primary key and the call named no key, so \"{column}\" was taken as the key."
            ),
        }
    }

    fn hint(self) -> &'static str {
        match self {
            Defaulted::RevisionColumn => "Name the column the application increments with revision_column => '...', or give revision_column => NULL to guard each row by a digest of it (or guard => 'columns').",
            Defaulted::TenantColumn => "Name the column the tenant is kept in with tenant_column => '...', or give tenant => NULL for a job on the whole table.",
            Defaulted::Key => "Name the columns of a unique index with key_column => '...' or key_columns => ARRAY['...'].",
        }
    }
}

fn report(code: Code, message: impl Into<String>) -> Report {
    Report {
        code,
        message: message.into(),
        detail: None,
        hint: None,
    }
}

impl Report {
    fn detail(mut self, detail: impl Into<String>) -> Self {
        self.detail = Some(detail.into());
        self
    }

    fn maybe_detail(mut self, detail: Option<String>) -> Self {
        self.detail = detail;
        self
    }

    fn hint(mut self, hint: impl Into<String>) -> Self {
        self.hint = Some(hint.into());
        self
    }
}

const IN_TRANSACTION_BLOCK_DETAIL: &str = "It commits as it works, a step or a chunk at a \
    time, and this CALL ran inside a transaction block: after BEGIN, in a string of several \
    statements (as pg_cron and psql -c run one), or from a client driver with autocommit off, \
    which opens one before every statement.";

const ATOMIC_DETAIL: &str = "It commits as it works, a step or a chunk at a time, and a \
    function, a SELECT, a block with an EXCEPTION clause, or a calling procedure with a SET \
    clause or SECURITY DEFINER does not allow that.";

impl BatchError {
    /// An argument whose value is never valid, with nothing more to say about it.
    pub fn invalid(message: impl Into<String>) -> Self {
        BatchError::InvalidArgument {
            message: message.into(),
            detail: None,
        }
    }

    /// An argument whose value is never valid, and the facts that make it so.
    pub fn invalid_because(message: impl Into<String>, detail: impl Into<String>) -> Self {
        BatchError::InvalidArgument {
            message: message.into(),
            detail: Some(detail.into()),
        }
    }

    /// SQLSTATE, message, detail and hint, decided together for each kind of error.
    pub fn report(&self) -> Report {
        use BatchError::*;
        match self {
            AtomicContext {
                procedure,
                in_transaction_block: true,
            } => report(
                Code::ERRCODE_INVALID_TRANSACTION_TERMINATION,
                format!("{procedure} cannot run inside a transaction block"),
            )
            .detail(IN_TRANSACTION_BLOCK_DETAIL)
            .hint(format!(
                "Send \"CALL {procedure}(...)\" as a statement of its own, in autocommit mode: \
                 turn autocommit on in the driver (psycopg: conn.autocommit = True; JDBC: \
                 setAutoCommit(true)), give pg_cron a job string with only the CALL, or COMMIT \
                 the open transaction first."
            )),
            AtomicContext { procedure, .. } => report(
                Code::ERRCODE_INVALID_TRANSACTION_TERMINATION,
                format!("{procedure} cannot run in an atomic context"),
            )
            .detail(ATOMIC_DETAIL)
            .hint(format!(
                "Run \"CALL {procedure}(...)\" as a statement of its own in autocommit mode, \
                 or from a procedure that was itself CALLed that way."
            )),
            OnStandby { routine, primary } => report(
                Code::ERRCODE_READ_ONLY_SQL_TRANSACTION,
                format!("{routine} cannot run on a standby"),
            )
            .detail(
                "This server is in recovery, a hot standby: it replays the primary's WAL and \
                 cannot write. etc_batch's views and doctor() work here; its work runs on the \
                 primary.",
            )
            .hint(match primary {
                Some(primary) => format!(
                    "Run it on the primary, at {primary} (this standby's primary_conninfo)."
                ),
                None => "Run it on the primary this standby replays from.".to_string(),
            }),
            ChainRunsItself { batch, path } => report(
                Code::ERRCODE_INVALID_OBJECT_DEFINITION,
                format!("chain \"{batch}\" would run itself again"),
            )
            .detail(format!(
                "Its steps that commit run exec_batch_from_id in turn: {path}. Nothing was run."
            ))
            .hint("Remove or change the step that runs the chain again (etc_batch.batch_log)."),
            NoStepWorker { id, batch, reason } => report(
                Code::ERRCODE_CONFIGURATION_LIMIT_EXCEEDED,
                format!("step {id} of batch \"{batch}\" commits and was added by another role, and no background worker can run it as that role"),
            )
            .detail(format!(
                "A step that commits runs as the role that added it, in a background worker connected as that role, when another role runs the chain: {reason}."
            ))
            .hint("Run the chain as the role that added the step, or make a worker available (see the detail)."),
            NullArgument { argument } => report(
                Code::ERRCODE_NULL_VALUE_NOT_ALLOWED,
                format!("argument \"{argument}\" must not be null"),
            ),
            InvalidArgument { message, detail } => {
                report(Code::ERRCODE_INVALID_PARAMETER_VALUE, message).maybe_detail(detail.clone())
            }
            InvalidCommand { detail } => {
                report(Code::ERRCODE_INVALID_PARAMETER_VALUE, "invalid step command").detail(detail)
            }
            Syntax { what, detail } => {
                report(Code::ERRCODE_SYNTAX_ERROR, format!("{what} has a syntax error")).detail(detail)
            }
            TypeMismatch { message, detail } => {
                report(Code::ERRCODE_DATATYPE_MISMATCH, message).detail(detail)
            }
            UnknownStep { id } => {
                report(Code::ERRCODE_UNDEFINED_OBJECT, format!("step {id} does not exist"))
            }
            UnknownBatch { batch } => report(
                Code::ERRCODE_UNDEFINED_OBJECT,
                format!("batch \"{batch}\" does not exist"),
            ),
            UnknownChain { chain } => report(
                Code::ERRCODE_UNDEFINED_OBJECT,
                format!("chain \"{chain}\" does not exist"),
            )
            .hint(format!(
                "Define it with etc_batch.define_chain('{0}') and add its steps with etc_batch.add_step('{0}', ...).",
                quote_literal(chain)
            )),
            EmptyChain { chain } => report(
                Code::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
                format!("chain \"{chain}\" has no steps"),
            )
            .detail("No run was made.")
            .hint(format!(
                "Add its steps with etc_batch.add_step('{}', ...).",
                quote_literal(chain)
            )),
            RunAbandoned {
                chain,
                run_key,
                by,
                at,
            } => report(
                Code::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
                format!("run \"{run_key}\" of chain \"{chain}\" was abandoned"),
            )
            .detail(format!(
                "It was abandoned by {by} at {at}; an abandoned run never runs again, and nothing was run."
            ))
            .hint("Run the chain under another run key."),
            UnknownRun { chain, run_key } => report(
                Code::ERRCODE_UNDEFINED_OBJECT,
                format!("run \"{run_key}\" of chain \"{chain}\" does not exist"),
            ),
            RunDone {
                chain,
                run_key,
                batch,
            } => report(
                Code::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
                format!("run \"{run_key}\" of chain \"{chain}\" is done"),
            )
            .detail(format!(
                "Every step of batch \"{batch}\" is done; there is nothing to abandon."
            )),
            DefinitionStep { id, chain } => report(
                Code::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
                format!("step {id} belongs to the definition of chain \"{chain}\""),
            )
            .detail("A chain's definition never runs itself; each run runs copies of its steps.")
            .hint(format!(
                "Run the chain with CALL etc_batch.run_chain('{}').",
                quote_literal(chain)
            )),
            StepExists { id, batch } => report(
                Code::ERRCODE_UNIQUE_VIOLATION,
                format!("step {id} already exists in batch \"{batch}\""),
            )
            .hint("Omit the id to let etc_batch choose the next free one."),
            StepFailed {
                id,
                batch,
                attempts,
                sqlstate,
                error,
            } => report(
                Code::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
                format!("step {id} of batch \"{batch}\" has failed"),
            )
            .detail(format!(
                "It {}.",
                failure_text(*attempts, sqlstate.as_deref(), error.as_deref())
            ))
            .hint(retry_step_hint(*id)),
            StepNotFailed { id, status } => report(
                Code::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
                format!("step {id} is {status}, not failed"),
            )
            .hint("Only a failed step can be retried; use etc_batch.reset_batch to rerun a whole batch."),
            StepOwnerMissing { id, batch } => report(
                Code::ERRCODE_UNDEFINED_OBJECT,
                format!("step {id} of batch \"{batch}\" was added by a role that no longer exists"),
            )
            .detail("A step runs with the privileges of the role that added it.")
            .hint("Delete the step and add it again as an existing role."),
            UnknownRelation { oid } => report(
                Code::ERRCODE_UNDEFINED_TABLE,
                format!("relation with OID {oid} does not exist"),
            ),
            UnknownFunction { oid } => report(
                Code::ERRCODE_UNDEFINED_FUNCTION,
                format!("function with OID {oid} does not exist"),
            ),
            TargetGone { job, table } => report(
                Code::ERRCODE_UNDEFINED_TABLE,
                format!("the target of job \"{job}\", table {table}, does not exist any more"),
            )
            .detail("It was dropped, or dropped and created again, since the job was registered; a job keeps the table it was approved for, by its identity, and nothing was changed.")
            .hint(format!(
                "Abort the job (etc_batch.abort_job('{}', ...)) and register what is left against the table as it is now.",
                job.replace('\'', "''")
            )),
            KeyNotUnique { table, key } => report(
                Code::ERRCODE_INVALID_COLUMN_REFERENCE,
                format!("key {key} of table {table} does not name one row"),
            )
            .detail("No primary key or unique index of the table has only the key's columns (and the tenant column), so one approved item could change several rows.")
            .hint("Name the columns of the primary key or of a unique index with key_column or key_columns."),
            GeneratedColumn { column, argument } => report(
                Code::ERRCODE_GENERATED_ALWAYS,
                format!("{argument} cannot assign column \"{column}\""),
            )
            .detail(format!("Column \"{column}\" is a generated column: PostgreSQL computes it from the others."))
            .hint(format!("Leave it out of {argument}; it follows the columns it is generated from.")),
            HandlerMissing { job } => report(
                Code::ERRCODE_UNDEFINED_FUNCTION,
                format!("the handler of job \"{job}\" no longer exists"),
            )
            .detail("The job names its handler by identity, and a function created again is another one; nothing was changed.")
            .hint(format!(
                "Abort the job (etc_batch.abort_job('{}', ...)) and register what is left under a new job id.",
                job.replace('\'', "''")
            )),
            SerializationFailure => report(
                Code::ERRCODE_T_R_SERIALIZATION_FAILURE,
                "could not serialize access due to concurrent update",
            ),
            TableLayout { table, column } => report(
                Code::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
                format!("table etc_batch.{table} does not have the columns etc_batch writes"),
            )
            .detail(format!(
                "Column \"{column}\" was added, dropped or changed its type since the extension created the table; nothing was written."
            ))
            .hint("Give the table back the columns it was created with (see the extension's script)."),
            CheckViolation {
                column,
                constraint,
                value,
            } => report(
                Code::ERRCODE_CHECK_VIOLATION,
                format!("set_values sets column \"{column}\" to a value its check constraint \"{constraint}\" refuses"),
            )
            .detail(format!("The constraint refuses {value}: every chunk's UPDATE would fail on it; nothing was registered."))
            .hint("Give the column a value the constraint allows."),
            NotNullViolation { column } => report(
                Code::ERRCODE_NOT_NULL_VIOLATION,
                format!("set_values sets column \"{column}\" to null, which its NOT NULL constraint refuses"),
            )
            .detail("Every chunk's UPDATE would fail on it; nothing was registered.")
            .hint("Give the column a value, or leave it out of set_values."),
            UndefinedColumn {
                column,
                named_by,
                default,
            } => {
                let named = match named_by {
                    Some(by) => format!(" named in {by}"),
                    None => String::new(),
                };
                let r = report(
                    Code::ERRCODE_UNDEFINED_COLUMN,
                    format!("column \"{column}\"{named} does not exist in the target"),
                );
                match default {
                    Some(d) => r.detail(d.detail(column)).hint(d.hint()),
                    None => r,
                }
            }
            DeleteReachesOtherRows { table, detail } => report(
                Code::ERRCODE_DEPENDENT_OBJECTS_STILL_EXIST,
                format!("deleting rows of {table} would delete or change rows that reference them"),
            )
            .detail(detail)
            .hint(
                "Delete or move the referencing rows first, with a job of their own on each table, \
                 or change the foreign keys to ON DELETE RESTRICT or NO ACTION, so that a row \
                 still referenced stops its chunk instead.",
            ),
            Unsupported { message, detail } => {
                report(Code::ERRCODE_FEATURE_NOT_SUPPORTED, message).detail(detail)
            }
            UnknownJob { job } => {
                report(Code::ERRCODE_UNDEFINED_OBJECT, format!("job \"{job}\" does not exist"))
            }
            VersionMismatch { installed } => report(
                Code::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
                format!(
                    "etc_batch {installed} is installed in this database, but the library is {}",
                    env!("CARGO_PKG_VERSION")
                ),
            )
            .hint("Run \"ALTER EXTENSION etc_batch UPDATE\" in this database."),
            PermissionDenied { message, detail } => {
                report(Code::ERRCODE_INSUFFICIENT_PRIVILEGE, message).detail(detail)
            }
            JobMismatch { job, detail } => report(
                Code::ERRCODE_DUPLICATE_OBJECT,
                format!("job \"{job}\" is already registered with different content"),
            )
            .detail(detail)
            .hint("A job id names one approval forever; register the new approval under a new job id."),
            // Not class 40: a conflict is never retryable; it needs a new approval.
            JobConflict { job, detail } => report(
                Code::ERRCODE_INTEGRITY_CONSTRAINT_VIOLATION,
                format!("job \"{job}\" is in conflict"),
            )
            .detail(detail)
            .hint(
                "This is a business conflict, not a transient error: chunks committed earlier stay \
                 committed, and the remaining items need a new approval under a new job id.",
            ),
            JobCorrupt { job, detail } => report(
                Code::ERRCODE_DATA_CORRUPTED,
                format!("job \"{job}\" has corrupt progress"),
            )
            .detail(detail)
            .hint(
                "etc_batch does not repair progress by itself; compare etc_batch.verify_job with \
                 etc_batch.job_audit, then abort the job and register what remains.",
            ),
            JobAborted { job, reason } => report(
                Code::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
                format!("job \"{job}\" was aborted"),
            )
            .maybe_detail(reason.as_ref().map(|r| format!("The reason given was \"{r}\"."))),
            TooManyWorkers { asked, running, max } => report(
                Code::ERRCODE_CONFIGURATION_LIMIT_EXCEEDED,
                format!("a launch of {asked} workers would exceed etc_batch.max_workers"),
            )
            .detail(format!(
                "etc_batch.max_workers is {max}, and {running} of etc_batch's workers run now in this cluster; no worker was started."
            ))
            .hint("Launch fewer workers, wait for a launch to end, or raise etc_batch.max_workers (and max_worker_processes with it)."),
            NoWorkerSlot {
                asked,
                started,
                max_worker_processes,
                in_use,
            } => report(
                Code::ERRCODE_CONFIGURATION_LIMIT_EXCEEDED,
                "no background worker slot is free for the launch",
            )
            .detail(format!(
                "max_worker_processes is {max_worker_processes}, and {in_use} background workers run now; {started} of the {asked} workers asked for could start, and the launch starts none of them."
            ))
            .hint("Raise max_worker_processes (it takes a restart), or wait for background workers to end."),
            LaunchRoleCannotLogIn { role } => report(
                Code::ERRCODE_INVALID_AUTHORIZATION_SPECIFICATION,
                format!("role \"{role}\" cannot log in, and a launch's workers connect as the role that launches them"),
            )
            .detail("On PostgreSQL 15 and 16 a background worker connects only as a role with LOGIN; from 17 on, any role.")
            // quoted in Rust, not by the server: unit tests build every report with no server
            .hint(format!("ALTER ROLE \"{}\" LOGIN, or launch as a role that may log in.", role.replace('"', "\"\""))),
            SequentialWorkers { job, workers } => report(
                Code::ERRCODE_INVALID_PARAMETER_VALUE,
                format!("job \"{job}\" is sequential, and {workers} workers cannot drain it at once"),
            )
            .detail("A sequential job's chunks commit in order, one after another: one worker drains it.")
            .hint("Launch it with one worker, or register the approval with parallel => true, whose chunks any number of workers drain at once."),
            UnknownLaunch { id } => report(
                Code::ERRCODE_UNDEFINED_OBJECT,
                format!("launch {id} does not exist"),
            ),
            JobContinued { job, successor } => report(
                Code::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
                format!("job \"{job}\" was continued as another job"),
            )
            .maybe_detail(
                successor
                    .as_ref()
                    .map(|s| format!("What it had not changed was approved as job \"{s}\".")),
            )
            .hint("Drain the job it was continued as."),
            JobReverted { job, by } => report(
                Code::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
                format!("job \"{job}\" was reverted"),
            )
            .maybe_detail(
                by.as_ref()
                    .map(|b| format!("Its committed items are set back by job \"{b}\".")),
            )
            .hint("A job reverted changes nothing more; drain the revert."),
            SyncWaitCanceled { what, again } => report(
                Code::ERRCODE_QUERY_CANCELED,
                format!("canceled while {what} waited for the synchronous standby"),
            )
            .detail(format!(
                "The {} is committed on this server, but no synchronous standby has confirmed it: after a failover to the standby, it is not there, and it runs again there, once. What this call told of before was confirmed.",
                what.split(' ').next().unwrap_or("work")
            ))
            .hint(format!(
                "Call {again} to go on; its commits wait for the standby again."
            )),
            JobFinished { job } => report(
                Code::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
                format!("job \"{job}\" is already done"),
            )
            .detail("A finished job has nothing left to stop."),
            // A class no step or job error uses, so that a worker can tell "I lost my
            // lease, step down" from every failure of the work itself.
            LeaseLost {
                name,
                holder,
                generation,
                detail,
            } => report(
                Code::ERRCODE_INVALID_TRANSACTION_INITIATION,
                format!("lease \"{name}\" is not held by \"{holder}\" at generation {generation}"),
            )
            .detail(detail)
            .hint(
                "Stop acting as the holder: nothing was changed, and no more work may be done \
                 under this lease. Acquire it again before doing more.",
            ),
            UnknownLease { name } => report(
                Code::ERRCODE_UNDEFINED_OBJECT,
                format!("lease \"{name}\" does not exist"),
            ),
            LeaseNotHeld {
                name,
                holder,
                detail,
            } => report(
                Code::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
                format!("lease \"{name}\" is not held by \"{holder}\""),
            )
            .detail(detail),
            Spi { code, message } => report(*code, message),
            Internal(what) => report(
                Code::ERRCODE_INTERNAL_ERROR,
                format!("etc_batch internal error: {what}"),
            ),
        }
    }

    pub fn sqlstate(&self) -> Code {
        self.report().code
    }

    pub fn message(&self) -> String {
        self.report().message
    }

    pub fn detail(&self) -> Option<String> {
        self.report().detail
    }

    pub fn hint(&self) -> Option<String> {
        self.report().hint
    }

    /// Raises this error in the backend; never returns.
    pub fn raise(self) -> ! {
        raise(ErrorReport::from(self))
    }
}

/// Raises `report` at ERROR; never returns.
pub fn raise(report: ErrorReport) -> ! {
    report.report(PgLogLevel::ERROR);
    unreachable!("ereport(ERROR) returned")
}

/// What to do about a failed step: the same words wherever a failed step is reported.
pub fn retry_step_hint(id: i64) -> String {
    format!(
        "Fix the cause, then run \"SELECT etc_batch.retry_step({id})\" and \
         \"CALL etc_batch.exec_batch_from_id({id})\"."
    )
}

impl std::fmt::Display for BatchError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message())
    }
}

impl std::error::Error for BatchError {}

impl From<BatchError> for ErrorReport {
    fn from(e: BatchError) -> Self {
        let Report {
            code,
            message,
            detail,
            hint,
        } = e.report();
        let mut report = ErrorReport::new(code, message, "etc_batch");
        if let Some(detail) = detail {
            report = report.set_detail(detail);
        }
        if let Some(hint) = hint {
            report = report.set_hint(hint);
        }
        report
    }
}

/// pgrx's SPI layer refuses some statements before PostgreSQL runs them; each refusal
/// gets the SQLSTATE PostgreSQL itself would give the same thing. (An error PostgreSQL
/// raises while running a statement never arrives here: it propagates as it was.)
impl From<pgrx::spi::Error> for BatchError {
    fn from(e: pgrx::spi::Error) -> Self {
        use pgrx::spi::{SpiError as E, SpiErrorCodes as S};
        let code = match &e {
            E::SpiError(S::Copy) => Code::ERRCODE_FEATURE_NOT_SUPPORTED,
            E::SpiError(S::Transaction) => Code::ERRCODE_INVALID_TRANSACTION_TERMINATION,
            E::SpiError(S::Argument | S::Param) | E::PreparedStatementArgumentMismatch { .. } => {
                Code::ERRCODE_INVALID_PARAMETER_VALUE
            }
            E::SpiError(S::NoAttribute) => Code::ERRCODE_UNDEFINED_COLUMN,
            E::SpiError(S::RelNotFound) => Code::ERRCODE_UNDEFINED_TABLE,
            E::SpiError(S::RelDuplicate) => Code::ERRCODE_DUPLICATE_TABLE,
            E::SpiError(S::TypUnknown | S::NoOutFunc) => Code::ERRCODE_UNDEFINED_OBJECT,
            E::InvalidPosition | E::CursorNotFound(_) => Code::ERRCODE_INVALID_CURSOR_NAME,
            E::DatumError(_) => Code::ERRCODE_DATATYPE_MISMATCH,
            // SPI used wrongly (not connected, no result): etc_batch's own bug
            _ => return BatchError::Internal(e.to_string()),
        };
        let message = match code {
            Code::ERRCODE_FEATURE_NOT_SUPPORTED => "cannot COPY to or from the client here".into(),
            Code::ERRCODE_INVALID_TRANSACTION_TERMINATION => {
                "cannot begin or end a transaction here".into()
            }
            _ => format!("could not run the statement: {e}"),
        };
        BatchError::Spi { code, message }
    }
}

pub type Result<T> = std::result::Result<T, BatchError>;

/// Raises the error of a failed `Result` in the backend.
pub trait OrRaise<T> {
    fn or_raise(self) -> T;
}

impl<T> OrRaise<T> for Result<T> {
    fn or_raise(self) -> T {
        self.unwrap_or_else(|e| e.raise())
    }
}

/// A required argument: NULL is an error, never a silent NULL result.
pub fn required<T>(value: Option<T>, argument: &'static str) -> Result<T> {
    value.ok_or(BatchError::NullArgument { argument })
}

/// A name (a batch, a job id, a lease or its holder) that must say something.
pub fn non_empty(value: &str, what: &str) -> Result<()> {
    if value.trim().is_empty() {
        return Err(BatchError::invalid(format!("{what} must not be empty")));
    }
    Ok(())
}

/// A PostgreSQL message as the first sentence of a detail: its first letter upper case.
pub fn capitalize(message: &str) -> String {
    let mut chars = message.chars();
    match chars.next() {
        Some(first) => first.to_uppercase().chain(chars).collect(),
        None => String::new(),
    }
}

/// How a step failed, as messages say it: "failed on attempt 2 with SQLSTATE 23505: ...".
pub fn failure_text(attempts: i32, sqlstate: Option<&str>, error: Option<&str>) -> String {
    format!(
        "failed on attempt {attempts}{}{}",
        sqlstate
            .map(|s| format!(" with SQLSTATE {s}"))
            .unwrap_or_default(),
        error.map(|e| format!(": {e}")).unwrap_or_default(),
    )
}

/// `s` inside a quoted SQL literal of a hint.
fn quote_literal(s: &str) -> String {
    s.replace('\'', "''")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One example of every variant. The match below has no wildcard, so a new variant
    /// does not compile until it has an example here, and the style test covers it.
    fn every_variant() -> Vec<BatchError> {
        use BatchError::*;
        let all = vec![
            AtomicContext {
                procedure: "etc_batch.exec_batch_from_id".into(),
                in_transaction_block: true,
            },
            AtomicContext {
                procedure: "etc_batch.drain_job".into(),
                in_transaction_block: false,
            },
            OnStandby {
                routine: "etc_batch.drain_job".into(),
                primary: Some("host 10.0.0.5 port 5432".into()),
            },
            OnStandby {
                routine: "etc_batch.add_step".into(),
                primary: None,
            },
            ChainRunsItself {
                batch: "a".into(),
                path: "a (step 3) → b (step 9) → a".into(),
            },
            NoStepWorker {
                id: 3,
                batch: "a".into(),
                reason: "its author, role \"etl_owner\", cannot log in".into(),
            },
            NullArgument { argument: "batch" },
            BatchError::invalid("chunk size 0 is out of range"),
            BatchError::invalid_because("items must be a JSON array", "It is an object."),
            InvalidCommand {
                detail: "The command is empty.".into(),
            },
            Syntax {
                what: "step command",
                detail: "Syntax error at or near \"SELEC\".".into(),
            },
            TypeMismatch {
                message: "column \"qty\" of items_query has type text, which does not fit column \"qty\" of type int4".into(),
                detail: "A value of the items query must be one INSERT would take for the column; cast it in the query.".into(),
            },
            UnknownStep { id: 7 },
            UnknownBatch {
                batch: "nightly".into(),
            },
            StepExists {
                id: 7,
                batch: "nightly".into(),
            },
            UnknownChain {
                chain: "nightly".into(),
            },
            EmptyChain {
                chain: "nightly".into(),
            },
            RunAbandoned {
                chain: "nightly".into(),
                run_key: "2026-12-01".into(),
                by: "dba".into(),
                at: "2026-12-02 08:00:00+00".into(),
            },
            UnknownRun {
                chain: "nightly".into(),
                run_key: "2026-12-01".into(),
            },
            RunDone {
                chain: "nightly".into(),
                run_key: "2026-12-01".into(),
                batch: "nightly/2026-12-01".into(),
            },
            DefinitionStep {
                id: 21,
                chain: "nightly".into(),
            },
            StepFailed {
                id: 7,
                batch: "nightly".into(),
                attempts: 2,
                sqlstate: Some("22012".into()),
                error: Some("division by zero".into()),
            },
            StepNotFailed {
                id: 7,
                status: "done".into(),
            },
            StepOwnerMissing {
                id: 7,
                batch: "nightly".into(),
            },
            UnknownRelation { oid: 12345 },
            TargetGone {
                job: "festival".into(),
                table: "public.orders".into(),
            },
            KeyNotUnique {
                table: "public.orders".into(),
                key: "(region, id)".into(),
            },
            GeneratedColumn {
                column: "total".into(),
                argument: "set_values",
            },
            UnknownFunction { oid: 12345 },
            HandlerMissing {
                job: "o'clock".into(),
            },
            UndefinedColumn {
                column: "qty".into(),
                named_by: Some("set_values".into()),
                default: None,
            },
            UndefinedColumn {
                column: "revision".into(),
                named_by: Some("revision_column".into()),
                default: Some(Defaulted::RevisionColumn),
            },
            TableLayout {
                table: "job_audit_chunk_7".into(),
                column: "note".into(),
            },
            SerializationFailure,
            Unsupported {
                message: "key column \"id\" has type numeric".into(),
                detail: "Key columns may be smallint, integer, bigint, text, varchar or uuid."
                    .into(),
            },
            UnknownJob {
                job: "festival".into(),
            },
            VersionMismatch {
                installed: "0.1.0".into(),
            },
            PermissionDenied {
                message: "permission denied for table orders".into(),
                detail: "A job changes rows with the privileges of the role that registers it."
                    .into(),
            },
            JobMismatch {
                job: "festival".into(),
                detail: "The chunk size was 10 and is now 5.".into(),
            },
            JobConflict {
                job: "festival".into(),
                detail: "Item 15 was approved at revision 3, but the row now has revision 4."
                    .into(),
            },
            JobCorrupt {
                job: "festival".into(),
                detail: "The checkpoint moved.".into(),
            },
            JobAborted {
                job: "festival".into(),
                reason: Some("rain".into()),
            },
            JobAborted {
                job: "festival".into(),
                reason: None,
            },
            JobFinished {
                job: "festival".into(),
            },
            JobContinued {
                job: "festival".into(),
                successor: Some("festival-2".into()),
            },
            JobReverted {
                job: "festival".into(),
                by: Some("festival-undo".into()),
            },
            SyncWaitCanceled {
                what: "chunk 7 of job \"festival\"".into(),
                again: "etc_batch.drain_job('festival')".into(),
            },
            TooManyWorkers {
                asked: 4,
                running: 6,
                max: 8,
            },
            NoWorkerSlot {
                asked: 4,
                started: 2,
                max_worker_processes: 8,
                in_use: 8,
            },
            LaunchRoleCannotLogIn {
                role: "etl_owner".into(),
            },
            SequentialWorkers {
                job: "festival".into(),
                workers: 4,
            },
            UnknownLaunch { id: 12 },
            NotNullViolation {
                column: "status".into(),
            },
            CheckViolation {
                column: "qty".into(),
                constraint: "orders_qty_check".into(),
                value: "-1".into(),
            },
            LeaseLost {
                name: "leader".into(),
                holder: "w1".into(),
                generation: 3,
                detail: "It has expired.".into(),
            },
            UnknownLease {
                name: "leader".into(),
            },
            LeaseNotHeld {
                name: "leader".into(),
                holder: "w1".into(),
                detail: "It is held by \"w2\" at generation 4; nothing was changed.".into(),
            },
            pgrx::spi::SpiError::SpiError(pgrx::spi::SpiErrorCodes::Copy).into(),
            pgrx::spi::SpiError::SpiError(pgrx::spi::SpiErrorCodes::Transaction).into(),
            pgrx::spi::SpiError::CursorNotFound("c".into()).into(),
            Internal("an aggregate returned no row".into()),
            DeleteReachesOtherRows {
                table: "public.customers".into(),
                detail: "Deleting its rows would delete rows of other tables through the foreign key \"orders_customer_fkey\" of orders (ON DELETE CASCADE, referencing customers); etc_batch keeps only the rows the job deletes from its target, so those would be lost to its audit and its revert.".into(),
            },
        ];
        let covered: std::collections::BTreeSet<usize> = all
            .iter()
            .map(|e| match e {
                AtomicContext { .. } => 0,
                NullArgument { .. } => 1,
                InvalidArgument { .. } => 2,
                InvalidCommand { .. } => 3,
                Syntax { .. } => 4,
                TypeMismatch { .. } => 29,
                UnknownStep { .. } => 5,
                UnknownBatch { .. } => 6,
                StepExists { .. } => 7,
                StepFailed { .. } => 8,
                StepNotFailed { .. } => 9,
                StepOwnerMissing { .. } => 10,
                UnknownRelation { .. } => 11,
                UnknownFunction { .. } => 12,
                HandlerMissing { .. } => 13,
                UndefinedColumn { .. } => 14,
                TableLayout { .. } => 30,
                SerializationFailure => 31,
                Unsupported { .. } => 15,
                UnknownJob { .. } => 16,
                VersionMismatch { .. } => 17,
                PermissionDenied { .. } => 18,
                JobMismatch { .. } => 19,
                JobConflict { .. } => 20,
                JobCorrupt { .. } => 21,
                JobAborted { .. } => 22,
                JobFinished { .. } => 23,
                LeaseLost { .. } => 24,
                UnknownLease { .. } => 25,
                LeaseNotHeld { .. } => 26,
                Spi { .. } => 27,
                Internal(_) => 28,
                OnStandby { .. } => 32,
                ChainRunsItself { .. } => 33,
                NoStepWorker { .. } => 34,
                TargetGone { .. } => 35,
                KeyNotUnique { .. } => 36,
                GeneratedColumn { .. } => 37,
                JobContinued { .. } => 38,
                TooManyWorkers { .. } => 39,
                NoWorkerSlot { .. } => 40,
                LaunchRoleCannotLogIn { .. } => 41,
                SequentialWorkers { .. } => 42,
                UnknownLaunch { .. } => 43,
                UnknownChain { .. } => 44,
                EmptyChain { .. } => 45,
                RunAbandoned { .. } => 46,
                UnknownRun { .. } => 47,
                RunDone { .. } => 48,
                DefinitionStep { .. } => 49,
                JobReverted { .. } => 50,
                SyncWaitCanceled { .. } => 51,
                NotNullViolation { .. } => 52,
                CheckViolation { .. } => 53,
                DeleteReachesOtherRows { .. } => 54,
            })
            .collect();
        assert_eq!(covered, (0..=54).collect(), "every variant has an example");
        all
    }

    #[test]
    fn messages_follow_postgres_style() {
        for e in every_variant() {
            let r = e.report();
            let m = &r.message;
            assert!(!m.is_empty() && !m.ends_with('.'), "{m}");
            assert!(
                !m.chars().next().unwrap().is_uppercase(),
                "a message starts in lower case: {m}"
            );
            for text in [&r.detail, &r.hint].into_iter().flatten() {
                // a full sentence: capitalized, unless it starts with a name, which
                // keeps its own case (etc_batch, a_column)
                let first = text.split_whitespace().next().unwrap();
                let is_name = first.contains('_') || first.contains('.');
                assert!(text.ends_with('.'), "{text}");
                assert!(
                    is_name || first.chars().next().unwrap().is_uppercase(),
                    "{text}"
                );
            }
        }
    }

    #[test]
    fn sqlstates_are_the_precise_ones() {
        use BatchError::*;
        let code = |e: BatchError| e.sqlstate();
        assert_eq!(
            code(JobFinished { job: "j".into() }),
            Code::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE
        );
        assert_eq!(
            code(UnknownRelation { oid: 1 }),
            Code::ERRCODE_UNDEFINED_TABLE
        );
        assert_eq!(
            code(UnknownFunction { oid: 1 }),
            Code::ERRCODE_UNDEFINED_FUNCTION
        );
        assert_eq!(
            code(pgrx::spi::SpiError::SpiError(pgrx::spi::SpiErrorCodes::Transaction).into()),
            Code::ERRCODE_INVALID_TRANSACTION_TERMINATION
        );
        assert_eq!(
            code(pgrx::spi::SpiError::SpiError(pgrx::spi::SpiErrorCodes::Copy).into()),
            Code::ERRCODE_FEATURE_NOT_SUPPORTED
        );
    }

    #[test]
    fn failed_step_detail_names_attempt_and_sqlstate() {
        let e = BatchError::StepFailed {
            id: 24,
            batch: "nightly".into(),
            attempts: 3,
            sqlstate: Some("23505".into()),
            error: Some("duplicate key".into()),
        };
        assert_eq!(
            e.detail().unwrap(),
            "It failed on attempt 3 with SQLSTATE 23505: duplicate key."
        );
        assert_eq!(e.hint().unwrap(), retry_step_hint(24));
        assert!(e.hint().unwrap().contains("etc_batch.retry_step(24)"));
        assert_eq!(e.sqlstate(), Code::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE);
    }

    #[test]
    fn atomic_context_is_2d000() {
        let e = BatchError::AtomicContext {
            procedure: "etc_batch.exec_batch_from_id".into(),
            in_transaction_block: false,
        };
        assert_eq!(e.sqlstate(), Code::ERRCODE_INVALID_TRANSACTION_TERMINATION);
        assert!(e
            .hint()
            .unwrap()
            .contains("CALL etc_batch.exec_batch_from_id"));
    }

    #[test]
    fn names_must_say_something() {
        assert!(non_empty("", "batch name").is_err());
        assert_eq!(
            non_empty("  ", "job id").unwrap_err().message(),
            "job id must not be empty"
        );
        assert!(non_empty("nightly", "batch name").is_ok());
    }

    #[test]
    fn capitalize_first_letter_only() {
        assert_eq!(
            capitalize("syntax error at or near \"SELEC\""),
            "Syntax error at or near \"SELEC\""
        );
        assert_eq!(capitalize(""), "");
    }
}
