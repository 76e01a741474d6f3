// Drives the published Node SDK (iii-sdk) against the engine under test.
// The Go test passes the SDK's entry point as a file URL in III_SDK_URL and
// a JSON job in argv[2]:
//
//   {"mode":"serve","url":"ws://…","name":"w","namespace":"orders","functions":["a::echo","a::fail"]}
//     registers the functions and runs until stdin closes. "::fail" functions
//     throw; the others answer {echo: <input>, by: <name>}.
//   {"mode":"call","url":"ws://…","name":"c","namespace":"…","calls":[{"function_id":"…","payload":{…}}]}
//     makes the calls in order, prints one JSON line per call
//     ({"ok":true,"result":…} or {"ok":false,"code":…,"message":…}) and exits.
//
// Every line the script prints on stdout is JSON; the SDK's own logging goes
// to stderr.
const { registerWorker } = await import(process.env.III_SDK_URL);

const job = JSON.parse(process.argv[2]);
const out = (v) => process.stdout.write(JSON.stringify(v) + "\n");
// Keep stdout for results only.
console.log = console.debug = console.info = (...a) => process.stderr.write(a.join(" ") + "\n");

const iii = registerWorker(job.url, {
  workerName: job.name,
  invocationTimeoutMs: 20000,
  reconnectionConfig: { initialDelayMs: 50, maxDelayMs: 200, jitterFactor: 0 },
});

if (job.namespace) {
  // 0.22.1 has no namespace option: a worker that wants one sends its own
  // engine::workers::register first. It is queued until the socket opens and
  // then sent ahead of the SDK's own register, so it wins.
  iii.trigger({
    function_id: "engine::workers::register",
    payload: { name: job.name, namespace: job.namespace },
    action: { type: "void" },
  });
}

if (job.mode === "serve") {
  for (const id of job.functions) {
    iii.registerFunction(id, async (input) => {
      if (id.endsWith("::fail")) {
        throw new Error(`handler exploded: ${input?.reason ?? "no reason"}`);
      }
      return { echo: input, by: job.name };
    });
  }
  out({ started: true });
  process.stdin.resume();
  process.stdin.on("end", async () => {
    await iii.shutdown();
    process.exit(0);
  });
} else if (job.mode === "call") {
  for (const c of job.calls) {
    try {
      const result = await iii.trigger({ function_id: c.function_id, payload: c.payload });
      out({ ok: true, result });
    } catch (err) {
      out({ ok: false, code: err.code ?? "", message: err.message ?? String(err) });
    }
  }
  await iii.shutdown();
  process.exit(0);
} else {
  process.stderr.write(`unknown mode ${job.mode}\n`);
  process.exit(2);
}
