// A project worker on the published Node SDK (iii-sdk), driven by the
// environment Compose gives it. The Go tests set III_SDK_URL (the SDK's
// entry point as a file URL) and these knobs through `environment:`:
//
//   WORKER_MODE   serve (default) | exit (exit 3 before connecting) |
//                 wrong-name (register as "<name>-other") |
//                 no-namespace (never send the namespace) |
//                 functions-elsewhere (only a helper worker, in "default",
//                 with a function) | hang (never connect)
//   ORDER_FILE    a file each worker appends "start <name>" / "stop <name>"
//                 lines to, so tests can check start and stop order
//   DEPS          comma-separated workers that must already be registered in
//                 the namespace when this one starts
//
// It serves <name>::ping, which answers with the worker's view of its
// environment and configuration, and stops cleanly on SIGTERM.
import fs from "node:fs";

const { registerWorker } = await import(process.env.III_SDK_URL);
const env = process.env;
const mode = env.WORKER_MODE ?? "serve";
const key = env.III_WORKER_NAME;
const ns = env.III_NAMESPACE;
const order = (line) => {
  if (env.ORDER_FILE) fs.appendFileSync(env.ORDER_FILE, line + "\n");
};

// The handler goes in first: Compose may stop a worker as soon as it has
// registered, before the rest of this script has run.
let iii = null;
process.on("SIGTERM", async () => {
  order(`stop ${key}`);
  console.error(`worker ${key} stopping`);
  try {
    if (iii) await iii.shutdown();
  } finally {
    process.exit(0);
  }
});

console.log(`\x1b[32mworker ${key} starting\x1b[0m in namespace ${ns}`);
if (mode === "exit") {
  console.error(`worker ${key} gives up before registering`);
  process.exit(3);
}
if (mode === "hang") {
  setInterval(() => {}, 1 << 30);
} else {
  const name = mode === "wrong-name" ? `${key}-other` : mode === "functions-elsewhere" ? `${key}-helper` : key;
  iii = registerWorker(env.III_URL, {
    workerName: name,
    reconnectionConfig: { initialDelayMs: 50, maxDelayMs: 200, jitterFactor: 0 },
  });
  if (ns && mode !== "no-namespace" && mode !== "functions-elsewhere") {
    // iii-sdk 0.22.1 has no namespace option: register it ourselves, ahead
    // of the SDK's own registration.
    iii.trigger({ function_id: "engine::workers::register", payload: { name, namespace: ns }, action: { type: "void" } });
  }
  if (env.DEPS) {
    const { workers } = await iii.trigger({ function_id: "engine::workers::list", payload: {} });
    for (const dep of env.DEPS.split(",")) {
      const ok = workers.some((w) => w.name === dep && w.namespace === ns);
      console.log(`dependency ${dep} ${ok ? "ready" : "MISSING"}`);
      order(`dep ${key} ${dep} ${ok ? "ready" : "missing"}`);
    }
  }
  iii.registerFunction(`${key}::ping`, async () => {
    let config = null;
    if (env.III_CONFIG) config = fs.readFileSync(env.III_CONFIG, "utf8");
    const reported = {};
    for (const k of Object.keys(env).sort()) {
      if (k.startsWith("III_") || k.startsWith("APP_") || k === "PATH" || k === "HOME" || k.startsWith("LEAK")) reported[k] = env[k];
    }
    return { worker: key, pid: process.pid, config, env: reported };
  });
  order(`start ${key}`);
}
