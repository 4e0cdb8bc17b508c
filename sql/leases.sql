-- Leases: leadership as a row with a time to live, which works through any connection
-- pooler because it keeps no state in the session. The row is never deleted: its
-- generation only grows, so a fencing token is never handed out twice.

CREATE TABLE etc_batch.lease (
    name        text        PRIMARY KEY CHECK (name <> ''),
    holder      text        NOT NULL CHECK (holder <> ''),
    generation  bigint      NOT NULL CHECK (generation > 0),
    acquired_at timestamptz NOT NULL,
    renewed_at  timestamptz NOT NULL,
    expires_at  timestamptz NOT NULL
);

COMMENT ON TABLE etc_batch.lease IS
    'One row per lease: who holds it, its generation (the fencing token, raised by one at every change of holder or after an expiry), and when it expires, by the server clock.';

SELECT pg_catalog.pg_extension_config_dump('etc_batch.lease', '');
REVOKE ALL ON etc_batch.lease FROM PUBLIC;

CREATE VIEW etc_batch.leases AS
SELECT l.name, l.holder, l.generation,
       l.acquired_at AS acquired,
       l.renewed_at AS renewed,
       l.expires_at OPERATOR(pg_catalog.-) pg_catalog.clock_timestamp() AS expires_in,
       l.expires_at OPERATOR(pg_catalog.<=) pg_catalog.clock_timestamp() AS expired
  FROM etc_batch.lease l;

COMMENT ON VIEW etc_batch.leases IS
    'Every lease: its holder, generation, when it was acquired and renewed, and how long until it expires (negative once expired).';
REVOKE ALL ON etc_batch.leases FROM PUBLIC;
