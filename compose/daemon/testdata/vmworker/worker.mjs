// A Node worker as Compose runs it in a VM (path:// with runtime.base_image):
// the published iii-sdk, laid out as node_modules by the install step
// (unpack.mjs), connects to III_URL and registers <name>::probe in
// $III_NAMESPACE. probe reports what the worker sees in the guest, so the
// Go test can check that no engine token reached it.
import { existsSync, readFileSync } from "node:fs";
import { registerWorker } from "iii-sdk";

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
console.log(`worker ${name} ready in namespace ${env.III_NAMESPACE}`);
process.on("SIGTERM", async () => {
  console.log(`worker ${name} got SIGTERM`);
  await iii.shutdown();
  process.exit(0);
});
