"""Each kind of change against the loop a DBA writes by hand for the same work.

The same table each time: events(id bigint PRIMARY KEY, at timestamptz, status text,
body text, total numeric(10,2), total_cents bigint, customer_id int, region text),
2 x N rows of which N (every other id) are 'old' and are changed, beside customers
(customer_id int PRIMARY KEY, region text), 1,000 of them, every event's customer one of
them; total_cents and region start empty. For every kind, at chunks of 100 and 1,000,
three drains of the same N rows, back to back in an order that turns from repetition to
repetition, each on the table as it was at the start:

  etc_batch  register_job_from_query (the old rows, guarded by `expect` on the status,
             no revision column) and drain_job, timed together
  by hand    the competent PL/pgSQL keyset loop, with an audit: per chunk the next keys
             in key order, the change, one audit row per row changed with what it was
             (a deleted row's whole content, a changed column's value before), COMMIT
  bare       the same loop without the audit

Kinds measured here:
  delete       the loop: DELETE ... RETURNING into the audit
  move         the loop as pt-archiver copies then deletes: INSERT INTO the archive
               SELECT, then the DELETE, then the audit
  expressions  a computed backfill, total_cents = round(total * 100)::bigint: one UPDATE
               a chunk, its value before read FOR UPDATE in the same statement (what
               RETURNING old says from PostgreSQL 18 on)
  from_query   a backfill from a join, region = the customer's: one UPDATE ... FROM
               customers a chunk, the value before read as for expressions
  handler      a function kinds.ship(item jsonb) that ships one event and returns its
               row, called once per row: the loop locks the chunk's rows FOR UPDATE
               (what it records as before must be what ship changed) and calls it for
               each, the audit one INSERT a chunk
A fourth method, measured the same way, is no alternative a DBA would write but a bound:

  floor      the least plain SQL that keeps etc_batch's promise: the items query's keys
             (and, for a backfill from a join, each item's value) frozen at registration
             into one row per chunk of native arrays; then per chunk one statement that
             changes the rows of that frozen list still as approved (the guard) and keeps
             what they were (a deleted or moved row whole, a value before) as one row per
             chunk, COMMIT. No fingerprint, checkpoint, claim, progress or conflict
             report: what etc_batch does on top of it. Floor over by hand is the most a
             registration plus drain of a frozen list can reach against the loop.

A ratio is the median of the repetitions' own (etc_batch's rows per second over the
other's); with it the WAL each writes per row.
"""

import time

from common import connect, lsn, summary, wal_since

CHUNKS = (100, 1000)
KINDS = ("delete", "move", "expressions", "from_query", "handler")
METHODS = ("etc_batch", "by hand", "bare", "floor")

# each kind's approval: the items query and the change, the rest of the registration
# the same for all (the old rows, expect on the status, guard => 'columns')
OLD = "SELECT id FROM events WHERE status = ''old''"
APPROVALS = {
    "delete": (OLD, "action => 'delete'"),
    "move": (OLD, "action => 'move', archive => 'events_archive'"),
    "expressions": (OLD, "set_expressions => '{\"total_cents\": \"round(total * 100)::bigint\"}'"),
    "from_query": ("SELECT e.id, c.region FROM events e JOIN customers c USING (customer_id) "
                   "WHERE e.status = ''old''", "set_from_query => '{region}'"),
    "handler": (OLD, "handler => 'kinds.ship(jsonb)'"),
}
# each kind's hand-written loop, called with the chunk and whether it keeps the audit
LOOP_CALLS = {
    "delete": "CALL kinds.purge(%s, false, %s)",
    "move": "CALL kinds.purge(%s, true, %s)",
    "expressions": "CALL kinds.backfill_total_cents(%s, %s)",
    "from_query": "CALL kinds.backfill_region(%s, %s)",
    "handler": "CALL kinds.ship_old(%s, %s)",
}
# what must hold after a drain of each kind: 0 rows wrong, whoever drained
WRONG = {
    "delete": "SELECT count(*) FROM events WHERE status = 'old'",
    "move": "SELECT count(*) FROM events WHERE status = 'old'",
    "expressions": "SELECT count(*) FROM events WHERE total_cents IS DISTINCT FROM "
                   "CASE WHEN status = 'old' THEN round(total * 100)::bigint END",
    "from_query": "SELECT count(*) FROM events e JOIN customers c USING (customer_id) "
                  "WHERE e.region IS DISTINCT FROM CASE WHEN e.status = 'old' THEN c.region END",
    "handler": "SELECT count(*) FROM events WHERE status = 'old'",
}

