-- What users would otherwise write, on the same data: the seed's approval drained by hand.
-- Loaded into the benchmark's database by bench/bench.py.

CREATE SCHEMA alt;

-- the same frozen approval etc_batch keeps in etc_batch.job_item, and the same checkpoint
CREATE TABLE alt.jobs (
    job_id     text PRIMARY KEY,
    tenant     text NOT NULL,
    chunk_size int  NOT NULL,
    item_count int  NOT NULL,
    next_index int  NOT NULL DEFAULT 0);
CREATE TABLE alt.job_items (
    job_id   text,
    position int,
    id       int,
    revision int,
    qty      int,
    PRIMARY KEY (job_id, position));
CREATE TABLE alt.job_audit (
    job_id          text,
    position        int,
    id              int,
    revision_before int,
    revision_after  int,
    qty             int,
    chunk           int,
    txid            bigint,
    committed_at    timestamptz,
    PRIMARY KEY (job_id, position));

-- B: the seed's way. Lock the job row, one guarded UPDATE ... RETURNING per item, one
-- audit INSERT per item, advance the checkpoint, COMMIT.
CREATE PROCEDURE alt.drain_per_item(p_job text) LANGUAGE plpgsql AS $$
DECLARE
    j   alt.jobs;
    it  alt.job_items;
    rev int;
BEGIN
    LOOP
        SELECT * INTO j FROM alt.jobs WHERE job_id = p_job FOR UPDATE;
        EXIT WHEN j.next_index >= j.item_count;
        FOR it IN SELECT * FROM alt.job_items
                   WHERE job_id = p_job AND position >= j.next_index
                     AND position < j.next_index + j.chunk_size
                   ORDER BY position LOOP
            UPDATE orders SET status = 'cancelled', revision = revision + 1
             WHERE tenant = j.tenant AND id = it.id AND revision = it.revision
               AND qty = it.qty AND status = 'pending'
            RETURNING revision INTO rev;
            IF NOT FOUND THEN
                RAISE EXCEPTION 'conflict at item %', it.id;
            END IF;
            INSERT INTO alt.job_audit
            VALUES (p_job, it.position, it.id, it.revision, rev, it.qty,
                    j.next_index / j.chunk_size + 1, txid_current(), now());
        END LOOP;
        UPDATE alt.jobs SET next_index = least(next_index + chunk_size, item_count)
         WHERE job_id = p_job;
        COMMIT;
    END LOOP;
END $$;

-- C: what a competent DBA writes: per chunk, the job row locked, then one statement that
-- reads the chunk's items, makes the guarded change and writes the audit rows from what
-- it returned, the count checked for a conflict, the checkpoint moved, COMMIT.
CREATE PROCEDURE alt.drain_per_chunk(p_job text) LANGUAGE plpgsql AS $$
DECLARE
    j     alt.jobs;
    n     int;
    want  int;
BEGIN
    LOOP
        SELECT * INTO j FROM alt.jobs WHERE job_id = p_job FOR UPDATE;
        EXIT WHEN j.next_index >= j.item_count;
        want := least(j.chunk_size, j.item_count - j.next_index);
        WITH it AS (
            SELECT * FROM alt.job_items
             WHERE job_id = p_job AND position >= j.next_index
               AND position < j.next_index + j.chunk_size),
        u AS (
            UPDATE orders o SET status = 'cancelled', revision = o.revision + 1
              FROM it
             WHERE o.tenant = j.tenant AND o.id = it.id AND o.revision = it.revision
               AND o.qty = it.qty AND o.status = 'pending'
            RETURNING it.position, it.id, it.revision AS before, o.revision AS after, it.qty)
        INSERT INTO alt.job_audit
        SELECT p_job, u.position, u.id, u.before, u.after, u.qty,
               j.next_index / j.chunk_size + 1, txid_current(), now()
          FROM u;
        GET DIAGNOSTICS n = ROW_COUNT;
        IF n <> want THEN
            RAISE EXCEPTION 'conflict in chunk at %', j.next_index;
        END IF;
        UPDATE alt.jobs SET next_index = next_index + want WHERE job_id = p_job;
        COMMIT;
    END LOOP;
END $$;

-- E: the floor. One set-based UPDATE and one audit INSERT for every row, no chunking,
-- no checkpoint.
CREATE PROCEDURE alt.drain_all_at_once(p_job text) LANGUAGE plpgsql AS $$
DECLARE
    j alt.jobs;
BEGIN
    SELECT * INTO j FROM alt.jobs WHERE job_id = p_job FOR UPDATE;
    WITH upd AS (
        UPDATE orders o SET status = 'cancelled', revision = o.revision + 1
          FROM alt.job_items i
         WHERE i.job_id = p_job AND o.tenant = j.tenant AND o.id = i.id
           AND o.revision = i.revision AND o.qty = i.qty AND o.status = 'pending'
        RETURNING i.position, i.id, i.revision AS before, o.revision AS after, i.qty)
    INSERT INTO alt.job_audit
    SELECT p_job, u.position, u.id, u.before, u.after, u.qty, 1, txid_current(), now()
      FROM upd u;
    UPDATE alt.jobs SET next_index = item_count WHERE job_id = p_job;
END $$;

-- F: the bare chunked UPDATE a DBA writes when nobody asks for an approval or an audit:
-- the next chunk of keys in key order, by the primary key's index, changed, COMMIT; no
-- frozen list, no checkpoint, no audit. What the safety of the others costs is measured
-- against it.
CREATE PROCEDURE alt.update_in_chunks(p_tenant text, p_chunk int) LANGUAGE plpgsql AS $$
DECLARE
    v_last int := 0;
    v_upto int;
BEGIN
    LOOP
        SELECT max(id) INTO v_upto
          FROM (SELECT id FROM orders WHERE tenant = p_tenant AND id > v_last
                 ORDER BY id LIMIT p_chunk) s;
        EXIT WHEN v_upto IS NULL;
        UPDATE orders SET status = 'cancelled', revision = revision + 1
         WHERE tenant = p_tenant AND id > v_last AND id <= v_upto AND status = 'pending';
        v_last := v_upto;
        COMMIT;
    END LOOP;
END $$;

-- Chains: the seed's exec_batch_from_id, made correct the way the seed says (lock, check
-- the status after the lock, COMMIT before the next step), as a loop.
CREATE TABLE alt.batch_log (id bigint PRIMARY KEY, status text NOT NULL, command text NOT NULL);
CREATE PROCEDURE alt.exec_batch_from_id(p_id bigint) LANGUAGE plpgsql AS $$
DECLARE
    v_id     bigint := p_id;
    v_status text;
    v_cmd    text;
BEGIN
    WHILE v_id IS NOT NULL LOOP
        LOCK TABLE alt.batch_log IN ACCESS EXCLUSIVE MODE;
        SELECT status, command INTO v_status, v_cmd FROM alt.batch_log WHERE id = v_id;
        IF v_status = 'pending' THEN
            UPDATE alt.batch_log SET status = 'running' WHERE id = v_id;
            EXECUTE v_cmd;
            UPDATE alt.batch_log SET status = 'done' WHERE id = v_id;
        END IF;
        SELECT min(id) INTO v_id FROM alt.batch_log WHERE id > v_id;
        COMMIT;
    END LOOP;
END $$;
