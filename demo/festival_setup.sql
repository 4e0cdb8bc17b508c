-- The Alien Desert Festival was rained off. Customer "alien-fest" asks to cancel its
-- 40 pending orders; the operator approves: 10 at a time, and keep the finished chunks
-- even if a later one fails. Other customers' orders share the table (and their ids).
CREATE TABLE orders (
    tenant   text,
    id       int,
    revision int  NOT NULL DEFAULT 1,
    qty      int  NOT NULL,
    status   text NOT NULL DEFAULT 'pending',
    PRIMARY KEY (tenant, id));

INSERT INTO orders (tenant, id, qty)
SELECT 'alien-fest', 1000 + g * 7, 1 + g % 4 FROM generate_series(1, 40) g;
INSERT INTO orders (tenant, id, qty)
SELECT t, 1000 + g * 7, 1 + g % 4 FROM unnest(ARRAY['moon-market', 'sun-sales']) t, generate_series(1, 60) g;

-- the approval, frozen: every order with the revision and quantity the operator saw
SELECT job_id, created, items, chunks FROM etc_batch.register_job(
    'festival-cancel', 'alien-fest', 'orders',
    (SELECT jsonb_agg(jsonb_build_object('id', id, 'revision', revision, 'qty', qty))
       FROM orders WHERE tenant = 'alien-fest' AND status = 'pending'),
    10, '{"status": "cancelled"}', '{"status": "pending"}');
