// Package schema holds the JSON Schemas of the sandbox contract's
// functions as the engine publishes them: the plugin host registers them
// with <adapter>::<op> and <adapter>::adapter::info, and the router with
// sandbox::<op>, so engine::functions::info (and `iii call -h`) shows
// callers and agents the request and reply shapes without reading code.
//
// The schemas describe what callers send and get (docs/sandbox-contract.md);
// the decoders in package contract remain the authority on what is
// accepted: unknown fields are ignored there, so no schema sets
// additionalProperties to false.
package schema

import (
	"encoding/json"

	"github.com/iii-sandbox/iii/contract"
)

// Request is the JSON Schema of op's request, where op is one of
// contract.Ops(), contract.OpAdapterInfo or contract.WorkerOps(); nil for
// any other op.
func Request(op string) json.RawMessage {
	if s, ok := workerRequests()[op]; ok {
		return mustMarshal(s)
	}
	s, ok := requests()[op]
	if !ok {
		return nil
	}
	return mustMarshal(s)
}

// Response is the JSON Schema of op's reply; nil for an unknown op.
func Response(op string) json.RawMessage {
	if s, ok := workerResponses()[op]; ok {
		return mustMarshal(s)
	}
	s, ok := responses()[op]
	if !ok {
		return nil
	}
	return mustMarshal(s)
}

// Description is a one-line description of op for function listings.
func Description(op string) string {
	if d, ok := workerDescriptions()[op]; ok {
		return d
	}
	return descriptions()[op]
}

// mustMarshal encodes a schema built from maps, strings, numbers and
// booleans, which cannot fail; an empty object is the fallback rather than
// a panic.
func mustMarshal(v any) json.RawMessage {
	b, err := json.Marshal(v)
	if err != nil {
		return json.RawMessage(`{}`)
	}
	return b
}

type m = map[string]any

func object(required []string, props m) m {
	o := m{"type": "object", "properties": props}
	if len(required) > 0 {
		o["required"] = required
	}
	return o
}

func str(desc string) m { return m{"type": "string", "description": desc} }

func boolean(desc string, def bool) m {
	return m{"type": "boolean", "default": def, "description": desc}
}

func whole(desc string) m { return m{"type": "integer", "minimum": 0, "description": desc} }

func wholeDefault(desc string, def uint64) m {
	return m{"type": "integer", "minimum": 1, "default": def, "description": desc}
}

func strings(desc string) m {
	return m{"type": "array", "items": m{"type": "string"}, "description": desc}
}

func mode(desc, def string) m {
	s := m{"type": "string", "pattern": "^0?[0-7]{3,4}$", "description": desc}
	if def != "" {
		s["default"] = def
	}
	return s
}

func sandboxID() m {
	return m{"type": "string", "format": "uuid", "description": "The sandbox, as sandbox::create returned it."}
}

func sandboxPath(desc string) m { return str(desc) }

func env() m {
	return m{
		"description": `Environment: a list of "K=V" strings, or an object of strings (names match [A-Za-z_][A-Za-z0-9_]*).`,
		"oneOf": []any{
			m{"type": "array", "items": m{"type": "string", "pattern": "^[^=]+="}},
			m{"type": "object", "additionalProperties": m{"type": "string"}},
		},
	}
}

func base64(desc string) m {
	return m{"type": "string", "contentEncoding": "base64", "description": desc}
}

func channelRef(direction string) m {
	return object([]string{"channel_id", "access_key", "direction"}, m{
		"channel_id": m{"type": "string"},
		"access_key": m{"type": "string"},
		"direction":  m{"type": "string", "enum": []string{direction}},
	})
}

// progress is create's and run's progress channel. The marker keyword
// tells callers such as `iii call` which field takes a channel to show
// progress from.
func progress() m {
	ref := object([]string{"channel_id", "access_key", "direction"}, m{
		"channel_id": m{"type": "string"},
		"access_key": m{"type": "string"},
		"direction":  m{"type": "string", "enum": []string{"write", "read"}},
	})
	ref["description"] = "A channel (engine::channels::create) to watch the sandbox start in: the adapter writes one JSON text message per event, " +
		"{phase: pulling|unpacking|building|booting|ready, image, image_ref, bytes_done?, bytes_total?, sandbox_id?}, and closes it before the reply. " +
		"Pass either end; the adapter writes, the caller reads the other end."
	ref[contract.ProgressSchemaMarker] = true
	return ref
}