LOOPS = """
CREATE SCHEMA IF NOT EXISTS kinds;
CREATE TABLE IF NOT EXISTS kinds.audit (
    id bigint, row_before text, txid bigint, committed_at timestamptz);

-- by hand: a keyset loop, the next chunk of old rows in key order, deleted (moved:
-- copied to the archive first), each row's content kept in the audit, COMMIT
CREATE OR REPLACE PROCEDURE kinds.purge(p_chunk int, p_move boolean, p_audit boolean)
LANGUAGE plpgsql AS $$
DECLARE
    v_last bigint := 0;
    v_upto bigint;
BEGIN
    LOOP
        SELECT max(id) INTO v_upto
          FROM (SELECT id FROM public.events WHERE id > v_last AND status = 'old'
                 ORDER BY id LIMIT p_chunk) s;
        EXIT WHEN v_upto IS NULL;
        IF p_move THEN
            INSERT INTO public.events_archive
                   (id, at, status, body, total, total_cents, customer_id, region)
            SELECT id, at, status, body, total, total_cents, customer_id, region
              FROM public.events
             WHERE id > v_last AND id <= v_upto AND status = 'old';
        END IF;
        IF p_audit THEN
            WITH d AS (
                DELETE FROM public.events e WHERE id > v_last AND id <= v_upto AND status = 'old'
                RETURNING e.id, e::text AS row_before)
            INSERT INTO kinds.audit SELECT d.id, d.row_before, txid_current(), now() FROM d;
        ELSE
            DELETE FROM public.events WHERE id > v_last AND id <= v_upto AND status = 'old';
        END IF;
        v_last := v_upto;
        COMMIT;
    END LOOP;
END $$;

-- by hand: the same loop, the chunk's total_cents computed in one UPDATE; the value
-- each row held before is read FOR UPDATE in the same statement, so that the audit
-- says what the UPDATE overwrote (RETURNING gives only the new value before 18). The
-- keyset bounds are said of the updated table too: without them the planner may join
-- the chunk to a scan of the whole table
CREATE OR REPLACE PROCEDURE kinds.backfill_total_cents(p_chunk int, p_audit boolean)
LANGUAGE plpgsql AS $$
DECLARE
    v_last bigint := 0;
    v_upto bigint;
BEGIN
    LOOP
        SELECT max(id) INTO v_upto
          FROM (SELECT id FROM public.events WHERE id > v_last AND status = 'old'
                 ORDER BY id LIMIT p_chunk) s;
        EXIT WHEN v_upto IS NULL;
        IF p_audit THEN
            WITH u AS (
                UPDATE public.events e SET total_cents = round(e.total * 100)::bigint
                  FROM (SELECT id, total_cents FROM public.events
                         WHERE id > v_last AND id <= v_upto AND status = 'old' FOR UPDATE) old
                 WHERE e.id = old.id AND e.id > v_last AND e.id <= v_upto
                RETURNING e.id, old.total_cents::text AS row_before)
            INSERT INTO kinds.audit SELECT u.id, u.row_before, txid_current(), now() FROM u;
        ELSE
            UPDATE public.events SET total_cents = round(total * 100)::bigint
             WHERE id > v_last AND id <= v_upto AND status = 'old';
        END IF;
        v_last := v_upto;
        COMMIT;
    END LOOP;
END $$;

-- by hand: the same loop, the chunk's region read from customers in one UPDATE ... FROM
-- (GitLab's batched background migration's shape), the value before as above
CREATE OR REPLACE PROCEDURE kinds.backfill_region(p_chunk int, p_audit boolean)
LANGUAGE plpgsql AS $$
DECLARE
    v_last bigint := 0;
    v_upto bigint;
BEGIN
    LOOP
        SELECT max(id) INTO v_upto
          FROM (SELECT id FROM public.events WHERE id > v_last AND status = 'old'
                 ORDER BY id LIMIT p_chunk) s;
        EXIT WHEN v_upto IS NULL;
        IF p_audit THEN
            WITH u AS (
                UPDATE public.events e SET region = c.region
                  FROM public.customers c,
                       (SELECT id, region FROM public.events
                         WHERE id > v_last AND id <= v_upto AND status = 'old' FOR UPDATE) old
                 WHERE e.id = old.id AND e.id > v_last AND e.id <= v_upto
                   AND c.customer_id = e.customer_id
                RETURNING e.id, old.region AS row_before)
            INSERT INTO kinds.audit SELECT u.id, u.row_before, txid_current(), now() FROM u;
        ELSE
            UPDATE public.events e SET region = c.region
              FROM public.customers c
             WHERE c.customer_id = e.customer_id
               AND e.id > v_last AND e.id <= v_upto AND e.status = 'old';
        END IF;
        v_last := v_upto;
        COMMIT;
    END LOOP;
END $$;

-- the handler both drains call: ships one event, returns its row as it left it (what
-- etc_batch asks of a handler: any non-NULL jsonb, NULL to refuse the item)
CREATE OR REPLACE FUNCTION kinds.ship(item jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE r jsonb;
BEGIN
    UPDATE public.events SET status = 'shipped' WHERE id = (item->>'id')::bigint
    RETURNING to_jsonb(events.*) INTO r;
    RETURN r;
END $$;

-- by hand: the same loop, the chunk's rows locked in key order and ship called for
-- each; the audit, what each row's status was, one INSERT a chunk. The bare loop
-- locks nothing: what it would record is what the lock keeps true
CREATE OR REPLACE PROCEDURE kinds.ship_old(p_chunk int, p_audit boolean)
LANGUAGE plpgsql AS $$
DECLARE
    v_last bigint := 0;
    v_upto bigint;
    v_ids bigint[];
    v_before text[];
    r record;
BEGIN
    LOOP
        SELECT max(id) INTO v_upto
          FROM (SELECT id FROM public.events WHERE id > v_last AND status = 'old'
                 ORDER BY id LIMIT p_chunk) s;
        EXIT WHEN v_upto IS NULL;
        IF p_audit THEN
            v_ids := '{}';
            v_before := '{}';
            FOR r IN SELECT id, status FROM public.events
                      WHERE id > v_last AND id <= v_upto AND status = 'old'
                      ORDER BY id FOR UPDATE LOOP
                IF kinds.ship(jsonb_build_object('id', r.id)) IS NULL THEN
                    RAISE EXCEPTION 'ship refused event %', r.id;
                END IF;
                v_ids := v_ids || r.id;
                v_before := v_before || r.status;
            END LOOP;
            INSERT INTO kinds.audit
            SELECT u.id, u.row_before, txid_current(), now()
              FROM unnest(v_ids, v_before) AS u(id, row_before);
        ELSE
            FOR r IN SELECT id FROM public.events
                      WHERE id > v_last AND id <= v_upto AND status = 'old' ORDER BY id LOOP
                IF kinds.ship(jsonb_build_object('id', r.id)) IS NULL THEN
                    RAISE EXCEPTION 'ship refused event %', r.id;
                END IF;
            END LOOP;
        END IF;
        v_last := v_upto;
        COMMIT;
    END LOOP;
END $$;

-- floor: the approval frozen, one row per chunk of native arrays: the keys in key order
-- and, for a backfill from a join, each item's value
CREATE TABLE IF NOT EXISTS kinds.frozen (c int PRIMARY KEY, keys bigint[], vals text[]);
-- floor: what a chunk's change found, one row per chunk
CREATE TABLE IF NOT EXISTS kinds.kept (c int PRIMARY KEY, kept text[]);

CREATE OR REPLACE PROCEDURE kinds.floor_freeze(p_chunk int, p_from_join boolean)
LANGUAGE plpgsql AS $$
BEGIN
    TRUNCATE kinds.frozen, kinds.kept;
    IF p_from_join THEN
        INSERT INTO kinds.frozen
        SELECT c, array_agg(id ORDER BY id), array_agg(region ORDER BY id)
          FROM (SELECT e.id, c.region, (row_number() OVER (ORDER BY e.id) - 1) / p_chunk AS c
                  FROM public.events e JOIN public.customers c USING (customer_id)
                 WHERE e.status = 'old') s
         GROUP BY c;
    ELSE
        INSERT INTO kinds.frozen
        SELECT c, array_agg(id ORDER BY id), NULL
          FROM (SELECT id, (row_number() OVER (ORDER BY id) - 1) / p_chunk AS c
                  FROM public.events WHERE status = 'old') s
         GROUP BY c;
    END IF;
    COMMIT;
END $$;

CREATE OR REPLACE PROCEDURE kinds.floor_drain(p_kind text)
LANGUAGE plpgsql AS $$
DECLARE
    v_c int := 0;
    v_keys bigint[];
    v_vals text[];
    v_before text[];
    v_lo bigint;
    v_hi bigint;
    r record;
BEGIN
    LOOP
        SELECT keys, vals INTO v_keys, v_vals FROM kinds.frozen WHERE c = v_c;
        EXIT WHEN v_keys IS NULL;
        -- the chunk's key range beside its keys, as the loop by hand has it: without it
        -- the planner may join the chunk to a scan of the whole table
        v_lo := v_keys[1];
        v_hi := v_keys[cardinality(v_keys)];
        IF p_kind = 'delete' THEN
            WITH d AS (DELETE FROM public.events e
                        WHERE e.id = ANY (v_keys) AND e.id BETWEEN v_lo AND v_hi
                          AND e.status = 'old'
                       RETURNING e::text AS was)
            INSERT INTO kinds.kept SELECT v_c, array_agg(was) FROM d;
        ELSIF p_kind = 'move' THEN
            WITH d AS (DELETE FROM public.events e
                        WHERE e.id = ANY (v_keys) AND e.id BETWEEN v_lo AND v_hi
                          AND e.status = 'old'
                       RETURNING e.*, e::text AS was),
                 a AS (INSERT INTO public.events_archive
                              (id, at, status, body, total, total_cents, customer_id, region)
                       SELECT id, at, status, body, total, total_cents, customer_id, region FROM d)
            INSERT INTO kinds.kept SELECT v_c, array_agg(was) FROM d;
        ELSIF p_kind = 'expressions' THEN
            WITH u AS (
                UPDATE public.events e SET total_cents = round(e.total * 100)::bigint
                  FROM (SELECT id, total_cents FROM public.events
                         WHERE id = ANY (v_keys) AND id BETWEEN v_lo AND v_hi
                           AND status = 'old' FOR UPDATE) old
                 WHERE e.id = old.id AND e.id BETWEEN v_lo AND v_hi
                RETURNING old.total_cents::text AS was)
            INSERT INTO kinds.kept SELECT v_c, array_agg(was) FROM u;
        ELSIF p_kind = 'from_query' THEN
            WITH u AS (
                UPDATE public.events e SET region = old.val
                  FROM (SELECT x.id, x.region, v.val
                          FROM unnest(v_keys, v_vals) AS v(k, val)
                          JOIN public.events x ON x.id = v.k
                         WHERE x.id BETWEEN v_lo AND v_hi AND x.status = 'old'
                           FOR UPDATE OF x) old
                 WHERE e.id = old.id AND e.id BETWEEN v_lo AND v_hi
                RETURNING old.region AS was)
            INSERT INTO kinds.kept SELECT v_c, array_agg(was) FROM u;
        ELSE
            v_before := '{}';
            FOR r IN SELECT id, status FROM public.events
                      WHERE id = ANY (v_keys) AND id BETWEEN v_lo AND v_hi AND status = 'old'
                      ORDER BY id FOR UPDATE LOOP
                IF kinds.ship(jsonb_build_object('id', r.id)) IS NULL THEN
                    RAISE EXCEPTION 'ship refused event %', r.id;
                END IF;
                v_before := v_before || r.status;
            END LOOP;
            INSERT INTO kinds.kept VALUES (v_c, v_before);
        END IF;
        v_c := v_c + 1;
        COMMIT;
    END LOOP;
END $$;
"""


