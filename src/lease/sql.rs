//! The lease statements. As everywhere in etc_batch: schema-qualified names,
//! OPERATOR(pg_catalog.x), bound values, and the server's wall clock (pgrx's clock_timestamp(),
//! the clock SQL's clock_timestamp() reads) as the only clock, read once per statement.

/// Takes a free or expired lease (generation + 1), or renews the caller's own (same
/// generation). A lease held by someone else and unexpired is left alone, but its row is
/// still locked by ON CONFLICT, so the read that follows sees it as it is.
/// $1 name, $2 holder, $3 ttl, $4 the one instant the whole decision is made at:
/// several clock_timestamp() calls would each read a different microsecond.
pub const ACQUIRE: &str = "\
INSERT INTO etc_batch.lease AS l (name, holder, generation, acquired_at, renewed_at, expires_at)
VALUES ($1, $2, 1, $4::pg_catalog.timestamptz, $4,
        $4 OPERATOR(pg_catalog.+) $3)
ON CONFLICT (name) DO UPDATE
   SET generation = CASE WHEN l.holder OPERATOR(pg_catalog.=) EXCLUDED.holder
                          AND l.expires_at OPERATOR(pg_catalog.>) $4
                         THEN l.generation ELSE l.generation OPERATOR(pg_catalog.+) 1 END,
       acquired_at = CASE WHEN l.holder OPERATOR(pg_catalog.=) EXCLUDED.holder
                           AND l.expires_at OPERATOR(pg_catalog.>) $4
                          THEN l.acquired_at ELSE $4 END,
       holder = EXCLUDED.holder,
       renewed_at = $4,
       expires_at = $4 OPERATOR(pg_catalog.+) $3
 WHERE l.holder OPERATOR(pg_catalog.=) EXCLUDED.holder
    OR l.expires_at OPERATOR(pg_catalog.<=) $4
RETURNING l.holder, l.generation, l.expires_at";

/// The lease as it is now. $1 name.
pub const CURRENT: &str = "\
SELECT l.holder, l.generation, l.expires_at
  FROM etc_batch.lease l
 WHERE l.name OPERATOR(pg_catalog.=) $1";

/// Ends the caller's own unexpired lease now; the row and its generation stay.
/// $1 name, $2 holder, $3 now.
pub const RELEASE: &str = "\
UPDATE etc_batch.lease
   SET expires_at = $3::pg_catalog.timestamptz, renewed_at = $3
 WHERE name OPERATOR(pg_catalog.=) $1 AND holder OPERATOR(pg_catalog.=) $2
   AND expires_at OPERATOR(pg_catalog.>) $3
RETURNING generation";

/// The fence: the lease row, locked FOR SHARE so that nobody takes it over before the
/// transaction that checked it ends. $1 name.
pub const LOCK_LEASE: &str = "\
SELECT l.holder, l.generation, l.expires_at OPERATOR(pg_catalog.>) pg_catalog.clock_timestamp() AS live
  FROM etc_batch.lease l
 WHERE l.name OPERATOR(pg_catalog.=) $1
   FOR SHARE";

/// A ttl must be a positive interval. $1 ttl.
pub const TTL_IS_POSITIVE: &str = "\
SELECT $1::pg_catalog.interval OPERATOR(pg_catalog.>) '0'::pg_catalog.interval";
