// The Node iii-sdk worker of the state acceptance test: it writes state
// through state::set (as upstream's docs show), and a `state` trigger on
// scope "orders" copies every change event it sees into scope "seen".
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
// iii-sdk 0.22.1 has no namespace option: register it ourselves.
iii.trigger({ function_id: "engine::workers::register", payload: { name, namespace: env.III_NAMESPACE }, action: { type: "void" } });

iii.registerFunction("app::write", async (req) =>
  iii.trigger({ function_id: "state::set", payload: { scope: "orders", key: req.key, value: req.value } }));
iii.registerFunction("app::bump", async (req) =>
  iii.trigger({ function_id: "state::update", payload: { scope: "orders", key: req.key, ops: [{ type: "increment", path: "n", by: 1 }] } }));
iii.registerFunction("app::on-state", async (event) => {
  // The engine adds _caller_worker_id to object payloads; keep the event.
  const { type, event_type, scope, key, old_value, new_value } = event;
  await iii.trigger({ function_id: "state::set", payload: { scope: "seen", key: `${key}:${event_type}`, value: { type, event_type, scope, key, old_value, new_value } } });
  return null;
});
iii.registerTrigger({ type: "state", function_id: "app::on-state", config: { scope: "orders" } });
// A trigger with a condition: only values with n >= 10 reach app::on-big.
iii.registerFunction("app::only-big", async (event) => (event.new_value?.n ?? 0) >= 10);
iii.registerFunction("app::on-big", async (event) => {
  await iii.trigger({ function_id: "state::set", payload: { scope: "big", key: event.key, value: event.new_value } });
  return null;
});
iii.registerTrigger({ type: "state", function_id: "app::on-big", config: { scope: "orders", condition_function_id: "app::only-big" } });
console.log(`app ${name} serving in namespace ${env.III_NAMESPACE}`);
