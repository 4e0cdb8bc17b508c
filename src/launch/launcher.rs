//! The launcher of the cluster, when the library is preloaded: started by the postmaster
//! once the server runs as a primary (after a start, after crash recovery, after a
//! standby's promotion), it starts a supervisor in every database that takes
//! connections; each supervisor ends at once where etc_batch has no launch running, and
//! starts again the workers of those that run. Then it waits, holding nothing, until
//! the server stops: a launcher that had ended would not be started again after a crash.

use super::bgw;
use crate::txn::worker::in_transaction;
use pgrx::bgworkers::BackgroundWorker;
use pgrx::pg_sys;
use pgrx::prelude::*;
use std::time::Duration;

#[pg_guard]
#[no_mangle]
pub extern "C-unwind" fn etc_batch_launcher_main(_arg: pg_sys::Datum) {
    bgw::take_signals();
    // no database: the shared catalogs only, pg_database among them
    bgw::connect(pg_sys::Oid::INVALID, pg_sys::Oid::INVALID);
    let databases = in_transaction(databases_taking_connections);
    for database in databases {
        if let Err(e) = bgw::start_supervisor(database) {
            log!("etc_batch launcher: {}", e.report().message);
        }
    }
    loop {
        // a SIGTERM ends the process here (the handler is PostgreSQL's own)
        BackgroundWorker::wait_latch(Some(Duration::from_secs(3600)));
    }
}

/// The databases one may connect to, templates aside, read from pg_database directly.
fn databases_taking_connections() -> Vec<pg_sys::Oid> {
    let mut found = Vec::new();
    // SAFETY: a catalog scan inside a transaction, as autovacuum's launcher lists the
    // databases; every tuple is read before the next is fetched.
    unsafe {
        let rel = pg_sys::table_open(pg_sys::DatabaseRelationId, pg_sys::AccessShareLock as i32);
        let scan = pg_sys::table_beginscan_catalog(rel, 0, std::ptr::null_mut());
        loop {
            let tuple = pg_sys::heap_getnext(scan, pg_sys::ScanDirection::ForwardScanDirection);
            if tuple.is_null() {
                break;
            }
            let db = pg_sys::heap_tuple_get_struct::<pg_sys::FormData_pg_database>(tuple);
            if (*db).datallowconn && !(*db).datistemplate {
                found.push((*db).oid);
            }
        }
        pg_sys::table_endscan(scan);
        pg_sys::table_close(rel, pg_sys::AccessShareLock as i32);
    }
    found
}
