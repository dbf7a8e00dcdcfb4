// The seeds' relays as their authors wrote them, run by Node.js on the bench's backlog (PostgreSQL), so
// that relay-bench can put the real thing beside its Rust replays of their SQL. Only the table names
// (`outbox` -> `seed000_outbox` / `seed001_outbox`), the publisher (confirms at once, as the bench's does)
// and the stop condition (the first empty batch, instead of sleeping and polling for ever) differ.
//
// Usage: DATABASE_URL=postgres://... OUTBOX_BENCH_SCHEMA=outbox_bench \
//          node seed-relays.mjs seed000|seed001 BATCH BUDGET_SECONDS
// Prints one line of JSON: {"done": events, "secs": seconds, "timed_out": bool}.
import pg from "pg";
import knex from "knex";

const [which, batchArg, budgetArg] = process.argv.slice(2);
const batchSize = Number(batchArg ?? 10);
const budgetMs = Number(budgetArg ?? 120) * 1000;
const schema = process.env.OUTBOX_BENCH_SCHEMA ?? "outbox_bench";
if (!/^[a-z_][a-z0-9_]*$/.test(schema)) throw new Error(`not a schema name: ${schema}`);

// What the bench's publishers do with each event: read what a broker client would send, confirm at once.
async function publish(event) {
  JSON.stringify(event);
}

// --- seed 000 (outbox.js), as written ---------------------------------------------------------------
async function withTransaction(pool, fn) {
  const client = await pool.connect();
  try {
    await client.query("BEGIN");
    const result = await fn(client);
    await client.query("COMMIT");
    return result;
  } catch (e) {
    await client.query("ROLLBACK").catch(() => {});
    throw e;
  } finally {
    client.release();
  }
}

function relayOnce(pool, publish, { batchSize = 10, maxAttempts = 5 } = {}) {
  return withTransaction(pool, async (c) => {
    const { rows } = await c.query(
      `SELECT id, aggregate_id, type, payload FROM seed000_outbox
        WHERE published_at IS NULL AND attempts < $1
        ORDER BY id LIMIT $2 FOR UPDATE SKIP LOCKED`,
      [maxAttempts, batchSize],
    );
    const blocked = new Set();
    const stats = { published: 0, failed: 0, skipped: 0 };
    for (const r of rows) {
      if (blocked.has(r.aggregate_id)) { stats.skipped++; continue; }
      try {
        await publish({ id: String(r.id), aggregateId: r.aggregate_id, type: r.type, payload: r.payload });
        await c.query("UPDATE seed000_outbox SET published_at = now() WHERE id = $1", [r.id]);
        stats.published++;
      } catch (e) {
        await c.query("UPDATE seed000_outbox SET attempts = attempts + 1, last_error = $2 WHERE id = $1", [r.id, String(e.message)]);
        blocked.add(r.aggregate_id);
        stats.failed++;
      }
    }
    return stats;
  });
}

// --- seed 001 (the article's relayLoop, on knex), as written ------------------------------------------
const kafka = { publish: async (_topic, message) => publish(message) };

async function relayLoopOnce(db) {
  const events = await db('seed001_outbox')
    .whereNull('published_at')
    .orderBy('created_at')
    .limit(100);

  for (const event of events) {
    await kafka.publish(event.event_type, {
      key: event.aggregate_id,
      value: JSON.stringify(event.payload)
    });

    await db('seed001_outbox')
      .where({ id: event.id })
      .update({ published_at: db.fn.now() });
  }
  return events.length;
}

// --- the harness ------------------------------------------------------------------------------------
const url = process.env.DATABASE_URL;
if (!url) throw new Error("DATABASE_URL is not set");
const started = Date.now();
let done = 0;
let timedOut = false;
if (which === "seed000") {
  // seed 000's db.js: a pool of 10.
  const pool = new pg.Pool({ connectionString: url, max: 10 });
  pool.on("connect", (client) => client.query(`SET search_path TO ${schema}`));
  for (;;) {
    if (Date.now() - started > budgetMs) { timedOut = true; break; }
    const stats = await relayOnce(pool, publish, { batchSize });
    if (stats.published + stats.failed + stats.skipped === 0) break;
    done += stats.published;
  }
  await pool.end();
} else if (which === "seed001") {
  const db = knex({ client: "pg", connection: url, searchPath: [schema], pool: { min: 0, max: 10 } });
  for (;;) {
    if (Date.now() - started > budgetMs) { timedOut = true; break; }
    const n = await relayLoopOnce(db);
    if (n === 0) break;
    done += n;
  }
  await db.destroy();
} else {
  throw new Error(`unknown relay ${which}: expected seed000 or seed001`);
}
console.log(JSON.stringify({ done, secs: (Date.now() - started) / 1000, timed_out: timedOut }));