def fresh(c, rows):
    c.execute("DROP TABLE IF EXISTS events, events_archive, customers")
    c.execute("CREATE TABLE customers (customer_id int PRIMARY KEY, region text NOT NULL)")
    c.execute("INSERT INTO customers SELECT g, (ARRAY['eu', 'us', 'apac'])[1 + g % 3] "
              "FROM generate_series(1, 1000) g")
    c.execute("CREATE TABLE events (id bigint PRIMARY KEY, at timestamptz NOT NULL, "
              "status text NOT NULL, body text NOT NULL, total numeric(10,2) NOT NULL, "
              "total_cents bigint, customer_id int NOT NULL, region text)")
    c.execute("INSERT INTO events SELECT g, timestamptz '2026-01-01' + g * interval '1 second', "
              "CASE WHEN g %% 2 = 0 THEN 'old' ELSE 'new' END, repeat(md5(g::text), 3), "
              "(g %% 100000) / 100.0 + 0.99, NULL, g %% 1000 + 1, NULL "
              "FROM generate_series(1, %s) g", (2 * rows,))
    c.execute("CREATE TABLE events_archive (id bigint, at timestamptz, status text, body text, "
              "total numeric(10,2), total_cents bigint, customer_id int, region text, "
              "archived_at timestamptz NOT NULL DEFAULT now())")
    c.execute("TRUNCATE kinds.audit")
    c.execute("VACUUM ANALYZE customers")
    c.execute("VACUUM ANALYZE events")
    c.execute("CHECKPOINT")


