// A Node iii-sdk worker that registers HTTP-invocation functions: the
// engine calls their endpoints itself. Started by the Go test
// (nodesdk.SDK.Start) with the SDK's entry point in III_SDK_URL and a job
// in argv[2]:
//
//   {"url":"ws://…","name":"w","functions":[{"id":"acc::echo","url":"http://…","method":"POST","timeout_ms":5000}]}
//
// It registers them, prints {"started":true} and serves until stdin
// closes. The plumbing is internal/testkit/nodesdk/driver.mjs.
import { connect, serve } from "../../../internal/testkit/nodesdk/driver.mjs";

const { job, iii } = await connect();
for (const f of job.functions) {
  const invocation = { url: f.url };
  if (f.method) invocation.method = f.method;
  if (f.timeout_ms) invocation.timeout_ms = f.timeout_ms;
  iii.registerFunction(f.id, invocation, { description: `HTTP function ${f.id}` });
}
serve(iii);
