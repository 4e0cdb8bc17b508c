//! Seals: a hash written with each record of progress, so that the record changed by
//! hand, and not by etc_batch, no longer matches it. The only place a seal is spelled;
//! statements that write or check one are given it, or read the rows here.
//!
//! A seal is hashtextextended(text, 7919) of the record's fields joined by ':', which is
//! also how jobs registered before this module sealed theirs.

use pgrx::pg_sys;
use pgrx::IntoDatum;

/// The seal of a sequential job's checkpoint: its next_index and how many chunks are
/// committed below it.
pub fn checkpoint(job_id: &str, next_index: i32, chunks_committed: i32) -> i64 {
    hash(&format!("{job_id}:{next_index}:{chunks_committed}"))
}

/// The seal of a parallel job's chunk row: whether chunk `chunk` is committed.
pub fn chunk(job_id: &str, chunk: i32, committed: bool) -> i64 {
    hash(&format!("{job_id}:chunk:{chunk}:{}", committed as i32))
}

/// hashtextextended(text, 7919).
fn hash(text: &str) -> i64 {
    // SAFETY: hashtextextended(text, bigint) returns a bigint datum; the text datum lives
    // in the current memory context until the call returns.
    unsafe {
        let datum = pg_sys::OidFunctionCall2Coll(
            pg_sys::Oid::from(pg_sys::F_HASHTEXTEXTENDED),
            pg_sys::DEFAULT_COLLATION_OID,
            text.into_datum().expect("text is never NULL"),
            pg_sys::Datum::from(7919_i64),
        );
        datum.value() as i64
    }
}

#[cfg(any(test, feature = "pg_test"))]
#[pgrx::pg_schema]
mod tests {
    use pgrx::prelude::*;

    /// The seals of jobs registered on earlier versions, whose statements spelled them in
    /// SQL, are still recognised.
    #[pg_test]
    fn seals_are_those_earlier_versions_wrote() {
        let sql = |text: String| {
            Spi::get_one_with_args::<i64>(
                "SELECT pg_catalog.hashtextextended($1, 7919)",
                &[text.into()],
            )
            .unwrap()
            .unwrap()
        };
        for (job, next, chunks) in [("festival", 40, 4), ("", 0, 0), ("a:b \"c\"", 7, 1)] {
            let seal = sql(format!("{job}:{next}:{chunks}"));
            assert_eq!(super::checkpoint(job, next, chunks), seal);
        }
        for (job, chunk, committed) in [
            ("festival", 1, false),
            ("festival", 1, true),
            ("a:b", 77, false),
        ] {
            let seal = sql(format!("{job}:chunk:{chunk}:{}", committed as i32));
            assert_eq!(super::chunk(job, chunk, committed), seal);
        }
    }
}
