// The scenarios of tests/drivers through node-postgres: one line per scenario on stdout,
// tab-separated, read by test_drivers.py. Every query is unnamed: a named one is a
// server-side prepared statement, which a transaction-mode pooler cannot follow.
//
//   node scenarios.js <host> <port> <database> <chain step> <failing step> <job> <lease job> <lease>
const { Client } = require('pg');

const [host, port, database, chain, failing, job, leaseJob, lease] = process.argv.slice(2);
// `named`: one named query, executed three times, and nothing else (what a
// transaction-mode pooler breaks)
const named = chain === 'named';
const out = (...fields) => console.log(fields.join('\t'));

async function main() {
  const c = new Client({ host, port: Number(port), database, user: 'postgres' });
  await c.connect();
  if (named) {
    try {
      for (let i = 0; i < 3; i++) {
        await c.query({ name: 'summary', text: 'SELECT status FROM etc_batch.job_summary($1)', values: [job] });
      }
      out('named', 'ok');
    } catch (e) {
      out('named', e.code);
    }
    await c.end();
    return;
  }
  try {
    await c.query('CALL etc_batch.exec_batch_from_id($1)', [chain]);
    out('chain', 'ok');

    const drain = (...args) => c.query(
      'CALL etc_batch.drain_job($1, NULL, $2, $3, $4)', [args[0], args[1] ?? null, args[2] ?? null, args[3] ?? null]);
    const d = (await drain(job)).rows[0];
    out('job', d.committed_chunks, d.committed_items, d.first_key, d.last_key, d.status);

    let status;
    for (let i = 0; i < 8; i++) {
      status = (await drain(job)).rows[0].status;
      status += '/' + (await c.query('SELECT status FROM etc_batch.job_summary($1)', [job])).rows[0].status;
    }
    out('repeated', status);

    try {
      await c.query('CALL etc_batch.exec_batch_from_id($1)', [failing]);
      out('failure', 'none');
    } catch (e) {
      out('failure', e.code, e.message);
    }

    await c.query('BEGIN');
    try {
      await c.query('CALL etc_batch.exec_batch_from_id($1)', [chain]);
      out('autocommit_off', 'none');
    } catch (e) {
      out('autocommit_off', e.code);
    }
    await c.query('ROLLBACK');

    const generation = Number((await c.query(
      "SELECT acquired, generation FROM etc_batch.acquire_lease($1, 'node', '1 hour')", [lease])).rows[0].generation);
    try {
      await drain(leaseJob, lease, 'node', generation + 1);
      out('fenced', 'none');
    } catch (e) {
      out('fenced', e.code);
    }
    out('leased', (await drain(leaseJob, lease, 'node', generation)).rows[0].status);
  } finally {
    await c.end();
  }
}

main().catch((e) => { console.error(e); process.exit(1); });
