package schema

import "github.com/iii-sandbox/iii/contract"

// The worker::* schemas, published with <adapter>::worker::<op> for
// adapters that announce the worker capability (docs/vm-workers.md).

func vmID() m {
	return m{"type": "string", "pattern": "^[a-z0-9][a-z0-9._-]*$", "maxLength": contract.MaxVMIDLen,
		"description": "The worker VM's id, chosen by the caller (Compose: project slug, namespace, container key); it names the state directory ~/.iii/sandbox/workers/<vm_id>/."}
}

func workerStatus() m {
	return object([]string{"vm_id", "name", "state", "restarts"}, m{
		"vm_id":      m{"type": "string"},
		"name":       m{"type": "string"},
		"namespace":  m{"type": "string"},
		"image":      m{"type": "string"},
		"state":      m{"type": "string", "enum": []string{contract.WorkerStarting, contract.WorkerRunning, contract.WorkerExited, contract.WorkerFailed, contract.WorkerStopped}},
		"pid":        m{"type": "integer", "description": "The command's pid in the guest, while it runs."},
		"exit_code":  m{"type": "integer", "description": "How the command last exited."},
		"started_at": m{"type": "string", "format": "date-time"},
		"restarts":   whole("Starts after the first since the state directory was made."),
		"last_error": str("Why the last start failed or the command ended, when it did not exit with 0."),
		"state_dir":  str("The worker's state directory on the host."),
	})
}

func workerRequests() map[string]m {
	return map[string]m{
		contract.OpWorkerStart: object([]string{"vm_id", "name", "image", "host_dir", "command", "engine_url"}, m{
			"vm_id":     vmID(),
			"name":      str("The worker's name (the container key); it registers with the engine under it."),
			"namespace": m{"type": "string", "pattern": "^[a-z0-9_-]+$", "description": "The project namespace."},
			"image":     str("A catalog name (sandbox::catalog::list) or any OCI reference, e.g. runtime.base_image."),
			"host_dir":  str("Absolute host directory copied into the guest's /workspace (node_modules, .venv, target, dist, __pycache__, .pytest_cache, .next, .git and .iii left out at any depth). Must lie under the adapter's host_roots, else S501."),
			"workdir":   str("Where install and command run: an absolute guest path, or relative to /workspace. Default /workspace."),
			"install":   str("Shell command run once per persistent disk before the command (again when it changes)."),
			"command":   str("Shell command that starts the worker (/bin/sh -c)."),
			"env":       env(),
			"config": object([]string{"file_name", "content"}, m{
				"file_name": m{"type": "string", "pattern": "^[A-Za-z0-9_][A-Za-z0-9._-]{0,127}$"},
				"content":   str("The resolved configuration's text; published at /run/iii/config/<file_name>, named by III_CONFIG."),
			}),
			"cpus":       m{"type": "integer", "minimum": 1, "default": 1},
			"memory_mb":  m{"type": "integer", "minimum": 64, "default": 1024},
			"engine_url": str("The engine's ws:// URL as the host sees it; a 127.0.0.1 or localhost host becomes the guest's gateway 10.0.2.2."),
			"exclude":    strings("Further absolute host paths under host_dir the copy leaves out."),
			"include":    strings("Top-level names of host_dir the copy leaves out by default (node_modules, dist, …) to copy all the same, e.g. vendored dependencies; never .iii."),
			"wait":       boolean("Return once the command runs; a failed start is then the call's error.", false),
		}),
		contract.OpWorkerStop: object([]string{"vm_id"}, m{
			"vm_id":      vmID(),
			"timeout_ms": m{"type": "integer", "minimum": 0, "maximum": contract.MaxWorkerStopTimeoutMS, "default": contract.DefaultWorkerStopTimeoutMS, "description": "Grace between SIGTERM and SIGKILL."},
		}),
		contract.OpWorkerStatus: object([]string{"vm_id"}, m{"vm_id": vmID()}),
		contract.OpWorkerList:   object(nil, m{}),
		contract.OpWorkerLogs: object([]string{"vm_id"}, m{
			"vm_id":  vmID(),
			"tail":   m{"type": "integer", "minimum": 1, "maximum": contract.MaxWorkerLogsTail, "default": contract.DefaultWorkerLogsTail},
			"cursor": whole("The cursor of an earlier reply: return the entries after it."),
		}),
		contract.OpWorkerRemove: object([]string{"vm_id"}, m{"vm_id": vmID()}),
	}
}

func workerResponses() map[string]m {
	return map[string]m{
		contract.OpWorkerStart: object([]string{"vm_id", "state"}, m{
			"vm_id": m{"type": "string"},
			"state": m{"type": "string"},
			"pid":   m{"type": "integer"},
		}),
		contract.OpWorkerStop:   workerStatus(),
		contract.OpWorkerStatus: workerStatus(),
		contract.OpWorkerList:   object([]string{"workers"}, m{"workers": m{"type": "array", "items": workerStatus()}}),
		contract.OpWorkerLogs: object([]string{"vm_id", "entries", "cursor", "truncated", "more"}, m{
			"vm_id": m{"type": "string"},
			"entries": m{"type": "array", "items": object([]string{"seq", "time", "stream", "message"}, m{
				"seq":     whole(""),
				"time":    m{"type": "string", "format": "date-time"},
				"stream":  m{"type": "string", "enum": []string{contract.LogStdout, contract.LogStderr, contract.LogSystem}},
				"message": m{"type": "string"},
			})},
			"cursor":    whole("Pass it back to get what follows."),
			"truncated": m{"type": "boolean", "description": "Older entries exist that were not returned."},
			"more":      m{"type": "boolean", "description": "With a cursor: newer entries follow this page."},
		}),
		contract.OpWorkerRemove: object([]string{"vm_id", "removed", "state_dir"}, m{
			"vm_id":     m{"type": "string"},
			"removed":   m{"type": "boolean"},
			"state_dir": m{"type": "string"},
		}),
	}
}

func workerDescriptions() map[string]string {
	return map[string]string{
		contract.OpWorkerStart:  "Boot a worker VM: copy host_dir into /workspace, run install once, then command (Compose's VM workers).",
		contract.OpWorkerStop:   "Stop a worker VM's command (SIGTERM, grace, SIGKILL) and power the VM off; its state stays.",
		contract.OpWorkerStatus: "Describe a worker VM: state, exit code, restarts, last error.",
		contract.OpWorkerList:   "List the worker VMs this adapter keeps state for.",
		contract.OpWorkerLogs:   "Read a worker VM's stdout and stderr (and the adapter's notes) from its log.",
		contract.OpWorkerRemove: "Stop a worker VM and delete its state directory (persistent disk included).",
	}
}
