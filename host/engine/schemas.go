package engine

// JSON Schemas of the builtins, returned by engine::functions::info so
// callers (and agents) can discover the shapes without reading code.

const schemaFunctionsListIn = `{"type":"object","properties":{` +
	`"search":{"type":"string","description":"Case-insensitive substring of function_id or description."},` +
	`"prefix":{"type":"string","description":"function_id prefix."},` +
	`"worker":{"type":"string","description":"Owning worker name."},` +
	`"workers":{"type":"array","items":{"type":"string"},"description":"Any of these owning worker names."},` +
	`"include_internal":{"type":"boolean","default":false,"description":"Also list engine::* functions."}}}`

const functionSummarySchema = `{"type":"object","required":["function_id","namespace","worker_name"],"properties":{` +
	`"function_id":{"type":"string"},"namespace":{"type":"string"},"worker_name":{"type":"string"},` +
	`"description":{"type":"string"},"metadata":{}}}`

const schemaFunctionsListOut = `{"type":"object","required":["functions"],"properties":{` +
	`"functions":{"type":"array","items":` + functionSummarySchema + `}}}`

const schemaFunctionsInfoIn = `{"type":"object","properties":{` +
	`"function_id":{"type":"string","description":"One function id; answered with its detail."},` +
	`"function_ids":{"type":"array","maxItems":32,"items":{"type":"string"},"description":"Several ids; answered with {functions:[...]}."},` +
	`"namespace":{"type":"string","pattern":"^[a-z0-9_-]+$","description":"Resolve strictly here. Absent: default wins, else the only namespace holding the id."}},` +
	`"oneOf":[{"required":["function_id"]},{"required":["function_ids"]}]}`

const functionDetailSchema = `{"type":"object","required":["function_id","namespace","worker_name","registered_triggers"],"properties":{` +
	`"function_id":{"type":"string"},"namespace":{"type":"string"},"worker_name":{"type":"string"},` +
	`"description":{"type":"string"},"request_schema":{},"response_schema":{},"metadata":{},` +
	`"registered_triggers":{"type":"array","items":{"type":"object","required":["id","trigger_type","config"],` +
	`"properties":{"id":{"type":"string"},"trigger_type":{"type":"string"},"config":{}}}}}}`

const schemaFunctionsInfoOut = `{"oneOf":[` + functionDetailSchema + `,` +
	`{"type":"object","required":["functions"],"properties":{"functions":{"type":"array","items":{"oneOf":[` + functionDetailSchema + `,` +
	`{"type":"object","required":["function_id","error"],"properties":{"function_id":{"type":"string"},"error":{"type":"string","enum":["not_found"]}}}]}}}}]}`

const schemaWorkersListIn = `{"type":"object","properties":{` +
	`"search":{"type":"string","description":"Case-insensitive substring of the worker name."},` +
	`"runtime":{"type":"string","description":"Exact runtime, e.g. node, python, rust, go, engine."},` +
	`"status":{"type":"string","enum":["connected","available"]},` +
	`"include_internal":{"type":"boolean","default":false,"description":"Also list engine-internal workers."}}}`

const workerSummaryProps = `"name":{"type":["string","null"]},"description":{"type":["string","null"]},"version":{"type":["string","null"]},` +
	`"id":{"type":"string"},"namespace":{"type":"string"},"runtime":{"type":["string","null"]},"os":{"type":["string","null"]},` +
	`"status":{"type":"string"},"function_count":{"type":"integer"},"connected_at_ms":{"type":"integer"},` +
	`"active_invocations":{"type":"integer"},"isolation":{"type":["string","null"]},"ip_address":{"type":["string","null"]}`

const schemaWorkersListOut = `{"type":"object","required":["workers"],"properties":{"workers":{"type":"array","items":` +
	`{"type":"object","required":["id","namespace","status","function_count","connected_at_ms","active_invocations"],"properties":{` +
	workerSummaryProps + `}}}}}`

const schemaWorkersInfoIn = `{"type":"object","required":["name"],"properties":{` +
	`"name":{"type":"string"},"namespace":{"type":"string","pattern":"^[a-z0-9_-]+$","description":"Resolve strictly here. Absent: default wins, else the only namespace with that name."}}}`

