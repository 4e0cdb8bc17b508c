-- A small ETL chain in the shape DBAs already have: a schema of load procedures and
-- a list of steps that call them in order.
CREATE SCHEMA df;
CREATE TABLE df.raw_sales (day date, store int, amount numeric);
CREATE TABLE df.daily_sales (day date, store int, amount numeric);
CREATE TABLE df.store_totals (store int PRIMARY KEY, amount numeric);
CREATE TABLE df.exchange_rate (rate numeric);

INSERT INTO df.raw_sales
SELECT DATE '2026-11-01' + (g % 28), g % 7, (g * 37) % 1000 FROM generate_series(1, 5000) g;

CREATE PROCEDURE df.load_sales() LANGUAGE sql
AS $$ INSERT INTO df.daily_sales(day, store, amount)
      SELECT day, store, sum(amount) FROM df.raw_sales GROUP BY day, store $$;
CREATE PROCEDURE df.build_totals() LANGUAGE sql
AS $$ INSERT INTO df.store_totals SELECT store, sum(amount) FROM df.daily_sales GROUP BY store $$;
CREATE PROCEDURE df.convert_currency() LANGUAGE plpgsql
AS $$
DECLARE r numeric;
BEGIN
  SELECT rate INTO STRICT r FROM df.exchange_rate;   -- fails until a rate is loaded
  UPDATE df.store_totals SET amount = amount / r;
END $$;

SELECT etc_batch.add_step('nightly', 'SELECT pg_sleep(0.5)', 21);   -- a slow extract
SELECT etc_batch.add_step('nightly', 'CALL df.load_sales()', 22);
SELECT etc_batch.add_step('nightly', 'CALL df.build_totals()', 23);
SELECT etc_batch.add_step('nightly', 'CALL df.convert_currency()', 24);