def drain(db, kind, method, chunk, rows):
    """Rows per second and WAL bytes per row of one drain of the old rows."""
    with connect(db) as c:
        fresh(c, rows)
        start = lsn(c)
        t = time.perf_counter()
        if method == "etc_batch":
            job = f"{kind}-{chunk}-{time.monotonic_ns()}"
            items, change = APPROVALS[kind]
            c.execute(
                f"SELECT etc_batch.register_job_from_query(%s, NULL, 'events', '{items}', %s, NULL, "
                "'{\"status\": \"old\"}', tenant_column => NULL, revision_column => NULL, "
                f"guard => 'columns', {change})",
                (job, chunk))
            status = c.execute("CALL etc_batch.drain_job(%s)", (job,)).fetchone()[4]
            assert status == "done", status
        elif method == "floor":
            c.execute("CALL kinds.floor_freeze(%s, %s)", (chunk, kind == "from_query"))
            c.execute("CALL kinds.floor_drain(%s)", (kind,))
        else:
            c.execute(LOOP_CALLS[kind], (chunk, method == "by hand"))
        seconds = time.perf_counter() - t
        wal = wal_since(c, start)
        wrong, archived, audited = c.execute(
            f"SELECT ({WRONG[kind]}), (SELECT count(*) FROM events_archive), "
            "(SELECT count(*) FROM kinds.audit)").fetchone()
        assert wrong == 0 and archived == (rows if kind == "move" else 0), (wrong, archived)
        assert audited == (rows if method == "by hand" else 0), audited
        if method == "floor":
            kept = c.execute("SELECT sum(cardinality(kept)) FROM kinds.kept").fetchone()[0]
            assert kept == rows, kept
        assert c.execute("SELECT count(*) FROM events").fetchone()[0] == (
            rows if kind in ("delete", "move") else 2 * rows)
    return rows / seconds, wal / rows


