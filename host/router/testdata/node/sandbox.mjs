// Drives the published Node SDK (iii-sdk) against the engine under test, as
// a sandbox adapter or as a caller of sandbox::*. The Go test passes the
// SDK's entry point as a file URL in III_SDK_URL and a JSON job in argv[2]:
//
//   {"mode":"adapter","url":"ws://…","name":"nodebox","namespace":"nb","major":1}
//     registers nodebox::<op> for the sixteen operations and
//     nodebox::adapter::info (reporting contract {major, minor: 1}), prints
//     {"started":true} and serves until stdin closes. catalog::list and run
//     work (run executes python3 -c code on the host); exec throws the
//     contract's S002 error object; the other operations throw S219.
//   {"mode":"call","url":"ws://…","name":"c","calls":[{"function_id":"…","payload":{…}}]}
//     makes the calls in order and prints one JSON line per call:
//     {"ok":true,"result":…} or {"ok":false,"code":…,"message":…,"sandbox_error":{…}|null},
//     where sandbox_error is the S-code object parsed from the message JSON.
//
// Every line printed on stdout is JSON; the SDK's own logging goes to stderr.
// The plumbing is internal/testkit/nodesdk/driver.mjs.
import { spawnSync } from "node:child_process";
import { callAll, connect, serve, unknownMode } from "../../../../internal/testkit/nodesdk/driver.mjs";

const { job, iii } = await connect();

// sandboxError builds the contract's wire object; an adapter reports a
// failure by throwing an Error whose message is that JSON.
function sandboxError(type, code, message, fixNote) {
  return new Error(JSON.stringify({
    type, code, message,
    docs_url: `https://iii.dev/docs/next/creating-workers/sandboxes#${code.toLowerCase()}`,
    retryable: false, fix: null, fix_note: fixNote,
  }));
}

// The S-code object in an invocation error message: from the first '{'.
function parseSandboxError(message) {
  const i = (message ?? "").indexOf("{");
  if (i < 0) return null;
  try {
    const v = JSON.parse(message.slice(i));
    return typeof v.code === "string" && /^S\d{3}$/.test(v.code) ? v : null;
  } catch {
    return null;
  }
}

const ops = ["create", "exec", "run", "list", "stop", "catalog::list", "fs::ls", "fs::stat", "fs::mkdir",
  "fs::write", "fs::read", "fs::rm", "fs::chmod", "fs::mv", "fs::grep", "fs::sed"];

if (job.mode === "adapter") {
  const p = job.name;
  iii.registerFunction(`${p}::adapter::info`, async () => ({
    adapter: p, adapter_version: "0.0.1-node", contract: { major: job.major, minor: 1 }, runtime: "node",
  }));
  for (const op of ops) {
    iii.registerFunction(`${p}::${op}`, async (input) => {
      switch (op) {
        case "catalog::list":
          return { images: [{ name: "python", oci_ref: "node-host:python3", kind: "preset" }] };
        case "run": {
          const t0 = Date.now();
          const r = spawnSync("python3", ["-c", input.code], { encoding: "utf8" });
          return {
            stdout: r.stdout, stderr: r.stderr, exit_code: r.status, timed_out: false,
            duration_ms: Date.now() - t0, success: r.status === 0, stdout_truncated: false, stderr_truncated: false,
          };
        }
        case "exec":
          throw sandboxError("validation", "S002", `sandbox not found: ${input.sandbox_id}`, "call sandbox::create first");
        default:
          throw sandboxError("filesystem", "S219", `${op} is not supported by the node test adapter`, "upgrade the adapter");
      }
    });
  }
  serve(iii);
} else if (job.mode === "call") {
  await callAll(iii, job.calls, (err) => ({ sandbox_error: parseSandboxError(err.message) }));
} else {
  unknownMode(job);
}
