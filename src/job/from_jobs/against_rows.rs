//! A job's items read against their rows now, a batch at a time: what
//! register_remainder and register_revert approve again, and what they leave out.
//!
//! The items come from a statement over the job's own tables, read as the extension's
//! owner through a cursor; each batch is bound, as arrays, to one statement over the
//! target, run as the caller, which says for each item what becomes of it.
//!
//! Every item read ends in exactly one place: the new approval, or
//! etc_batch.job_left_out with the reason it was left out, counted in a NOTICE.

use crate::error::Result;
use crate::installed;
use crate::job::definition::Definition;
use crate::job::target::Target;
use crate::query::{self, Cursor, Opaque};
use crate::roles::as_role;
use pgrx::datum::DatumWithOid;
use pgrx::{PgLogLevel, PgSqlErrorCode};

/// How many items are read against their rows at once.
const AT_ONCE: i64 = 1000;

query::row_reader! {
    /// One of the job's items, as the listing statement gives it.
    pub struct Listed {
        pub position: i32 = 0,
        pub item_key: String = String::new(),
        /// The revision (or digest) to expect; NULL for none.
        pub revision: Option<i64>,
        /// Its guards, as JSON text.
        pub guards: String = "{}".into(),
    }
}

query::row_reader! {
    /// An item against its row, as `batch_sql` gives it.
    struct AgainstRow {
        state: String = String::new(),
        approved: Option<String>,
    }
}

/// A job's items read against their rows now: those approved again, each with its
/// position, in position order; and those left out, with why.
#[derive(Default)]
pub struct Sorted {
    pub approved: Vec<(i32, String)>,
    pub left_out: Vec<LeftOut>,
}

impl Sorted {
    /// How many were left out `because`.
    pub fn count(&self, because: LeftOutBecause) -> i32 {
        count(&self.left_out, because)
    }
}

/// Reads the items `listing` gives (SQL over the job's tables `{items}` and `{audit}`,
/// with `listing_args`: position, key, revision, guards, in position order), and binds
/// each batch to `against` as a chunk's statement binds its items: $1 and $2 NULL, $3 the
/// tenant, the job's `constants`, then the batch's keys, revisions and guards, then
/// `flags`. `against` gives a row an item, in order: its state (state_sql) and its item
/// object to approve again, or NULL to leave it out.
pub fn sort(
    def: &Definition,
    target: &Target,
    listing: &str,
    listing_args: Vec<DatumWithOid<'static>>,
    against: &str,
    constants: &[Opaque],
    flags: &[bool],
) -> Result<Sorted> {
    let mut sorted = Sorted::default();
    let owner = installed::owner()?;
    let cursor = as_role(owner, || {
        Cursor::open(&def.tables.sql(listing), &listing_args)
    })?;
    loop {
        let batch = as_role(owner, || cursor.fetch(AT_ONCE, Listed::read))?;
        if batch.is_empty() {
            break;
        }
        let mut args: Vec<DatumWithOid> = vec![
            DatumWithOid::null::<i32>(),
            DatumWithOid::null::<i32>(),
            def.tenant_value().into(),
        ];
        args.extend(constants.iter().map(Opaque::arg));
        args.push(
            batch
                .iter()
                .map(|b| b.item_key.clone())
                .collect::<Vec<_>>()
                .into(),
        );
        args.push(batch.iter().map(|b| b.revision).collect::<Vec<_>>().into());
        args.push(
            batch
                .iter()
                .map(|b| b.guards.clone())
                .collect::<Vec<_>>()
                .into(),
        );
        args.extend(flags.iter().map(|&f| DatumWithOid::from(f)));
        let rows = crate::settings::stable_output_if(target.shape.reads_rows_as_text(), || {
            query::rows(against, &args, 0, AgainstRow::read)
        })?;
        for (item, AgainstRow { state, approved }) in batch.into_iter().zip(rows) {
            match approved {
                Some(approved) => sorted.approved.push((item.position, approved)),
                None => sorted.left_out.push(LeftOut {
                    position: item.position,
                    key: item.item_key,
                    because: LeftOutBecause::of_state(&state),
                }),
            }
        }
    }
    cursor.close();
    Ok(sorted)
}

/// Why an item of a job was left out of an approval made from it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LeftOutBecause {
    /// Its row no longer holds what the new approval would expect of it.
    Drifted,
    /// No row has its key any more.
    Gone,
    /// Its key now names a row of another tenant than the job's.
    AnotherTenant,
    /// For a restore: a row has its key again, which the row put back would take.
    Taken,
}

impl LeftOutBecause {
    /// Its text in etc_batch.job_left_out and in what the state SQL gives.
    pub fn as_str(self) -> &'static str {
        match self {
            LeftOutBecause::Drifted => "drifted",
            LeftOutBecause::Gone => "gone",
            LeftOutBecause::AnotherTenant => "another tenant",
            LeftOutBecause::Taken => "taken",
        }
    }

    /// The state `state_sql` gave an item that is not approved again.
    pub fn of_state(state: &str) -> LeftOutBecause {
        match state {
            "gone" => LeftOutBecause::Gone,
            "another tenant" => LeftOutBecause::AnotherTenant,
            "taken" => LeftOutBecause::Taken,
            _ => LeftOutBecause::Drifted,
        }
    }

    pub const ALL: [LeftOutBecause; 4] = [
        LeftOutBecause::Drifted,
        LeftOutBecause::Gone,
        LeftOutBecause::AnotherTenant,
        LeftOutBecause::Taken,
    ];
}

