// BullMQ side of bench/run.py, with the same protocol as bench/php/*.php:
//   node bullmq.mjs push --mode=single|bulk --n=N --url=redis://host:port
//   node bullmq.mjs fill --n=N --url=... [--spread=10] --due-file=F
//   node bullmq.mjs consume --url=... --records=DIR [--until-empty] [--sleep-ms=0]
// Jobs are delayed jobs (`delay`), removed on completion (as delayq deletes on ack);
// one consumer process runs a Worker with concurrency 4 (BullMQ's equivalent of four
// workers). Records are "order_id unix_seconds" lines, one file per process.
import { Queue, Worker } from 'bullmq';
import { writeFileSync, appendFileSync } from 'node:fs';
import { Redis } from 'ioredis';

const [command, ...rest] = process.argv.slice(2);
const args = Object.fromEntries(rest.map((a) => {
  const [k, v] = a.replace(/^--/, '').split('=');
  return [k, v ?? '1'];
}));
const url = new URL(args.url);
const connection = { host: url.hostname, port: Number(url.port), maxRetriesPerRequest: null };
const NAME = 'bench';
const payload = (i) => ({ order_id: i, action: 'close' });

async function push() {
  const q = new Queue(NAME, { connection });
  const n = Number(args.n);
  const opts = { delay: 60_000, removeOnComplete: true };
  const t0 = process.hrtime.bigint();
  if (args.mode === 'single') {
    for (let i = 0; i < n; i++) await q.add('close', payload(i), opts);
  } else {
    for (let s = 0; s < n; s += 1000) {
      const jobs = [];
      for (let i = s; i < Math.min(s + 1000, n); i++) jobs.push({ name: 'close', data: payload(i), opts });
      await q.addBulk(jobs);
    }
  }
  const secs = Number(process.hrtime.bigint() - t0) / 1e9;
  const stored = await q.getDelayedCount();
  await q.close();
  console.log(JSON.stringify({ rate: n / secs, stored }));
}

async function fill() {
  const q = new Queue(NAME, { connection });
  const n = Number(args.n);
  const spread = Number(args.spread ?? 0);
  const lines = [];
  for (let s = 0; s < n; s += 1000) {
    const jobs = [];
    for (let i = s; i < Math.min(s + 1000, n); i++) {
      // A delayed job even when due at once, like the other systems' scheduled messages.
      const delay = Math.max(1, Math.round((spread * 1000 * i) / n));
      jobs.push({ name: 'close', data: payload(i), opts: { delay, removeOnComplete: true } });
    }
    for (const job of await q.addBulk(jobs)) {
      lines.push(`${job.data.order_id} ${(job.timestamp + job.opts.delay) / 1000}`);
    }
  }
  writeFileSync(args['due-file'], lines.join('\n'));
  await q.close();
  const r = new Redis(connection);
  await r.set('bench:filled', '1');
  r.disconnect();
}

async function consume() {
  const seen = [];
  const sleepMs = Number(args['sleep-ms'] ?? 0);
  const file = `${args.records}/${process.pid}`;
  const worker = new Worker(NAME, async (job) => {
    if (sleepMs > 0) await new Promise((r) => setTimeout(r, sleepMs));
    const line = `${job.data.order_id} ${Date.now() / 1000}`;
    if (sleepMs > 0) appendFileSync(file, line + '\n');
    else seen.push(line);
  }, { connection, concurrency: 4 });
  const q = new Queue(NAME, { connection });
  const r = new Redis(connection);
  const stop = async () => {
    await worker.close();
    if (seen.length) writeFileSync(file, seen.join('\n'));
    await q.close();
    r.disconnect();
    process.exit(0);
  };
  process.on('SIGTERM', stop);
  if (args['until-empty']) {
    for (;;) {
      await new Promise((res) => setTimeout(res, 50));
      if (!(await r.exists('bench:filled'))) continue;
      const c = await q.getJobCounts('wait', 'delayed', 'active', 'prioritized', 'waiting-children');
      if (Object.values(c).every((v) => v === 0)) break;
    }
    await stop();
  }
}

await { push, fill, consume }[command]();