const schemaWorkersInfoOut = `{"type":"object","required":["worker","functions","trigger_types","registered_triggers"],"properties":{` +
	`"worker":{"type":"object","required":["id","namespace","status","internal"],"properties":{` + workerSummaryProps +
	`,"pid":{"type":"integer"},"internal":{"type":"boolean"}}},` +
	`"functions":{"type":"array","items":` + functionSummarySchema + `},` +
	`"trigger_types":{"type":"array","items":{"type":"object","properties":{"id":{"type":"string"},"namespace":{"type":"string"},"worker_name":{"type":"string"},"description":{"type":"string"}}}},` +
	`"registered_triggers":{"type":"array","items":{"type":"object","properties":{"id":{"type":"string"},"trigger_type":{"type":"string"},` +
	`"function_id":{"type":"string"},"worker_name":{"type":"string"},"status":{"type":"string","enum":["active","pending"]},"config":{}}}}}}`

const schemaWorkersRegisterIn = `{"type":"object","properties":{` +
	`"name":{"type":"string","description":"Worker name; one live worker per (namespace, name)."},` +
	`"namespace":{"type":"string","pattern":"^[a-z0-9_-]+$","description":"Routing namespace; first register wins. Absent: default."},` +
	`"runtime":{"type":"string"},"version":{"type":"string"},"description":{"type":"string"},"os":{"type":"string"},` +
	`"pid":{"type":"integer"},"isolation":{"type":["string","null"]},"telemetry":{"type":"object"},` +
	`"_caller_worker_id":{"type":"string","description":"Injected by the engine."}}}`

const schemaSuccessOut = `{"type":"object","required":["success"],"properties":{"success":{"type":"boolean"}}}`

const channelBufferSizeSchema = `{"type":"integer","minimum":1,"maximum":1024,"default":64,"description":"Items buffered between writer and reader; larger values are capped at 1024."}`

const schemaChannelsCreateIn = `{"type":"object","properties":{` +
	`"buffer_size":` + channelBufferSizeSchema + `,` +
	`"channels":{"type":"array","minItems":1,"maxItems":16,"description":"Create several channels in one call; the answer is then {channels: [{writer, reader}, …]}.","items":{"type":"object","properties":{` +
	`"buffer_size":` + channelBufferSizeSchema + `,` +
	`"content":{"type":"string","contentEncoding":"base64","description":"The channel's whole stream (at most 64 KiB): it is created holding it as one binary item, its writer end already used and closed."}}}}}}`

const channelRefSchema = `{"type":"object","required":["channel_id","access_key","direction"],"properties":{` +
	`"channel_id":{"type":"string"},"access_key":{"type":"string"},"direction":{"type":"string","enum":["read","write"]}}}`

const schemaChannelsDropIn = `{"type":"object","properties":{` +
	`"channel_id":{"type":"string"},"access_key":{"type":"string"},"direction":{"type":"string","enum":["read","write"],"description":"Ignored: either ref drops the channel."},` +
	`"channels":{"type":"array","minItems":1,"maxItems":256,"description":"Drop several channels in one call instead of channel_id and access_key; the answer adds count.","items":` + channelRefSchema + `}}}`

const schemaChannelsDropOut = `{"type":"object","required":["dropped"],"properties":{"dropped":{"type":"boolean","description":"false: no channel with that id and key (unknown, finished or dropped already); with channels, whether any was dropped."},"count":{"type":"integer","description":"With channels: how many were dropped."}}}`

const channelPairSchema = `{"type":"object","required":["writer","reader"],"properties":{` +
	`"writer":` + channelRefSchema + `,"reader":` + channelRefSchema + `}}`

const schemaChannelsCreateOut = `{"type":"object","properties":{` +
	`"writer":` + channelRefSchema + `,"reader":` + channelRefSchema + `,` +
	`"channels":{"type":"array","description":"With channels in the input: one {writer, reader} per channel, in order.","items":` + channelPairSchema + `}}}`