/// An item of a job left out of an approval made from it: its position in the job, its
/// key and why.
pub struct LeftOut {
    pub position: i32,
    pub key: String,
    pub because: LeftOutBecause,
}

/// How many of `left_out` were left out for `because`.
pub fn count(left_out: &[LeftOut], because: LeftOutBecause) -> i32 {
    left_out.iter().filter(|l| l.because == because).count() as i32
}

/// SQL: a batch of items, bound as arrays from parameter `first` on (keys, revisions,
/// guards), each against its row `t` now, in order: its state (state_sql, `matches`
/// being whether the row is as the new approval wants it) and `approved`, an expression
/// over the item `it`, the row `t` and the state `m.state`: the item object to approve,
/// or NULL to leave it out. $3 the tenant.
pub fn batch_sql(target: &Target, first: usize, matches: &str, approved: &str) -> String {
    let s = &target.shape;
    let mut names: Vec<String> = target.tenant_condition("$3").into_iter().collect();
    names.push(s.key.matches("it.item_key", &s.columns));
    format!(
        "SELECT m.state,
       {approved} AS approved
  FROM ROWS FROM (pg_catalog.unnest(${first}::pg_catalog.text[]),
                  pg_catalog.unnest(${}::pg_catalog.int8[]),
                  pg_catalog.unnest(${}::pg_catalog.text[]::pg_catalog.jsonb[]))
       WITH ORDINALITY AS it(item_key, revision, guards, n)
  LEFT JOIN {name} AS t ON {names}
 CROSS JOIN LATERAL (SELECT {state} AS state) m
 ORDER BY it.n",
        first + 1,
        first + 2,
        name = target.sql_name,
        names = names.join(" AND "),
        state = state_sql(target, &format!("COALESCE({matches}, false)")),
    )
}

/// SQL: the state of an item against its row `t` of the target, joined by the item's key
/// and the job's tenant: 'gone' or 'another tenant' when there is no such row, `again`
/// when the row is as `matches` (a boolean expression over it) wants, else 'drifted'.
pub fn state_sql(target: &Target, matches: &str) -> String {
    let s = &target.shape;
    let present = format!("t.{}", pgrx::spi::quote_identifier(&s.key.columns()[0]));
    let missing = match s.tenant_column {
        // the tenant is part of the join: a row that has the key under another tenant
        // is not the job's, and is named as what it is
        Some(_) => format!(
            "CASE WHEN EXISTS (SELECT FROM {name} AS t WHERE {key}) THEN 'another tenant' ELSE 'gone' END",
            name = target.sql_name,
            key = s.key.matches("it.item_key", &s.columns)
        ),
        None => "'gone'".to_string(),
    };
    format!(
        "CASE WHEN {present} IS NULL THEN {missing} WHEN {matches} THEN 'again' ELSE 'drifted' END"
    )
}

/// Records the items of `job` that `approval` (the job registered from its items) left
/// out, each with its reason, in etc_batch.job_left_out, and tells the caller how many,
/// by reason, with `hint` where there is something to do about them.
pub fn leave_out(
    approval: &str,
    job: &str,
    left_out: &[LeftOut],
    hint: Option<String>,
) -> Result<()> {
    if left_out.is_empty() {
        return Ok(());
    }
    let owner = installed::owner()?;
    as_role(owner, || {
        query::run(
            crate::job::sql::LEAVE_OUT,
            &[
                approval.into(),
                left_out
                    .iter()
                    .map(|l| l.position)
                    .collect::<Vec<_>>()
                    .into(),
                left_out
                    .iter()
                    .map(|l| l.key.clone())
                    .collect::<Vec<_>>()
                    .into(),
                left_out
                    .iter()
                    .map(|l| l.because.as_str().to_string())
                    .collect::<Vec<_>>()
                    .into(),
            ],
        )
    })?;
    let detail = format!(
        "{} \"etc_batch.job_left_out\" names each of them, with job_id {}.",
        left_out_counts(left_out),
        pgrx::spi::quote_literal(approval)
    );
    let message = format!(
        "job \"{approval}\" leaves out {} of job \"{job}\"",
        items(left_out.len())
    );
    let mut report = pgrx::pg_sys::panic::ErrorReport::new(
        PgSqlErrorCode::ERRCODE_SUCCESSFUL_COMPLETION,
        message,
        "etc_batch",
    )
    .set_detail(detail);
    if let Some(hint) = hint {
        report = report.set_hint(hint);
    }
    report.report(PgLogLevel::NOTICE);
    Ok(())
}

/// "1 item" or "n items".
fn items(n: usize) -> String {
    if n == 1 {
        "1 item".into()
    } else {
        format!("{n} items")
    }
}

/// The counts of `left_out` by reason, as a sentence: "Drifted: 2; gone: 1."
fn left_out_counts(left_out: &[LeftOut]) -> String {
    let parts: Vec<String> = LeftOutBecause::ALL
        .iter()
        .map(|&b| (b, count(left_out, b)))
        .filter(|(_, n)| *n > 0)
        .map(|(b, n)| format!("{}: {n}", b.as_str()))
        .collect();
    let mut sentence = parts.join("; ");
    if let Some(first) = sentence.get_mut(0..1) {
        first.make_ascii_uppercase();
    }
    format!("{sentence}.")
}
