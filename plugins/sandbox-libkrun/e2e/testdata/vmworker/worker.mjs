// A Node worker as Compose runs it in a VM: it connects to the engine at
// III_URL with the published SDK and registers vmtest::probe, which reports
// what the worker sees inside the guest.
import { existsSync, readFileSync } from "node:fs";
import { hostname } from "node:os";
import { registerWorker } from "iii-sdk";

const iii = registerWorker(process.env.III_URL, {
  workerName: process.env.III_WORKER_NAME ?? "vmtest",
  reconnectionConfig: { initialDelayMs: 100, maxDelayMs: 500, jitterFactor: 0 },
});
iii.registerFunction("vmtest::probe", async (input) => ({
  echo: input,
  hostname: hostname(),
  isolation: process.env.III_ISOLATION ?? null,
  iii_url: process.env.III_URL ?? null,
  my_url: process.env.MY_URL ?? null,
  engine_token_env: process.env.III_ENGINE_TOKEN ?? null,
  config: process.env.III_CONFIG ? JSON.parse(readFileSync(process.env.III_CONFIG, "utf8")) : null,
  iii_dir: existsSync("/workspace/.iii"),
  token_file: existsSync("/workspace/.iii/compose/default/project-token"),
  top_node_modules_marker: existsSync("/workspace/node_modules/host-only.txt"),
  nested_dist: existsSync("/workspace/src/dist/built.js"),
  src: existsSync("/workspace/src/app.js") ? readFileSync("/workspace/src/app.js", "utf8") : null,
  cwd: process.cwd(),
}));
console.log("worker ready, pid", process.pid);
process.on("SIGTERM", async () => {
  console.log("worker got SIGTERM; shutting down");
  await iii.shutdown();
  process.exit(0);
});
