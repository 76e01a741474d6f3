// The common part of the Node scripts with which Go tests drive the
// published iii-sdk (host/engine/testdata/node/sdk.mjs,
// host/router/testdata/node/sandbox.mjs; started by nodesdk.SDK.Start).
// A script gets the SDK's entry point as a file URL in III_SDK_URL and its
// job as JSON in argv[2]: {"mode":…,"url":"ws://…","name":…,"namespace":…,
// "headers":{…}} (headers are sent on the WebSocket handshake).
// Every line a script prints on stdout is JSON (out); the SDK's own logging
// goes to stderr.

// out prints one JSON line on stdout.
export const out = (v) => process.stdout.write(JSON.stringify(v) + "\n");

// connect reads the job and registers the worker job.name with the engine
// at job.url, in job.namespace when there is one.
export async function connect() {
  const { registerWorker } = await import(process.env.III_SDK_URL);
  const job = JSON.parse(process.argv[2]);
  // Keep stdout for results only.
  console.log = console.debug = console.info = (...a) => process.stderr.write(a.join(" ") + "\n");
  const iii = registerWorker(job.url, {
    workerName: job.name,
    invocationTimeoutMs: 20000,
    reconnectionConfig: { initialDelayMs: 50, maxDelayMs: 200, jitterFactor: 0 },
    ...(job.headers ? { headers: job.headers } : {}),
  });
  if (job.namespace) {
    // iii-sdk 0.22.1 has no namespace option: a worker that wants one sends
    // its own engine::workers::register first. It is queued until the
    // socket opens and then sent ahead of the SDK's own register, so it wins.
    iii.trigger({
      function_id: "engine::workers::register",
      payload: { name: job.name, namespace: job.namespace },
      action: { type: "void" },
    });
  }
  return { job, iii };
}

// serve prints {"started":true} and serves the functions registered so far
// until stdin closes, then shuts the SDK down and exits.
export function serve(iii) {
  out({ started: true });
  process.stdin.resume();
  process.stdin.on("end", async () => {
    await iii.shutdown();
    process.exit(0);
  });
}

// callAll makes the calls in order, printing one line per call:
// {"ok":true,"result":…} or {"ok":false,"code":…,"message":…} with the
// fields failure(err) adds; then it shuts the SDK down and exits.
export async function callAll(iii, calls, failure = () => ({})) {
  for (const c of calls) {
    try {
      const result = await iii.trigger({ function_id: c.function_id, payload: c.payload });
      out({ ok: true, result });
    } catch (err) {
      out({ ok: false, code: err.code ?? "", message: err.message ?? String(err), ...failure(err) });
    }
  }
  await iii.shutdown();
  process.exit(0);
}

// unknownMode ends a script given a job it does not know.
export function unknownMode(job) {
  process.stderr.write(`unknown mode ${job.mode}\n`);
  process.exit(2);
}