func execReply() m {
	return m{
		"stdout":           str("Standard output, at most 1 MiB."),
		"stderr":           str("Standard error, at most 1 MiB."),
		"exit_code":        m{"type": []string{"integer", "null"}, "description": "null when the process did not exit normally (e.g. killed by a signal)."},
		"timed_out":        m{"type": "boolean"},
		"duration_ms":      whole("Wall time of the process."),
		"success":          m{"type": "boolean", "description": "exit_code == 0 and not timed_out."},
		"stdout_truncated": m{"type": "boolean", "description": "stdout was cut at its cap (contract 1.1)."},
		"stderr_truncated": m{"type": "boolean", "description": "stderr was cut at its cap (contract 1.1)."},
	}
}

func execReplyRequired() []string {
	return []string{"stdout", "stderr", "exit_code", "timed_out", "duration_ms", "success", "stdout_truncated", "stderr_truncated"}
}

func fsEntry() m {
	return object([]string{"name", "is_dir", "size", "mode", "mtime", "is_symlink"}, m{
		"name":       m{"type": "string"},
		"is_dir":     m{"type": "boolean"},
		"size":       whole("Bytes."),
		"mode":       mode("Octal permission bits, e.g. \"0644\".", ""),
		"mtime":      m{"type": "integer", "description": "Unix seconds."},
		"is_symlink": m{"type": "boolean", "description": "Symbolic links are not followed."},
	})
}

func fsPathRequest(extra m, required ...string) m {
	props := m{"sandbox_id": sandboxID(), "path": sandboxPath("A path in the sandbox; relative paths are relative to the image's home.")}
	for k, v := range extra {
		props[k] = v
	}
	return object(append([]string{"sandbox_id", "path"}, required...), props)
}

func requests() map[string]m {
	return map[string]m{
		contract.OpCreate: object([]string{"image"}, m{
			"image":             str("A catalog name (sandbox::catalog::list), not an OCI reference."),
			"cpus":              m{"type": "integer", "minimum": 1, "description": "Default: the adapter's default_cpus."},
			"memory_mb":         m{"type": "integer", "minimum": 1, "description": "Default: the adapter's default_memory_mb."},
			"name":              str("A label shown by sandbox::list; not an identifier."),
			"network":           boolean("Outbound networking.", false),
			"idle_timeout_secs": whole("Stop the sandbox after this long without activity. Default: the adapter's default_idle_timeout_secs."),
			"env":               env(),
			"progress":          progress(),
		}),
		contract.OpExec: object([]string{"sandbox_id"}, m{
			"sandbox_id": sandboxID(),
			"cmd":        str("The program, or a whole command line split like shell words when args and argv are absent. Not a shell: no expansion, pipes or &&."),
			"args":       strings("Arguments of cmd."),
			"argv":       strings("[program, args...]; wins when non-empty and cannot be combined with cmd or args."),
			"stdin":      base64("Standard input, base64."),
			"env":        env(),
			"timeout_ms": wholeDefault("Clamped to the adapter's max_exec_timeout_ms; exceeding it is S200.", contract.DefaultExecTimeoutMS),
			"workdir":    str("Working directory in the sandbox."),
		}),
		contract.OpRun: object([]string{"image", "code", "lang"}, m{
			"image":        str("A catalog name."),
			"code":         str("The program text."),
			"lang":         str("node/js/javascript, python/py, shell/sh/bash, or a literal interpreter path."),
			"files":        m{"type": "array", "items": object([]string{"path", "content"}, m{"path": m{"type": "string"}, "content": m{"type": "string"}}), "description": "UTF-8 files written before the code."},
			"env":          env(),
			"stdin":        base64("Standard input, base64."),
			"timeout_ms":   wholeDefault("Timeout of the code's run.", contract.DefaultExecTimeoutMS),
			"keep_sandbox": boolean("Keep the sandbox and return its sandbox_id.", false),
			"progress":     progress(),
		}),
		contract.OpList:        object(nil, m{}),
		contract.OpCatalogList: object(nil, m{}),
		contract.OpStop: object([]string{"sandbox_id"}, m{
			"sandbox_id": sandboxID(),
			"wait":       boolean("Return only once the sandbox has exited.", false),
		}),
		contract.OpPause:  object([]string{"sandbox_id"}, m{"sandbox_id": sandboxID()}),
		contract.OpResume: object([]string{"sandbox_id"}, m{"sandbox_id": sandboxID()}),
		contract.OpFsLs:   fsPathRequest(nil),
		contract.OpFsStat: fsPathRequest(nil),
		contract.OpFsRead: fsPathRequest(nil),
		contract.OpFsMkdir: fsPathRequest(m{
			"mode":    mode("Permission bits of the new directory.", contract.DefaultDirMode.String()),
			"parents": boolean("Create missing parent directories.", false),
		}),
		contract.OpFsWrite: func() m {
			s := fsPathRequest(m{
				"mode":    mode("Permission bits of the file.", contract.DefaultFileMode.String()),
				"parents": boolean("Create missing parent directories.", false),
				"content": m{
					"description": "UTF-8 text, or the read end of a channel (engine::channels::create) the caller streams the bytes into.",
					"oneOf":       []any{m{"type": "string"}, channelRef(readDirection)},
				},
				"content_b64": base64("The bytes, base64."),
			})
			s["oneOf"] = []any{m{"required": []string{"content"}}, m{"required": []string{"content_b64"}}}
			return s
		}(),
		contract.OpFsRm: fsPathRequest(m{"recursive": boolean("Remove a directory and its contents.", false)}),
		contract.OpFsChmod: fsPathRequest(m{
			"mode":      mode("New permission bits.", ""),
			"uid":       whole("New owner; absent keeps it."),
			"gid":       whole("New group; absent keeps it."),
			"recursive": boolean("Apply below a directory too.", false),
		}, "mode"),
		contract.OpFsMv: object([]string{"sandbox_id", "src", "dst"}, m{
			"sandbox_id": sandboxID(),
			"src":        str("Existing path."),
			"dst":        str("New path."),
			"overwrite":  boolean("Replace an existing dst.", false),
		}),
		contract.OpFsGrep: fsPathRequest(m{
			"pattern":        str("An RE2 regular expression."),
			"recursive":      boolean("Search below directories.", true),
			"ignore_case":    boolean("Case-insensitive match.", false),
			"include_glob":   strings("Gitignore-style globs a file must match."),
			"exclude_glob":   strings("Gitignore-style globs that skip files."),
			"max_matches":    wholeDefault("Stop after this many matches (truncated: true).", contract.DefaultGrepMaxMatches),
			"max_line_bytes": wholeDefault("Cut matched lines at this many bytes.", contract.DefaultGrepMaxLineBytes),
		}, "pattern"),
		contract.OpFsSed: func() m {
			s := object([]string{"sandbox_id", "pattern", "replacement"}, m{
				"sandbox_id":   sandboxID(),
				"files":        strings("Files to edit; exclusive with path."),
				"path":         str("A file, or a directory to walk; exclusive with files."),
				"recursive":    boolean("Walk below path.", true),
				"include_glob": strings("With path: gitignore-style globs a file must match."),
				"exclude_glob": strings("With path: gitignore-style globs that skip files."),
				"pattern":      str("RE2 regular expression, or literal text with regex: false."),
				"replacement":  str("Replacement text; $1 refers to a group when regex is true."),
				"regex":        boolean("pattern is a regular expression.", true),
				"first_only":   boolean("Replace only the first match in each file.", false),
				"ignore_case":  boolean("Case-insensitive match.", false),
			})
			s["oneOf"] = []any{m{"required": []string{"files"}}, m{"required": []string{"path"}}}
			return s
		}(),
		contract.OpAdapterInfo: object(nil, m{}),
	}
}

