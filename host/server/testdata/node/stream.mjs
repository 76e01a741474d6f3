// Drives the published Node SDK (iii-sdk) against the iii-stream worker the
// way upstream's guide uses it. III_SDK_URL is the SDK's entry point as a
// file URL; argv[2] is a JSON job:
//
//   {"mode":"call","url":"ws://…","name":"c","calls":[{"function_id":"stream::set","payload":{…}}]}
//     makes the calls in order (iii.trigger), prints one JSON line per call
//     ({"ok":true,"result":…} or {"ok":false,…}) and exits.
//   {"mode":"listen","url":"ws://…","name":"l","stream_name":"presence","stream_url":"ws://127.0.0.1:3112/","group_id":"room-1"}
//     registers streamtest::on_change with a "stream" trigger on stream_name
//     and streamtest::on_join with a "stream:join" trigger, prints
//     {"trigger":<input>} / {"join":<input>} for each call; once both are
//     registered (it prints {"info":…}, engine::functions::info of
//     streamtest::on_join) it opens the stream socket (the ws package the SDK uses),
//     joins group_id and prints {"socket":<message>} for each message, then
//     {"started":true}. Runs until stdin closes.
//
// Every line the script prints on stdout is JSON; the SDK's own logging goes
// to stderr.
import { callAll, connect, out, serve, unknownMode } from "../../../../internal/testkit/nodesdk/driver.mjs";

const { job, iii } = await connect();

if (job.mode === "call") {
  await callAll(iii, job.calls);
} else if (job.mode === "listen") {
  iii.registerFunction("streamtest::on_change", async (input) => {
    out({ trigger: input });
    return {};
  });
  iii.registerFunction("streamtest::on_join", async (input) => {
    out({ join: input });
    return { unauthorized: false };
  });
  iii.registerTrigger({ type: "stream", function_id: "streamtest::on_change", config: { stream_name: job.stream_name } });
  iii.registerTrigger({ type: "stream:join", function_id: "streamtest::on_join", config: {} });
  // The engine applies a new connection's registrations once the SDK has
  // named its worker: ask until the join trigger shows.
  let info;
  for (let i = 0; i < 200; i++) {
    try {
      info = await iii.trigger({ function_id: "engine::functions::info", payload: { function_id: "streamtest::on_join" } });
      if (info?.registered_triggers?.length) break;
    } catch {
      // not registered yet
    }
    await new Promise((r) => setTimeout(r, 50));
  }
  out({ info });
  const { default: WebSocket } = await import(new URL("../../ws/wrapper.mjs", process.env.III_SDK_URL));
  const sock = new WebSocket(job.stream_url);
  sock.on("message", (data) => out({ socket: JSON.parse(data.toString()) }));
  sock.on("error", (err) => out({ socket_error: String(err) }));
  sock.on("open", () => {
    sock.send(JSON.stringify({ type: "join", data: { subscriptionId: "sub-1", streamName: job.stream_name, groupId: job.group_id } }));
    serve(iii);
  });
} else {
  unknownMode(job);
}