def measure(db, rows, reps):
    with connect(db) as c:
        c.execute(LOOPS)
    out = {"rows": rows, "reps": reps}
    for kind in KINDS:
        out[kind] = {}
        for chunk in CHUNKS:
            rate = {m: [] for m in METHODS}
            wal = {m: [] for m in METHODS}
            for rep in range(reps):
                order = METHODS[rep % len(METHODS):] + METHODS[:rep % len(METHODS)]
                for m in order:
                    r, w = drain(db, kind, m, chunk, rows)
                    rate[m].append(r)
                    wal[m].append(w)
                print(f"kinds {kind} chunk={chunk} rep={rep + 1}: "
                      + ", ".join(f"{m} {rate[m][-1]:,.0f} rows/s" for m in METHODS), flush=True)
            out[kind][str(chunk)] = {
                "rows_per_s": {m: summary(v) for m, v in rate.items()},
                "wal_per_row": {m: summary(v) for m, v in wal.items()},
                "over_by_hand": summary([e / h for e, h in zip(rate["etc_batch"], rate["by hand"])]),
                "over_bare": summary([e / b for e, b in zip(rate["etc_batch"], rate["bare"])]),
                "over_floor": summary([e / f for e, f in zip(rate["etc_batch"], rate["floor"])]),
                "floor_over_by_hand": summary([f / h for f, h in zip(rate["floor"], rate["by hand"])]),
            }
    with connect(db) as c:
        c.execute("DROP TABLE IF EXISTS events, events_archive, customers")
        c.execute("DROP SCHEMA kinds CASCADE")
    return out
