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
// to stderr. The plumbing is internal/testkit/nodesdk/driver.mjs.
import { callAll, connect, serve, unknownMode } from "../../../../internal/testkit/nodesdk/driver.mjs";

const { job, iii } = await connect();

if (job.mode === "serve") {
  for (const id of job.functions) {
    iii.registerFunction(id, async (input) => {
      if (id.endsWith("::fail")) {
        throw new Error(`handler exploded: ${input?.reason ?? "no reason"}`);
      }
      return { echo: input, by: job.name };
    });
  }
  serve(iii);
} else if (job.mode === "call") {
  await callAll(iii, job.calls);
} else {
  unknownMode(job);
}
