//! Leases and fencing: leadership held as a row with a time to live, and the check that
//! stops a holder that lost its lease from committing more work.
//!
//! A lease changes hands only through one upsert that locks its row, so two holders at
//! once is impossible, whatever the interleaving; times come from the server clock
//! only. A fence check takes the lease row FOR SHARE in the transaction of the work it
//! guards: until that transaction ends, nobody can take the lease over, so a chunk or
//! a step that passed the check commits under a lease that was still held.

pub mod sql;

use crate::error::{non_empty, BatchError, Result};
use crate::query;
use pgrx::datum::clock_timestamp;

/// A holder's claim, as a process passes it along with its work.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fence {
    pub name: String,
    pub holder: String,
    pub generation: i64,
}

impl Fence {
    /// The fence from optional procedure arguments: all three or none.
    pub fn from_args(
        name: Option<String>,
        holder: Option<String>,
        generation: Option<i64>,
    ) -> Result<Option<Fence>> {
        match (name, holder, generation) {
            (None, None, None) => Ok(None),
            (Some(name), Some(holder), Some(generation)) => {
                check_name("lease_name", &name)?;
                check_name("lease_holder", &holder)?;
                Ok(Some(Fence {
                    name,
                    holder,
                    generation,
                }))
            }
            _ => Err(BatchError::invalid_because(
                "a lease is named by lease_name, lease_holder and lease_generation together",
                "Give all three, or none to run without fencing.",
            )),
        }
    }

    /// Raises the fencing error unless `holder` still holds generation `generation`,
    /// unexpired; on success the lease row stays locked FOR SHARE until the transaction
    /// ends. Run as the extension's owner.
    pub fn check(&self) -> Result<()> {
        let row = query::row(sql::LOCK_LEASE, &[self.name.clone().into()], Held::read)?;
        let detail = match row {
            None => format!("No lease named \"{}\" exists.", self.name),
            Some(Held {
                holder,
                generation,
                live,
            }) if holder == self.holder && generation == self.generation && live => return Ok(()),
            Some(Held {
                holder,
                generation,
                live: true,
            }) => {
                format!("It is held by \"{holder}\" at generation {generation}, unexpired.")
            }
            Some(Held {
                holder,
                generation,
                live: false,
            }) => {
                format!(
                    "It has expired; its last holder was \"{holder}\" at generation {generation}."
                )
            }
        };
        Err(BatchError::LeaseLost {
            name: self.name.clone(),
            holder: self.holder.clone(),
            generation: self.generation,
            detail,
        })
    }
}

/// Lease names and holders are non-empty.
pub fn check_name(argument: &'static str, value: &str) -> Result<()> {
    non_empty(value, argument)
}

/// What acquire_lease returns.
pub struct Acquired {
    pub acquired: bool,
    pub holder: String,
    pub generation: i64,
    pub expires_at: pgrx::datum::TimestampWithTimeZone,
}

query::row_reader! {
    /// A lease's row as ACQUIRE and CURRENT read it.
    struct Lease {
        holder: String = String::new(),
        generation: i64 = 0,
        expires_at: Option<pgrx::datum::TimestampWithTimeZone>,
    }
}

query::row_reader! {
    /// A lease's row as the fence (LOCK_LEASE) reads it.
    struct Held {
        holder: String = String::new(),
        generation: i64 = 0,
        /// Whether it is unexpired.
        live: bool = false,
    }
}

/// Takes or renews a lease, or reports who holds it.
pub fn acquire(name: &str, holder: &str, ttl: pgrx::datum::Interval) -> Result<Acquired> {
    check_name("name", name)?;
    check_name("holder", holder)?;
    if query::one::<bool>(sql::TTL_IS_POSITIVE, &[ttl.into()])? != Some(true) {
        return Err(BatchError::invalid_because(
            "ttl must be a positive interval",
            "A lease lives for ttl after each renewal.",
        ));
    }
    crate::roles::as_owner(|| {
        let args = [
            name.into(),
            holder.into(),
            ttl.into(),
            clock_timestamp().into(),
        ];
        let (acquired, row) = match query::row(sql::ACQUIRE, &args, Lease::read)? {
            Some(row) => (true, row),
            None => (
                false,
                query::row(sql::CURRENT, &[name.into()], Lease::read)?.ok_or_else(|| {
                    BatchError::Internal(format!("lease \"{name}\" vanished while it was locked"))
                })?,
            ),
        };
        let Lease {
            holder,
            generation,
            expires_at,
        } = row;
        Ok(Acquired {
            acquired,
            holder,
            generation,
            expires_at: expires_at
                .ok_or_else(|| BatchError::Internal("lease without expiry".into()))?,
        })
    })
}

/// Ends the caller's own lease now. false: it was the holder, but the lease had
/// already expired. An error: someone else holds it, or there is no such lease.
pub fn release(name: &str, holder: &str) -> Result<bool> {
    check_name("name", name)?;
    check_name("holder", holder)?;
    crate::roles::as_owner(|| {
        if query::one::<i64>(
            sql::RELEASE,
            &[name.into(), holder.into(), clock_timestamp().into()],
        )?
        .is_some()
        {
            return Ok(true);
        }
        match query::row(sql::CURRENT, &[name.into()], Lease::read)? {
            None => Err(BatchError::UnknownLease { name: name.into() }),
            Some(Lease {
                holder: current, ..
            }) if current == holder => Ok(false),
            Some(Lease {
                holder: current,
                generation,
                ..
            }) => Err(BatchError::LeaseNotHeld {
                name: name.into(),
                holder: holder.into(),
                detail: format!(
                    "It is held by \"{current}\" at generation {generation}; nothing was changed."
                ),
            }),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fences_come_whole_or_not_at_all() {
        assert_eq!(Fence::from_args(None, None, None), Ok(None));
        let f = Fence::from_args(Some("leader".into()), Some("w1".into()), Some(3))
            .unwrap()
            .unwrap();
        assert_eq!(f.generation, 3);
        assert!(Fence::from_args(Some("leader".into()), None, Some(3)).is_err());
        assert!(Fence::from_args(Some("".into()), Some("w1".into()), Some(3)).is_err());
        assert!(Fence::from_args(Some("leader".into()), Some(" ".into()), Some(3)).is_err());
    }
}