// readDirection is the direction of the channel end an adapter reads.
const readDirection = "read"

func responses() map[string]m {
	return map[string]m{
		contract.OpCreate: object([]string{"sandbox_id", "image"}, m{
			"sandbox_id": m{"type": "string", "format": "uuid"},
			"image":      m{"type": "string"},
		}),
		contract.OpExec: object(execReplyRequired(), execReply()),
		contract.OpRun: func() m {
			props := execReply()
			props["sandbox_id"] = m{"type": "string", "format": "uuid", "description": "Only with keep_sandbox: true."}
			return object(execReplyRequired(), props)
		}(),
		contract.OpList: object([]string{"sandboxes"}, m{
			"sandboxes": m{"type": "array", "items": object(
				[]string{"sandbox_id", "image", "age_secs", "exec_in_progress", "exec_in_flight", "exec_slots_free", "stopped"}, m{
					"sandbox_id":       m{"type": "string"},
					"name":             m{"type": "string"},
					"image":            m{"type": "string"},
					"age_secs":         whole(""),
					"exec_in_progress": m{"type": "boolean"},
					"exec_in_flight":   whole(""),
					"exec_slots_free":  whole(""),
					"stopped":          m{"type": "boolean"},
					"paused":           boolean("sandbox::pause paused it: exec and fs answer S005 until sandbox::resume. Absent means false.", false),
					"host_name":        str("The sandbox host that holds it: sandbox::list of a fleet binding sets it on every entry (docs/scale-out.md)."),
				})},
		}),
		contract.OpStop: object([]string{"sandbox_id", "stopped"}, m{
			"sandbox_id": m{"type": "string"},
			"stopped":    m{"type": "boolean"},
		}),
		contract.OpPause:  sandboxStatus(),
		contract.OpResume: sandboxStatus(),
		contract.OpCatalogList: object([]string{"images"}, m{
			"images": m{"type": "array", "items": object([]string{"name", "oci_ref", "kind"}, m{
				"name":    m{"type": "string"},
				"oci_ref": m{"type": "string"},
				"kind":    m{"type": "string", "enum": []string{contract.KindPreset, contract.KindCustom}},
			})},
		}),
		contract.OpFsLs:    object([]string{"entries"}, m{"entries": m{"type": "array", "items": fsEntry()}}),
		contract.OpFsStat:  fsEntry(),
		contract.OpFsMkdir: object([]string{"created"}, m{"created": m{"type": "boolean"}}),
		contract.OpFsWrite: object([]string{"bytes_written", "path"}, m{"bytes_written": whole(""), "path": m{"type": "string"}}),
		contract.OpFsRead: object([]string{"content", "size", "mode", "mtime"}, m{
			"content": func() m {
				r := channelRef(readDirection)
				r["description"] = "The read end of a channel carrying the file's bytes; always present."
				return r
			}(),
			"body":  str("The file as text, only when it is smaller than 1 MiB and valid UTF-8."),
			"size":  whole("Bytes."),
			"mode":  mode("Octal permission bits.", ""),
			"mtime": m{"type": "integer", "description": "Unix seconds."},
		}),
		contract.OpFsRm:    object([]string{"removed"}, m{"removed": m{"type": "boolean"}}),
		contract.OpFsChmod: object([]string{"updated"}, m{"updated": whole("Paths changed.")}),
		contract.OpFsMv:    object([]string{"moved"}, m{"moved": m{"type": "boolean"}}),
		contract.OpFsGrep: object([]string{"matches", "truncated"}, m{
			"matches": m{"type": "array", "items": object([]string{"path", "line", "content"}, m{
				"path":    m{"type": "string"},
				"line":    m{"type": "integer", "minimum": 1},
				"content": m{"type": "string"},
			})},
			"truncated": m{"type": "boolean"},
		}),
		contract.OpFsSed: object([]string{"results", "total_replacements"}, m{
			"results": m{"type": "array", "items": object([]string{"path", "replacements", "success"}, m{
				"path":         m{"type": "string"},
				"replacements": whole(""),
				"success":      m{"type": "boolean"},
				"error":        m{"type": "string"},
			})},
			"total_replacements": whole(""),
		}),
		contract.OpAdapterInfo: object([]string{"adapter", "adapter_version", "contract"}, m{
			"adapter":         m{"type": "string"},
			"adapter_version": m{"type": "string"},
			"contract": object([]string{"major", "minor"}, m{
				"major": whole("Sandbox contract major; the engine refuses another major with S302."),
				"minor": whole(""),
			}),
		}),
	}
}

