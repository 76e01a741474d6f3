package pluginhost

import (
	"bytes"
	"context"
	"encoding/json"

	"github.com/iii-sandbox/iii/host/engine"
)

// adaptersRequest is the input of engine::adapters::start, stop and
// restart. Config stays raw: absent, null and an object differ for
// restart (absent keeps the last configuration).
type adaptersRequest struct {
	Adapter   string
	Namespace string
	Path      string
	Config    json.RawMessage // nil when absent
	// Token is the engine token the caller presents (docs/project-token.md).
	Token string
}

// decodeAdaptersRequest reads the input object. Unknown keys are ignored
// (the engine adds _caller_worker_id); a known key of the wrong type is
// an error that names it.
func decodeAdaptersRequest(data json.RawMessage, withPath, withConfig bool) (adaptersRequest, error) {
	var out adaptersRequest
	d := bytes.TrimSpace(data)
	if len(d) == 0 || string(d) == "null" {
		return out, errBody(CodeInvalidRequest, "adapter is required")
	}
	if d[0] != '{' {
		return out, errBody(CodeInvalidRequest, "the input must be a JSON object {adapter, namespace?, ...}")
	}
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(d, &fields); err != nil {
		return out, errBody(CodeInvalidRequest, "the input is not valid JSON: %v", err)
	}
	str := func(name string, dst *string) error {
		raw, ok := fields[name]
		if !ok || string(bytes.TrimSpace(raw)) == "null" {
			return nil
		}
		if err := json.Unmarshal(raw, dst); err != nil {
			return errBody(CodeInvalidRequest, "%s must be a string", name)
		}
		return nil
	}
	if err := str("adapter", &out.Adapter); err != nil {
		return out, err
	}
	if out.Adapter == "" {
		return out, errBody(CodeInvalidRequest, "adapter is required: the adapter's worker name, e.g. sandbox-libkrun")
	}
	if err := str("namespace", &out.Namespace); err != nil {
		return out, err
	}
	if err := str("token", &out.Token); err != nil {
		return out, err
	}
	if withPath {
		if err := str("path", &out.Path); err != nil {
			return out, err
		}
	}
	if withConfig {
		if raw, ok := fields["config"]; ok && string(bytes.TrimSpace(raw)) != "null" {
			raw = bytes.TrimSpace(raw)
			if len(raw) == 0 || raw[0] != '{' {
				return out, errBody(CodeInvalidRequest, "config must be a JSON object (the adapter's configuration)")
			}
			out.Config = raw
		}
	}
	return out, nil
}

type hostFunction struct {
	def engine.FunctionDef
	h   engine.Handler
}

func encode(v any) (json.RawMessage, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, errBody(CodeInvalidRequest, "encode the reply: %v", err)
	}
	return b, nil
}

// statusReply encodes the adapter's status, or returns the error; after a
// failed start the adapter stays listed (engine::adapters::list) in state
// failed or incompatible with its last_error.
func statusReply(st Status, err error) (json.RawMessage, error) {
	if err != nil {
		return nil, err
	}
	return encode(st)
}

