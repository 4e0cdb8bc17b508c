//! A chunk that changed fewer rows than it has items: rolled back, then explained in the
//! next transaction, the job's lock taken again: skipped items (on_drift 'skip'), a
//! conflict named by its first item, or a frozen list found short (corrupt).

use super::drainer::Drainer;
use super::ending::Round;
use crate::error::{BatchError, Result};
use crate::job::change::{item_values, KindOfChange};
use crate::job::rules::approval::{parse_object, OnDrift};
use crate::job::rules::conflict::{self, Expected};
use crate::job::run::checkpoint;
use crate::job::run::chunk::Recheck;
use crate::query;
use crate::status::JobStatus;
use pgrx::datum::DatumWithOid;
use serde_json::Value;
use std::ops::Range;

impl Drainer {
    /// After a chunk was rolled back because fewer rows matched than it has items, in
    /// the next transaction: if nothing moved meanwhile, what stopped it is recorded and
    /// returned as the error to raise once that is committed; if another drainer
    /// committed the chunk, this one goes on; if another stopped the job, its record
    /// stands.
    pub(super) fn after_mismatch(
        &self,
        range: &Range<i32>,
        known: Option<i32>,
    ) -> Result<Option<BatchError>> {
        if let Some(fence) = &self.fence {
            self.owner(|| fence.check())?;
        }
        let round = match self.owner(|| self.order.recheck(&self.def, range))? {
            Recheck::Record => self.record_mismatch(range, known)?,
            Recheck::Again => return Ok(None),
            Recheck::Stopped(status) => Round::Stopped(self.stopped(status)?),
        };
        match round {
            Round::Stopped(error) => Ok(Some(error)),
            _ => Ok(None),
        }
    }

    /// The items of the chunk `range` that its change left unchanged, each with the row
    /// it names now (JSON null: gone), for a job that skips them; None when the frozen
    /// list does not hold every position of the chunk.
    pub(super) fn skipped(
        &self,
        range: &Range<i32>,
        changed: &[(i32, Option<i64>)],
    ) -> Result<Option<Vec<(i32, String)>>> {
        if self.def.on_drift == OnDrift::Stop || !self.items_all_there(range)? {
            return Ok(None);
        }
        let mut done: Vec<i32> = changed.iter().map(|(p, _)| *p).collect();
        done.sort_unstable();
        let mut skipped = Vec::new();
        for position in range.clone().filter(|p| done.binary_search(p).is_err()) {
            let (key, ..) = self.item(position)?;
            let row = self.as_author(|| {
                query::one::<String>(&self.row_sql, &[self.def.tenant_value().into(), key.into()])
            })?;
            skipped.push((position, row.unwrap_or_else(|| "null".into())));
        }
        Ok(Some(skipped))
    }

    /// Whether the frozen list holds every position of the chunk `range`.
    pub(super) fn items_all_there(&self, range: &Range<i32>) -> Result<bool> {
        Ok(self.items_found(range)? == range.len() as i32)
    }

    /// How many approved items the frozen list holds at the positions of `range`.
    pub(super) fn items_found(&self, range: &Range<i32>) -> Result<i32> {
        let found = self.owner(|| {
            query::by_index(|| {
                query::one::<i32>(
                    &self.items_in_range_sql,
                    &[range.start.into(), range.end.into()],
                )
            })
        })?;
        Ok(found.unwrap_or(0))
    }

    /// The approved item at `position`: its key, revision and guards.
    pub(super) fn item(&self, position: i32) -> Result<(String, i64, String)> {
        self.owner(|| {
            query::row_reader! {
                struct Approved {
                    item_key: String = String::new(),
                    revision: i64 = 0,
                    guards: String = String::new(),
                }
            }
            query::row(&self.item_sql, &[position.into()], |r| {
                let item = Approved::read(r)?;
                Ok((item.item_key, item.revision, item.guards))
            })
        })?
        .ok_or_else(|| BatchError::Internal(format!("no approved item at position {position}")))
    }

    /// Records why a chunk changed fewer rows than it has items, in the transaction after
    /// it was rolled back: the frozen list is short (corrupt), or the first item that no
    /// longer matches its row (`known`, or found now) is a conflict.
    pub(super) fn record_mismatch(&self, range: &Range<i32>, known: Option<i32>) -> Result<Round> {
        let found = self.items_found(range)?;
        if found != range.len() as i32 {
            let reason = checkpoint::short_list(range, found as usize);
            return self.stop(JobStatus::Corrupt, &reason, Value::Null);
        }
        let position = match known {
            Some(position) => Some(position),
            None => self.first_mismatch(range)?,
        };
        self.conflict(position, range, known.is_some())
    }

    /// The first item of the chunk whose row no longer matches it.
    pub(super) fn first_mismatch(&self, range: &Range<i32>) -> Result<Option<i32>> {
        let mut args: Vec<DatumWithOid> = vec![
            range.start.into(),
            range.end.into(),
            self.def.tenant_value().into(),
        ];
        args.extend(self.constants.iter().map(query::Opaque::arg));
        self.as_author(|| query::one::<i32>(&self.mismatch_sql, &args))
    }

    /// Records and returns the conflict of the item at `position` (`refused`: the one its
    /// handler returned NULL for), or of the chunk when every item matches again by now.
    pub(super) fn conflict(
        &self,
        position: Option<i32>,
        range: &Range<i32>,
        refused: bool,
    ) -> Result<Round> {
        let Some(position) = position else {
            let detail = format!(
                "Positions {} to {} did not all match while their chunk ran, and match again now: they changed concurrently.",
                range.start,
                range.end - 1
            );
            return self.stop(JobStatus::Conflict, &detail, Value::Null);
        };
        let (key, revision, guards) = self.item(position)?;
        let row = self.as_author(|| {
            query::one::<String>(
                &self.row_sql,
                &[self.def.tenant_value().into(), key.as_str().into()],
            )
        })?;
        // what an item carries to set (set_from_items) is no guard, but what its row held
        // in those columns before the change, recorded with it, is (item_values.rs)
        let mut guards = parse_object(&guards);
        let before = guards.remove(item_values::BEFORE);
        guards.retain(|column, _| !self.def.set_from_items.contains(column));
        if let Some(Value::Object(before)) = before {
            guards.extend(before);
        }
        let expected = Expected {
            key: &key,
            position,
            item_count: self.def.item_count,
            tenant: self.def.tenant_value(),
            guard: &self.def.guard,
            revision,
            guards: &guards,
            expect: &self.def.expect,
            refused_by: self.def.handler.as_deref().filter(|_| refused),
        };
        // A row serde_json cannot read (a jsonb column nested deeper than it reads) is
        // reported as its text, so that the conflict is still recorded.
        let row = row.map(|text| serde_json::from_str(&text).unwrap_or(Value::String(text)));
        let (detail, problem) = match self.kind {
            KindOfChange::Restore => conflict::describe_restore(&expected, row.as_ref()),
            _ => conflict::describe(&expected, row.as_ref()),
        };
        self.stop(JobStatus::Conflict, &detail, problem)
    }
}
