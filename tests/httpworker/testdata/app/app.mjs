// The Node iii-sdk worker of the http acceptance test: it serves routes
// through `http` triggers as upstream's docs show (registerTrigger with
// api_path and http_method), answering {status_code, headers, body}.
const { registerWorker } = await import(process.env.III_SDK_URL);
const env = process.env;
const name = env.III_WORKER_NAME;
const iii = registerWorker(env.III_URL, {
  workerName: name,
  reconnectionConfig: { initialDelayMs: 50, maxDelayMs: 200, jitterFactor: 0 },
});
process.on("SIGTERM", async () => {
  try {
    await iii.shutdown();
  } finally {
    process.exit(0);
  }
});

iii.registerFunction("app::user", async (req) => ({
  status_code: 201,
  headers: { "x-user-id": req.path_params.id, "content-type": "application/json" },
  body: {
    id: req.path_params.id,
    verbose: req.query_params.verbose,
    name: req.body?.name,
    method: req.method,
    path: req.path,
    agent: req.headers["x-test-agent"],
  },
}));
iii.registerFunction("app::hello", async (req) => ({
  status_code: 200,
  headers: ["Content-Type: text/plain; charset=utf-8", "X-Hello: yes"],
  body: `hello ${req.path_params.who}`,
}));
iii.registerFunction("app::slow", async () => {
  await new Promise((resolve) => setTimeout(resolve, 3000));
  return { status_code: 200, body: "slow" };
});
iii.registerFunction("app::dup", async () => ({ status_code: 500, body: "the duplicate route answered" }));

// A streaming route, as upstream's http() helper of @iii-dev/helpers
// writes it: status and headers on the response channel, then the body in
// pieces; the raw request body read from request_body.
const { http } = await import(new URL("../../@iii-dev/helpers/dist/http/index.mjs", process.env.III_SDK_URL).href);
iii.registerFunction("app::stream", http(async (req, res) => {
  let raw = "";
  for await (const chunk of req.request_body.stream) raw += chunk.toString();
  res.status(206);
  res.headers({ "content-type": "text/plain", "x-streamed": "yes" });
  res.stream.write("part one; ");
  res.stream.write(`you sent ${raw.length} bytes: ${raw}`);
  res.stream.end();
}));
iii.registerTrigger({ type: "http", function_id: "app::stream", config: { api_path: "/stream", http_method: "POST" } });
iii.registerTrigger({ type: "http", function_id: "app::user", config: { api_path: "users/:id", http_method: "POST" } });
iii.registerTrigger({ type: "http", function_id: "app::hello", config: { api_path: "/hello/{who}" } });
iii.registerTrigger({ type: "http", function_id: "app::slow", config: { api_path: "/slow" } });
// Same method and shape as users/:id: the http worker refuses it. The
// test asks for it once users/:id is served (parked triggers reach the
// provider in no set order).
iii.registerFunction("app::add-dup", async () => {
  iii.registerTrigger({ type: "http", function_id: "app::dup", config: { api_path: "/users/:other/", http_method: "POST" } });
  return null;
});
console.log(`app ${name} serving`);