func (h *Host) functions() []hostFunction {
	return []hostFunction{
		{engine.FunctionDef{ID: FnStart, Privileged: true, Description: "Start a sandbox adapter as a go-plugin subprocess and publish it as worker <adapter> in its namespace.",
			RequestSchema: json.RawMessage(schemaStartIn), ResponseSchema: json.RawMessage(schemaStatus)},
			func(ctx context.Context, call *engine.Call) (json.RawMessage, error) {
				in, err := decodeAdaptersRequest(call.Data, true, true)
				if err != nil {
					return nil, err
				}
				if err := h.authorize(FnStart, in.Token, call.CallerAdmin); err != nil {
					return nil, err
				}
				return statusReply(h.Start(ctx, StartRequest{Adapter: in.Adapter, Namespace: in.Namespace, Path: in.Path, Config: in.Config}))
			}},
		{engine.FunctionDef{ID: FnStop, Privileged: true, Description: "Stop a sandbox adapter the engine runs; sandbox calls then fail with S301.",
			RequestSchema: json.RawMessage(schemaStopIn), ResponseSchema: json.RawMessage(schemaStatus)},
			func(ctx context.Context, call *engine.Call) (json.RawMessage, error) {
				in, err := decodeAdaptersRequest(call.Data, false, false)
				if err != nil {
					return nil, err
				}
				if err := h.authorize(FnStop, in.Token, call.CallerAdmin); err != nil {
					return nil, err
				}
				return statusReply(h.Stop(ctx, in.Adapter, in.Namespace))
			}},
		{engine.FunctionDef{ID: FnRestart, Privileged: true, Description: "Restart a sandbox adapter, with a new config or (config absent) its last one. A changed config that the running adapter can take live (it announces the reconfigure capability) is applied in place, keeping its process.",
			RequestSchema: json.RawMessage(schemaRestartIn), ResponseSchema: json.RawMessage(schemaStatus)},
			func(ctx context.Context, call *engine.Call) (json.RawMessage, error) {
				in, err := decodeAdaptersRequest(call.Data, false, true)
				if err != nil {
					return nil, err
				}
				if err := h.authorize(FnRestart, in.Token, call.CallerAdmin); err != nil {
					return nil, err
				}
				return statusReply(h.Restart(ctx, in.Adapter, in.Namespace, in.Config))
			}},
		{engine.FunctionDef{ID: FnList, Description: "List the sandbox adapters the engine runs, with their state.",
			RequestSchema: json.RawMessage(`{"type":"object","properties":{}}`), ResponseSchema: json.RawMessage(schemaListOut)},
			func(context.Context, *engine.Call) (json.RawMessage, error) {
				warnings := []string{}
				if h.opts.Warnings != nil {
					warnings = append(warnings, h.opts.Warnings()...)
				}
				return encode(map[string]any{"adapters": h.List(), "warnings": warnings})
			}},
	}
}

const schemaAdapterProps = `"adapter":{"type":"string","pattern":"^[a-z0-9][a-z0-9_-]{0,63}$","description":"The adapter's worker name and function prefix, e.g. sandbox-libkrun."},` +
	`"namespace":{"type":"string","pattern":"^[a-z0-9_-]+$","default":"default","description":"The namespace the adapter runs in."}`

const schemaToken = `"token":{"type":"string","description":"Optional, kept for older callers: the engine token. The function is privileged: the engine lets only a connection that presented the engine token call it (UNAUTHORIZED otherwise), and such a caller needs no token field. docs/security.md."}`

const schemaStartIn = `{"type":"object","required":["adapter"],"properties":{` + schemaAdapterProps + `,` + schemaToken + `,` +
	`"path":{"type":"string","description":"Absolute path of the adapter binary. Absent: Compose's package cache, ~/.iii/plugins, $III_PLUGIN_PATH, then beside iii."},` +
	`"config":{"type":"object","description":"The adapter's configuration (e.g. image_allowlist); absent means {}."}}}`

const schemaStopIn = `{"type":"object","required":["adapter"],"properties":{` + schemaAdapterProps + `,` + schemaToken + `}}`

const schemaRestartIn = `{"type":"object","required":["adapter"],"properties":{` + schemaAdapterProps + `,` + schemaToken + `,` +
	`"config":{"type":"object","description":"A new configuration; absent keeps the last one."}}}`

const schemaStatusObject = `{"type":"object","required":["adapter","namespace","state","path","restarts"],"properties":{` +
	`"adapter":{"type":"string"},"namespace":{"type":"string"},` +
	`"state":{"type":"string","enum":["starting","running","failed","stopped","incompatible"]},` +
	`"pid":{"type":"integer"},"path":{"type":"string"},` +
	`"contract":{"type":"object","required":["major","minor"],"properties":{"major":{"type":"integer"},"minor":{"type":"integer"}}},` +
	`"adapter_version":{"type":"string"},"last_error":{"type":"string"},"restarts":{"type":"integer","minimum":0},` +
	`"started_by":{"type":"string","enum":["config.yaml","call"],"description":"config.yaml: the engine started the adapter its sandbox: section binds, and stops it when the binding changes; call: engine::adapters::start (Compose, a user)."}}}`

const schemaStatus = schemaStatusObject

const schemaListOut = `{"type":"object","required":["adapters","warnings"],"properties":{"adapters":{"type":"array","items":` + schemaStatusObject + `},` +
	`"warnings":{"type":"array","items":{"type":"string"},"description":"What to fix in the sandbox binding now, e.g. a host that serves a fleet-bound adapter without --fleet (the router never uses it)."}}}`
