-- etc_batch 0.4.0 -> 0.5.0. Run by ALTER EXTENSION etc_batch UPDATE; never edit it once
-- 0.5.0 is released: later changes go into a script of their own.
\echo Use "ALTER EXTENSION etc_batch UPDATE" to load this file. \quit
