// A Node worker as Compose runs it in a VM (path:// with runtime.base_image):
// the published iii-sdk, laid out as node_modules by the install step
// (unpack.mjs), connects to III_URL and registers <name>::probe in
// $III_NAMESPACE. probe reports what the worker sees in the guest, so the
// Go test can check that no engine token reached it.
import { existsSync, readFileSync } from "node:fs";
import { registerWorker } from "iii-sdk";
import WebSocket from "ws";

const env = process.env;
const name = env.III_WORKER_NAME;
const iii = registerWorker(env.III_URL, {
  workerName: name,
  reconnectionConfig: { initialDelayMs: 100, maxDelayMs: 500, jitterFactor: 0 },
});
// iii-sdk 0.22.1 has no namespace option: register it ourselves.
iii.trigger({ function_id: "engine::workers::register", payload: { name, namespace: env.III_NAMESPACE }, action: { type: "void" } });
iii.registerFunction(`${name}::probe`, async (input) => ({
  echo: input,
  env: Object.fromEntries(Object.entries(env).filter(([k]) => k !== "PATH")),
  config: env.III_CONFIG && existsSync(env.III_CONFIG) ? readFileSync(env.III_CONFIG, "utf8") : null,
  iii_dir: existsSync("/workspace/.iii"),
  compose_file: existsSync("/workspace/worker-compose.yaml"),
  cwd: process.cwd(),
}));
// attack is what hostile code in the VM would try on its own connection to
// the engine (raw frames, so it can name any namespace): start a host
// process through the plugin host, add a Compose worker, change the
// configuration, mint itself a credential, squat a reserved id. It answers
// each call's error code ("" when the call succeeded).
iii.registerFunction(`${name}::attack`, async () => {
  const ws = new WebSocket(env.III_URL);
  const frames = [];
  const waiters = [];
  ws.on("message", (data) => {
    const f = JSON.parse(data.toString());
    frames.push(f);
    for (const w of waiters.splice(0)) w();
  });
  const next = (pred) => new Promise((resolve, reject) => {
    const t = setTimeout(() => reject(new Error("no answer")), 20000);
    const look = () => {
      const i = frames.findIndex(pred);
      if (i >= 0) { clearTimeout(t); resolve(frames.splice(i, 1)[0]); } else waiters.push(look);
    };
    look();
  });
  await new Promise((resolve, reject) => { ws.on("open", resolve); ws.on("error", reject); });
  await next((f) => f.type === "workerregistered");
  const calls = {
    "engine::adapters::start": { ns: "default", data: { adapter: "evil", path: "/bin/sh", config: {} } },
    "compose::add": { ns: env.III_NAMESPACE, data: { name: "evil", worker: "path:///", scripts: { start: "touch /tmp/pwned" } } },
    "configuration::set": { ns: "default", data: { key: "evil", value: 1 } },
    "engine::credentials::issue": { ns: "default", data: { namespace: "default" } },
  };
  const codes = {};
  for (const [fn, c] of Object.entries(calls)) {
    ws.send(JSON.stringify({ type: "invokefunction", invocation_id: `atk-${fn}`, function_id: fn, data: c.data, namespace: c.ns }));
    const r = await next((f) => f.type === "invocationresult" && f.invocation_id === `atk-${fn}`);
    codes[fn] = r.error ? r.error.code : "";
  }
  ws.send(JSON.stringify({ type: "registerfunction", id: "compose::evil" }));
  const rej = await next((f) => f.type === "registrationrejected");
  codes["register compose::evil"] = rej.code;
  ws.close();
  return { codes };
});
console.log(`worker ${name} ready in namespace ${env.III_NAMESPACE}`);
process.on("SIGTERM", async () => {
  console.log(`worker ${name} got SIGTERM`);
  await iii.shutdown();
  process.exit(0);
});
