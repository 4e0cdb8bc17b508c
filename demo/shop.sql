-- The demo's shop: plain tables as most databases have them, a primary key and nothing
-- else (no tenant column, no revision column the application increments).
CREATE TABLE orders (
    id         bigint PRIMARY KEY,
    status     text NOT NULL,
    qty        integer NOT NULL,
    unit_price numeric NOT NULL,
    total      numeric,
    placed_at  date NOT NULL
);
INSERT INTO orders
SELECT g,
       CASE WHEN g % 10 = 0 THEN 'cancelled' WHEN g % 4 = 0 THEN 'unpaid' ELSE 'paid' END,
       1 + g % 5, 4.99 + g % 20, NULL, date '2026-12-01' - (g % 1000)
  FROM generate_series(1, 20000) g;
