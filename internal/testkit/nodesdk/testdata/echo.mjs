// A stand-in Script for nodesdk's own tests: it prints its job back, one
// non-JSON line when asked, then a line for each line read on stdin, and
// exits when stdin closes. It does not load the SDK: these tests are about
// the process plumbing, not the SDK.
import { createInterface } from "node:readline";

const job = JSON.parse(process.argv[2]);
if (job.noise) process.stdout.write("not json\n");
process.stdout.write(JSON.stringify({ job, sdk: process.env.III_SDK_URL }) + "\n");
if (job.exit) process.exit(0);
for await (const line of createInterface({ input: process.stdin })) {
  process.stdout.write(JSON.stringify({ got: line }) + "\n");
}
