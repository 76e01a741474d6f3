// Drives the published Node SDK (iii-sdk) against the engine under test.
// The Go test passes the SDK's entry point as a file URL in III_SDK_URL and
// a JSON job in argv[2]:
//
//   {"mode":"serve","url":"ws://…","name":"w","namespace":"orders","functions":["a::echo","a::fail"]}
//     registers the functions and runs until stdin closes. "::fail" functions
//     throw; the others answer {echo: <input>, by: <name>}.
//   {"mode":"auth","url":"ws://…","name":"w","functions":["api::echo"]}
//     serves an RBAC auth function (auth::authenticate: x-user alice gets a
//     session, anyone else is refused), a middleware (auth::middleware:
//     prints {"middleware":<its input>} and calls the target itself) and
//     echo functions; runs until stdin closes.
//   {"mode":"call","url":"ws://…","name":"c","namespace":"…","calls":[{"function_id":"…","payload":{…}}]}
//     makes the calls in order, prints one JSON line per call
//     ({"ok":true,"result":…} or {"ok":false,"code":…,"message":…}) and exits.
//
// Every line the script prints on stdout is JSON; the SDK's own logging goes
// to stderr. The plumbing is internal/testkit/nodesdk/driver.mjs.
import { callAll, connect, out, serve, unknownMode } from "../../../../internal/testkit/nodesdk/driver.mjs";

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
} else if (job.mode === "auth") {
  iii.registerFunction("auth::authenticate", async (input) => {
    if (input?.headers?.["x-user"] !== "alice") {
      throw new Error(`unknown user ${input?.headers?.["x-user"] ?? "(none)"}`);
    }
    return {
      allowed_functions: ["other::fn"],
      forbidden_functions: ["api::secret"],
      context: { user: "alice", ip: input.ip_address },
    };
  });
  iii.registerFunction("auth::middleware", async (input) => {
    out({ middleware: input });
    const result = await iii.trigger({ function_id: input.function_id, payload: input.payload });
    return { via: "middleware", result };
  });
  for (const id of job.functions) {
    iii.registerFunction(id, async (input) => ({ echo: input, by: job.name }));
  }
  serve(iii);
} else if (job.mode === "call") {
  await callAll(iii, job.calls);
} else {
  unknownMode(job);
}
