-- What docs/citus.md shows, run with psql on the coordinator of tests/citus (its
-- test_what_the_documentation_shows compares the output with expected/citus.out).
SET client_min_messages = warning;
CREATE TABLE orders (customer int NOT NULL, id int NOT NULL, status text NOT NULL DEFAULT 'new',
                     revision bigint NOT NULL DEFAULT 1, PRIMARY KEY (customer, id));
SELECT create_distributed_table('orders', 'customer', shard_count => 8);
INSERT INTO orders (customer, id) SELECT c, i FROM generate_series(1, 40) c, generate_series(1, 50) i;
RESET client_min_messages;
-- [register]
SELECT * FROM etc_batch.register_job_from_query('close-orders', NULL, 'orders',
    'SELECT customer, id, revision FROM orders', 50, '{"status": "closed"}', tenant_column => NULL);
-- [shards per chunk]
SELECT shards, count(*) AS chunks
  FROM (SELECT i.position / 50 + 1 AS chunk,
               count(DISTINCT get_shard_id_for_distribution_column('orders', (i.item_key::jsonb ->> 0)::int)) AS shards
          FROM etc_batch.job_item i WHERE i.job_id = 'close-orders' GROUP BY 1) c
 GROUP BY shards;
-- [progress by node]
CALL etc_batch.drain_job('close-orders', max_chunks => 10);
SELECT committed, approved, jsonb_pretty(chunks_per_node) AS chunks_per_node
  FROM etc_batch.job_progress WHERE job_id = 'close-orders';
-- [doctor]
SELECT check_name, status, detail FROM etc_batch.doctor()
 WHERE check_name LIKE 'Citus worker%' OR check_name LIKE 'job % by node';
-- [refused]
SELECT * FROM etc_batch.register_job('by-id', NULL, 'orders', '[{"id": 1, "revision": 1}]', 10,
    '{"status": "closed"}', key_column => 'id', tenant_column => NULL);
-- [done]
CALL etc_batch.drain_job('close-orders');
SELECT status, revision, count(*) FROM orders GROUP BY 1, 2;
SELECT nodeport, result AS prepared FROM run_command_on_workers('SELECT count(*) FROM pg_prepared_xacts');
SET client_min_messages = warning;
DROP TABLE orders;
