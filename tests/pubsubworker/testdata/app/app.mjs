// The Node iii-sdk worker of the pubsub acceptance test: two functions
// subscribed to the topic "news" with `subscribe` triggers, as upstream's
// pubsub README shows, and a function that publishes with the bare
// `publish` function.
const { registerWorker } = await import(process.env.III_SDK_URL);
const env = process.env;
const iii = registerWorker(env.III_URL, {
  workerName: env.III_WORKER_NAME,
  reconnectionConfig: { initialDelayMs: 50, maxDelayMs: 200, jitterFactor: 0 },
});
process.on("SIGTERM", async () => {
  try {
    await iii.shutdown();
  } finally {
    process.exit(0);
  }
});

const received = { a: [], b: [] };
for (const k of ["a", "b"]) {
  iii.registerFunction(`app::on_news_${k}`, async (data) => {
    // The engine marks object payloads with the calling worker.
    if (data && typeof data === "object" && !Array.isArray(data)) delete data._caller_worker_id;
    received[k].push(data);
    return null;
  });
  iii.registerTrigger({ type: "subscribe", function_id: `app::on_news_${k}`, config: { topic: "news" } });
}
iii.registerFunction("app::announce", async ({ data }) => {
  return await iii.trigger({ function_id: "publish", payload: { topic: "news", data } });
});
iii.registerFunction("app::received", async () => received);
console.log("app serving");
