// The Node iii-sdk worker of the queue acceptance test: it subscribes to
// durable topics with `durable:subscriber` triggers, publishes with
// iii::durable::publish and enqueues with `action: {type: "enqueue"}`, as
// upstream's docs show, and records every delivery in records.jsonl (so
// the record outlives a restart of the project).
import fs from "node:fs";

const { registerWorker } = await import(process.env.III_SDK_URL);
const env = process.env;
const name = env.III_WORKER_NAME;
const iii = registerWorker(env.III_URL, {
  workerName: name,
  reconnectionConfig: { initialDelayMs: 50, maxDelayMs: 200, jitterFactor: 0 },
});
process.on("SIGTERM", async () => {
  try {
    await iii.shutdown();
  } finally {
    process.exit(0);
  }
});

const FILE = "records.jsonl";
const record = (fn, data) => fs.appendFileSync(FILE, JSON.stringify({ fn, id: data?.id ?? null, at: Date.now() }) + "\n");
const records = () =>
  fs.existsSync(FILE)
    ? fs.readFileSync(FILE, "utf8").split("\n").filter(Boolean).map((l) => JSON.parse(l))
    : [];
const attempts = (fn, id) => records().filter((r) => r.fn === fn && r.id === id).length;
let healthy = false;
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

// Fails its first two attempts of each message, then succeeds.
iii.registerFunction("app::flaky", async (data) => {
  record("app::flaky", data);
  if (attempts("app::flaky", data.id) <= 2) throw new Error(`flaky attempt ${attempts("app::flaky", data.id)}`);
  return null;
});
// Fails until healed.
iii.registerFunction("app::doomed", async (data) => {
  record("app::doomed", data);
  if (!healthy) throw new Error("doomed");
  return null;
});
iii.registerFunction("app::heal", async () => {
  healthy = true;
  return { ok: true };
});
iii.registerFunction("app::sub1", async (data) => (record("app::sub1", data), null));
iii.registerFunction("app::sub2", async (data) => (record("app::sub2", data), null));
iii.registerFunction("app::job", async (data) => (record("app::job", data), null));
// Slow, so a backlog waits while the queue worker and the engine restart.
iii.registerFunction("app::durable", async (data) => {
  await sleep(200);
  record("app::durable", data);
  return null;
});

const subscribe = (function_id, config) => iii.registerTrigger({ type: "durable:subscriber", function_id, config });
subscribe("app::flaky", { queue: "flaky", max_retries: 3, backoff_ms: 300 });
subscribe("app::doomed", { topic: "doomed", max_retries: 1, backoff_ms: 50 });
subscribe("app::sub1", { topic: "fanout" });
subscribe("app::sub2", { topic: "fanout" });
subscribe("app::durable", { topic: "durable", max_retries: 100, backoff_ms: 50, queue_config: { concurrency: 1 } });

// A trigger registered with whatever config the test sends (bad input).
iii.registerFunction("app::subscribe", async ({ function_id, config }) => {
  subscribe(function_id, config);
  return { ok: true };
});
const attempt = async (f) => {
  try {
    return { result: (await f()) ?? null };
  } catch (e) {
    return { error: { code: e?.code ?? null, message: String(e?.message ?? e) } };
  }
};
iii.registerFunction("app::publish", async ({ topic, data }) =>
  attempt(() => iii.trigger({ function_id: "iii::durable::publish", payload: { topic, data } })),
);
iii.registerFunction("app::enqueue", async ({ queue, function_id, data }) =>
  attempt(() => iii.trigger({ function_id, payload: data, action: { type: "enqueue", queue } })),
);
// Publishes (or enqueues) n messages at once; answers the ids accepted.
iii.registerFunction("app::publish_many", async ({ topic, prefix, n }) => {
  const accepted = [];
  for (let i = 0; i < n; i++) {
    const id = `${prefix}${i}`;
    const o = await attempt(() => iii.trigger({ function_id: "iii::durable::publish", payload: { topic, data: { id } } }));
    if (!o.error) accepted.push(id);
  }
  return { accepted };
});
iii.registerFunction("app::enqueue_many", async ({ queue, function_id, prefix, n }) => {
  const accepted = [];
  for (let i = 0; i < n; i++) {
    const id = `${prefix}${i}`;
    const o = await attempt(() => iii.trigger({ function_id, payload: { id }, action: { type: "enqueue", queue } }));
    if (!o.error && o.result?.messageReceiptId) accepted.push(id);
  }
  return { accepted };
});
iii.registerFunction("app::records", async () => ({ records: records() }));
iii.registerFunction("app::env", async () => ({ provider_token: Boolean(env.III_QUEUE_PROVIDER_TOKEN) }));
console.log(`app ${name} serving`);
