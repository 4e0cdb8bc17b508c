//! A job's items read against their rows now, a batch at a time: what
//! register_remainder and register_revert approve again.
//!
//! The items come from a statement over the job's own tables, read as the extension's
//! owner through a cursor; each batch is bound, as arrays, to one statement over the
//! target, run as the caller, which says for each item what becomes of it.

use super::definition::Definition;
use super::target::Target;
use crate::error::Result;
use crate::installed;
use crate::query::{self, Cursor, Opaque, Row};
use crate::roles::as_role;
use pgrx::datum::DatumWithOid;

/// How many items are read against their rows at once.
const AT_ONCE: i64 = 1000;

/// One of the job's items, as the listing statement gives it.
pub struct Listed {
    pub position: i32,
    pub key: String,
    /// The revision (or digest) to expect; NULL for none.
    pub revision: Option<i64>,
    /// Its guards, as JSON text.
    pub guards: String,
}

/// Reads the items `listing` gives (SQL over the job's tables `{items}` and `{audit}`,
/// with `listing_args`: position, key, revision, guards, in position order), and binds
/// each batch to `against` as a chunk's statement binds its items: $1 and $2 NULL, $3 the
/// tenant, the job's `constants`, then the batch's keys, revisions and guards, then
/// `flags`. Hands each batch, with the rows `read` made of `against`'s, one an item in
/// order, to `visit`.
#[allow(clippy::too_many_arguments)]
pub fn each_batch<R>(
    def: &Definition,
    target: &Target,
    listing: &str,
    listing_args: Vec<DatumWithOid<'static>>,
    against: &str,
    constants: &[Opaque],
    flags: &[bool],
    read: impl Fn(&Row) -> Result<R>,
    mut visit: impl FnMut(Vec<Listed>, Vec<R>),
) -> Result<()> {
    let owner = installed::owner()?;
    let cursor = as_role(owner, || {
        Cursor::open(&def.tables.sql(listing), &listing_args)
    })?;
    loop {
        let batch = as_role(owner, || {
            cursor.fetch(AT_ONCE, |r| {
                Ok(Listed {
                    position: r.get::<i32>(1)?.unwrap_or_default(),
                    key: r.get::<String>(2)?.unwrap_or_default(),
                    revision: r.get::<i64>(3)?,
                    guards: r.get::<String>(4)?.unwrap_or_else(|| "{}".into()),
                })
            })
        })?;
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
                .map(|b| b.key.clone())
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
            query::rows(against, &args, 0, &read)
        })?;
        visit(batch, rows);
    }
    cursor.close();
    Ok(())
}
