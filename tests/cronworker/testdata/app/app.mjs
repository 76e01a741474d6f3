// The Node iii-sdk worker of the cron acceptance test: it schedules
// functions with `cron` triggers as upstream's docs show (registerTrigger
// with an expression, seconds field first) and records every fire.
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

const jobs = new Map();
const ticks = [];
const consulted = [];
iii.registerFunction("app::tick", async (p) => {
  ticks.push({ trigger: p.trigger, job_id: p.job_id, scheduled_time: p.scheduled_time, actual_time: p.actual_time });
  return null;
});
// A condition that always answers false: its job never fires.
iii.registerFunction("app::never", async (p) => {
  consulted.push(p.job_id);
  return false;
});
iii.registerFunction("app::schedule", async ({ name, expression, condition }) => {
  const config = { expression };
  if (condition) config.condition_function_id = condition;
  jobs.set(name, iii.registerTrigger({ type: "cron", function_id: "app::tick", config }));
  return { ok: true };
});
iii.registerFunction("app::unschedule", async ({ name }) => {
  jobs.get(name).unregister();
  jobs.delete(name);
  return { ok: true };
});
iii.registerFunction("app::ticks", async () => ({ ticks, consulted }));
console.log(`app ${name} serving`);