func descriptions() map[string]string {
	return map[string]string{
		contract.OpCreate:      "Create a sandbox from a catalog image.",
		contract.OpExec:        "Run a process in a sandbox and wait for it.",
		contract.OpRun:         "Run code once in a fresh sandbox (stopped afterwards unless keep_sandbox).",
		contract.OpList:        "List live sandboxes.",
		contract.OpStop:        "Stop a sandbox and throw its writable state away.",
		contract.OpCatalogList: "List the images sandboxes can be created from.",
		contract.OpFsLs:        "List a directory in a sandbox.",
		contract.OpFsStat:      "Describe a path in a sandbox.",
		contract.OpFsMkdir:     "Create a directory in a sandbox.",
		contract.OpFsWrite:     "Write a file in a sandbox (inline text, base64, or a streamed channel).",
		contract.OpFsRead:      "Read a file from a sandbox (always a channel; inline body when small UTF-8).",
		contract.OpFsRm:        "Remove a path in a sandbox.",
		contract.OpFsChmod:     "Change permission bits (and owner) in a sandbox.",
		contract.OpFsMv:        "Move or rename a path in a sandbox.",
		contract.OpFsGrep:      "Search files in a sandbox with an RE2 regular expression.",
		contract.OpFsSed:       "Replace text in files of a sandbox.",
		contract.OpPause:       "Pause a sandbox: its memory and files are kept, nothing runs until sandbox::resume (adapters with the pause capability).",
		contract.OpResume:      "Resume a paused sandbox where it stopped (adapters with the pause capability).",
		contract.OpAdapterInfo: "Describe the adapter: name, version, sandbox contract version, back-end facts.",
	}
}

// sandboxStatus is the reply of sandbox::pause and sandbox::resume.
func sandboxStatus() m {
	return object([]string{"sandbox_id", "status"}, m{
		"sandbox_id": m{"type": "string"},
		"status":     m{"type": "string", "enum": []string{contract.SandboxRunning, contract.SandboxPaused}},
	})
}
