//! etc_batch: exactly-once batch work inside PostgreSQL.
//!
//! Layout, from the SQL surface down, in layers: api/ over launch/, launch/ over chain/
//! and job/ (which name neither launch/ nor each other), and all four over the shared
//! modules from lease/ on, which name none of them.
//!
//! ```text
//! api/       the SQL surface: every function and procedure a DBA calls; it only
//!            converts between SQL and the modules below (types: the SQL types of its
//!            arguments pgrx has none for).
//! launch/    launches: background workers that drain a job or run a chain with no
//!            client session held, their supervisor per database and the launcher. A
//!            worker hands the drain or the chain what makes it a worker's: a halt (its
//!            launch ended) and, for a chain, the delegate that runs another role's step.
//! chain/     chains behind exec_batch_from_id: the rules and the kinds of step (step),
//!            managing steps (steps), the commit loop (runner), its statements (sql).
//! job/       checkpointed jobs behind drain_job: the approval, its key and its guard,
//!            the checkpoint's rules, a chunk opened in order or claimed (chunk), the
//!            seals, registration, the drain loop, reports.
//! lease/     leases and the fence that stops a holder who lost one.
//! procedure  a C-language procedure that commits: arguments by name, INOUT results.
//! txn/       the one place that ends transactions: the loop's `Transactions` and the
//!            CALL's driver of them, subtransactions, a failure caught in them.
//! query      every statement etc_batch sends: kept plans, rows read in place, cursors.
//! own_rows   etc_batch's own rows read, locked and written without a statement, by
//!            their index; audit rows written as COPY writes them.
//! parse      PostgreSQL's raw parser, for SQL handed in as text: plain values out.
//! memory     a memory context reset for every round of a loop; memory handed back.
//! roles      running a piece of work as another role, scoped to one transaction.
//! settings   settings changed for the span of one closure.
//! session_lock  session-level locks in etc_batch's own advisory key spaces.
//! retries    lock waits bounded, and the errors a chunk is tried again after.
//! raised     an error's own SQLSTATE and context, kept and given back when raised again.
//! standby    routines that write refused on a hot standby, naming the primary.
//! installed  the installed extension: its owner, and the version gate.
//! status     the states kept as text (steps, attempts, jobs, launches, their runs),
//!            one enum each with its one mapping to the text.
//! pauses     pause_job, pause_batch and their resumes, read before each chunk or step.
//! halt       what else stops a drain or a chain's run, handed in by its caller.
//! activity   what pg_stat_activity shows while a chain or a job runs.
//! error      the one error type, mapped to SQLSTATEs.
//! access     who may read or act on a job or a launch: the one rule.
//! sql/*.sql  the schema, loaded into the extension script as checked-in SQL.
//! ```

pub mod access;
pub mod activity;
pub mod api;
pub mod chain;
pub mod error;
pub mod events;
pub mod halt;
pub mod installed;
pub mod job;
pub mod launch;
pub mod lease;
pub mod memory;
pub mod own_rows;
pub mod parse;
pub mod pauses;
pub mod procedure;
pub mod progress_notices;
pub mod query;
pub mod raised;
pub mod retries;
pub mod roles;
pub mod session_lock;
pub mod settings;
pub mod standby;
pub mod status;
pub mod txn;

::pgrx::pg_module_magic!(name, version);

use pgrx::prelude::*;

extension_sql_file!("../sql/bootstrap.sql", name = "bootstrap", bootstrap);
extension_sql_file!(
    "../sql/chains.sql",
    name = "chains",
    requires = ["bootstrap"]
);
extension_sql_file!("../sql/runs.sql", name = "runs", requires = ["chains"]);
extension_sql_file!("../sql/jobs.sql", name = "jobs", requires = ["bootstrap"]);
extension_sql_file!(
    "../sql/leases.sql",
    name = "leases",
    requires = ["bootstrap"]
);
extension_sql_file!(
    "../sql/locks.sql",
    name = "locks",
    requires = ["chains", "jobs", "leases"]
);
extension_sql_file!(
    "../sql/pacing.sql",
    name = "pacing",
    requires = ["chains", "jobs"]
);
extension_sql_file!(
    "../sql/progress.sql",
    name = "progress",
    requires = [
        "chains",
        "jobs",
        "pacing",
        "launches",
        api::job::wall_seconds_in_windows
    ]
);
extension_sql_file!(
    "../sql/doctor.sql",
    name = "doctor",
    requires = ["chains", "runs", "jobs", "leases", "launches"]
);
extension_sql_file!(
    "../sql/procedures.sql",
    name = "procedures",
    requires = ["chains", "runs", "jobs"]
);
extension_sql_file!(
    "../sql/launches.sql",
    name = "launches",
    requires = ["chains", "jobs"]
);
extension_sql_file!("../sql/api.sql", name = "api", finalize);

#[pg_guard]
pub extern "C-unwind" fn _PG_init() {
    // An error's DETAIL is for the DBA: never a Rust backtrace, whatever RUST_BACKTRACE
    // the server was started with (pgrx captures one where std's capture is enabled).
    // SAFETY: the backend runs one thread, and nothing reads the environment meanwhile.
    unsafe { std::env::set_var("RUST_LIB_BACKTRACE", "0") };
    job::run::crash::register();
    retries::register();
    progress_notices::register();
    job::pace::signals::register();
    launch::register();
    events::register();
    // Every etc_batch.* setting is one this library defines: a misspelt one (or the test
    // aid of a test build, set against the release build) is refused, not kept silently.
    unsafe { pgrx::pg_sys::MarkGUCPrefixReserved(c"etc_batch".as_ptr()) };
}

/// Required by `cargo pgrx test`.
#[cfg(test)]
pub mod pg_test {
    pub fn setup(_options: Vec<&str>) {}

    #[must_use]
    pub fn postgresql_conf_options() -> Vec<&'static str> {
        vec![]
    }
}
