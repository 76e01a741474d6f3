package config

import (
	"encoding/json"
	"fmt"

	"gopkg.in/yaml.v3"

	"github.com/iii-sandbox/iii/internal/yamlnode"
)

// In iii 0.26 the iii-stream worker keeps its settings as the
// configuration worker's entry "iii-stream" (docs/stream.md#settings): the
// config.yaml block seeds the entry the first time, and from then on the
// entry is what the worker runs with and `configuration::set` changes it
// at run time. These are the entry's three faces: the value a Stream
// seeds, the value read back as a Stream (through the same checks as the
// file), and the entry's JSON Schema.

// StreamEntryID is the configuration entry of the iii-stream worker.
const StreamEntryID = "iii-stream"

// SeedValue is the entry value s seeds, in upstream's shape: {port, host,
// auth_function?, adapter: {name: "kv", config: {store_method, file_path,
// save_interval_ms, channel_size}}} or {..., adapter: {name: "redis",
// config: {redis_url}}}. file_path is absolute (config.yaml's relative one
// resolved against its directory).
func (s Stream) SeedValue() json.RawMessage {
	v := map[string]any{
		"port": s.Port,
		"host": s.Host,
	}
	if s.Adapter == StreamAdapterRedis {
		u := s.RedisURL
		if s.RedisURLAsWritten != "" {
			// The entry expands it on every read, as the file did.
			u = s.RedisURLAsWritten
		}
		v["adapter"] = map[string]any{"name": s.Adapter, "config": map[string]any{"redis_url": u}}
	} else {
		v["adapter"] = map[string]any{
			"name": s.Adapter,
			"config": map[string]any{
				"store_method":     s.StoreMethod,
				"file_path":        s.FilePath,
				"save_interval_ms": s.SaveInterval.Milliseconds(),
				"channel_size":     s.ChannelSize,
			},
		}
	}
	if s.AuthFunction != "" {
		v["auth_function"] = s.AuthFunction
	}
	b, _ := json.Marshal(v) // plain maps of strings and numbers always encode
	return b
}

// StreamFromEntry reads the entry's value (placeholders already expanded)
// as the settings of the worker named name, with the same keys, defaults
// and checks as config.yaml; relative file paths resolve against dir.
func StreamFromEntry(name string, value json.RawMessage, dir string) (*Stream, error) {
	var doc yaml.Node
	// JSON is YAML: the value becomes the node the file's block would be.
	if err := yaml.Unmarshal(value, &doc); err != nil || len(doc.Content) != 1 {
		return nil, &Error{Code: CodeInvalidConfig, Message: fmt.Sprintf("configuration entry %s: the value is not a JSON object", StreamEntryID)}
	}
	node := doc.Content[0]
	if node.Kind != yaml.MappingNode {
		return nil, &Error{Code: CodeInvalidConfig, Message: fmt.Sprintf("configuration entry %s: the value must be an object, not a %s", StreamEntryID, yamlnode.KindName(node))}
	}
	p := &parser{name: "configuration entry " + StreamEntryID, dir: dir}
	return p.stream(entry{Worker: Worker{Name: name, Type: TypeStream}, configNode: node}, nil)
}

// StreamEntrySchema is the entry's JSON Schema: the keys config.yaml
// takes, with their bounds.
func StreamEntrySchema() json.RawMessage {
	return json.RawMessage(fmt.Sprintf(`{
  "$schema": "https://json-schema.org/draft/2020-12/schema",
  "title": "iii-stream",
  "description": "WebSocket stream server settings: host/port binding, connection auth function, and the store (the built-in kv, or redis for several engines on one Redis).",
  "type": "object",
  "additionalProperties": false,
  "properties": {
    "port": {"type": "integer", "minimum": 0, "maximum": 65535, "default": %d, "description": "TCP port of the stream socket; a change rebinds it."},
    "host": {"type": "string", "minLength": 1, "default": %q, "description": "Interface the stream socket binds to; a change rebinds it."},
    "auth_function": {"type": ["string", "null"], "description": "Function called at each WebSocket upgrade to admit the client."},
    "adapter": {
      "description": "The store. kv (the default): the built-in store of this engine. redis: the streams live in Redis and their change events travel over its pub/sub, so several engines (this one's or upstream iii's) on one Redis share them. bridge is not supported: it forwards stream pub/sub to a pub/sub worker on a remote engine, which this engine does not have.",
      "oneOf": [
        {"type": "null"},
        {
          "title": %q,
          "type": "object",
          "additionalProperties": false,
          "properties": {
            "name": {"const": %q, "description": "The built-in store."},
            "config": {
              "type": ["object", "null"],
              "additionalProperties": false,
              "properties": {
                "store_method": {"enum": [%q, %q]},
                "file_path": {"type": "string", "minLength": 1},
                "save_interval_ms": {"type": "integer", "minimum": %d, "maximum": %d},
                "channel_size": {"type": "integer", "minimum": 1, "maximum": %d}
              }
            }
          }
        },
        {
          "title": %q,
          "type": "object",
          "additionalProperties": false,
          "required": ["name"],
          "properties": {
            "name": {"const": %q, "description": "Streams in Redis, shared by every engine on it."},
            "config": {
              "type": ["object", "null"],
              "additionalProperties": false,
              "properties": {
                "redis_url": {"type": "string", "minLength": 1, "default": %q, "description": "redis://[user:password@]host[:port][/db], rediss:// (TLS) or unix:///path. Write ${REDIS_URL} to keep a password out of the stored value."}
              }
            }
          }
        }
      ]
    }
  }
}`, DefaultStreamPort, DefaultStreamHost, DefaultStreamAdapter, DefaultStreamAdapter, StoreFileBased, StoreInMemory,
		minStreamSaveMS, maxStreamSaveMS, maxStreamChannelCap, StreamAdapterRedis, StreamAdapterRedis, DefaultStreamRedisURL))
}
