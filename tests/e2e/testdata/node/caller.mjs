// Calls functions on the engine under test with the published Node SDK
// (iii-sdk), as any Node application would. The Go test passes the SDK's
// entry point as a file URL in III_SDK_URL and a JSON job in argv[2]:
//
//   {"url":"ws://…","name":"…","timeout_ms":300000,
//    "calls":[{"function_id":"sandbox::run","payload":{…}}]}
//
// It makes the calls in order and prints one JSON line per call on stdout:
// {"ok":true,"result":…} or {"ok":false,"code":…,"message":…}. The SDK's
// own logging goes to stderr, so stdout carries only those lines.
const { registerWorker } = await import(process.env.III_SDK_URL);

const job = JSON.parse(process.argv[2]);
const out = (v) => process.stdout.write(JSON.stringify(v) + "\n");
console.log = console.debug = console.info = (...a) => process.stderr.write(a.join(" ") + "\n");

const iii = registerWorker(job.url, {
  workerName: job.name,
  // A sandbox::run boots a VM: far longer than the SDK's 30 s default
  // under emulation.
  invocationTimeoutMs: job.timeout_ms,
});

for (const c of job.calls) {
  try {
    const result = await iii.trigger({ function_id: c.function_id, payload: c.payload, timeoutMs: job.timeout_ms });
    out({ ok: true, result });
  } catch (err) {
    out({ ok: false, code: err?.code ?? "", message: err?.message ?? String(err) });
  }
}
await iii.shutdown();
process.exit(0);
