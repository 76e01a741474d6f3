// The Node iii-sdk workers of the authority acceptance test. Started by the
// Go test (nodesdk.SDK.Start) with the SDK's entry point in III_SDK_URL and
// a job in argv[2]: {"mode":…,"url":"ws://…","name":…,"headers":{…}}.
//
//   hooks     (engine token) serves the trigger type "webhook" (prints
//             {"bound":id} per binding); hooks::fire fires every binding,
//             in id order, by calling its condition_function_id (when its
//             config has one; false skips) and its function_id from this
//             connection, printing {"fired":id,"ok":…,"code":…}.
//   queue     (engine token) is the queue provider engine::queue::enqueue
//             (prints {"queued":function_id}); queue::deliver delivers every
//             enqueued call in order from this connection, printing
//             {"delivered":function_id,"ok":…,"code":…}.
//   ops       (engine token) registers ops::wipe (privileged), ops::log and
//             ops::note; prints {"called":id,"input":…} for each call.
//   attacker  (no token) binds job.triggers ([{type,function_id,config}])
//             while their targets do not exist yet, then enqueues
//             job.enqueue ([function_id]) and prints {"enqueued":id} each.
//   call      makes job.calls in order and prints one line per call.
//
// Every mode but call prints {"started":true} when ready and serves until
// stdin closes. Every stdout line is JSON.
import { callAll, connect, out, serve, unknownMode } from "../../../internal/testkit/nodesdk/driver.mjs";

const { job, iii } = await connect();

const codeOf = (err) => err?.code ?? "";
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

// registered waits until the engine has applied this connection's
// registrations up to the function id (they wait for the SDK to name its
// worker).
async function registered(id) {
  for (let i = 0; i < 400; i++) {
    try {
      const info = await iii.trigger({ function_id: "engine::functions::info", payload: { function_id: id } });
      if (info) return info;
    } catch {
      // not yet
    }
    await sleep(25);
  }
  throw new Error(`${id} was never registered`);
}

if (job.mode === "hooks") {
  const bindings = new Map();
  iii.registerTriggerType(
    { id: "webhook", description: "fired by hooks::fire" },
    {
      async registerTrigger({ id, function_id, config }) {
        bindings.set(id, { function_id, config });
        out({ bound: id, function_id });
      },
      async unregisterTrigger({ id }) {
        bindings.delete(id);
      },
    },
  );
  iii.registerFunction("hooks::fire", async () => {
    for (const id of [...bindings.keys()].sort()) {
      const { function_id, config } = bindings.get(id);
      const payload = { from: "webhook", trigger: id, payload: "attacker" };
      try {
        if (config?.condition_function_id) {
          const ok = await iii.trigger({ function_id: config.condition_function_id, payload });
          if (ok === false) {
            out({ fired: id, ok: true, skipped: true });
            continue;
          }
        }
        await iii.trigger({ function_id, payload });
        out({ fired: id, ok: true });
      } catch (err) {
        out({ fired: id, ok: false, code: codeOf(err) });
      }
    }
    return { fired: bindings.size };
  });
  await registered("hooks::fire");
  serve(iii);
} else if (job.mode === "queue") {
  const jobs = [];
  iii.registerFunction("engine::queue::enqueue", async (req) => {
    jobs.push(req);
    out({ queued: req.function_id });
    return {};
  });
  iii.registerFunction("queue::deliver", async () => {
    const n = jobs.length;
    for (const j of jobs.splice(0)) {
      try {
        await iii.trigger({ function_id: j.function_id, payload: j.data });
        out({ delivered: j.function_id, ok: true });
      } catch (err) {
        out({ delivered: j.function_id, ok: false, code: codeOf(err) });
      }
    }
    return { delivered: n };
  });
  await registered("queue::deliver");
  serve(iii);
} else if (job.mode === "ops") {
  const fn = (id) => async (input) => {
    out({ called: id, input });
    return { ran: id };
  };
  iii.registerFunction("ops::wipe", fn("ops::wipe"), { description: "privileged", metadata: { privileged: true } });
  iii.registerFunction("ops::log", fn("ops::log"));
  iii.registerFunction("ops::note", fn("ops::note"));
  await registered("ops::note");
  serve(iii);
} else if (job.mode === "attacker") {
  for (const t of job.triggers) {
    iii.registerTrigger({ type: t.type, function_id: t.function_id, config: t.config ?? {} });
  }
  // A function of its own with a trigger, registered last: once the engine
  // lists it, every trigger before it has been applied.
  iii.registerFunction("attacker::probe", async () => ({}));
  iii.registerTrigger({ type: "stream", function_id: "attacker::probe", config: { stream_name: "probe" } });
  for (let i = 0; ; i++) {
    const info = await registered("attacker::probe");
    if (info?.registered_triggers?.length) break;
    if (i > 400) throw new Error("the probe trigger was never registered");
    await sleep(25);
  }
  for (const function_id of job.enqueue ?? []) {
    const res = await iii.trigger({ function_id, payload: { payload: "attacker", enqueued: function_id }, action: { type: "enqueue", queue: "jobs" } });
    out({ enqueued: function_id, receipt: res?.messageReceiptId ?? null });
  }
  serve(iii);
} else if (job.mode === "call") {
  await callAll(iii, job.calls);
} else {
  unknownMode(job);
}
