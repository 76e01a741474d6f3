package daemon

import (
	"fmt"
	"slices"
	"strings"

	"github.com/iii-sandbox/iii/compose"
	"github.com/iii-sandbox/iii/compose/composefile"
	"github.com/iii-sandbox/iii/compose/engineproc"
)

// baselineEnv are the variables a worker inherits from Compose (spec §5.5,
// Unix); everything else it gets is declared.
var baselineEnv = []string{"PATH", "HOME", "USER", "LOGNAME", "SHELL", "TERM", "TMPDIR", "TZ", "LANG", "LC_ALL"}

// Reserved variables Compose sets for every worker.
const (
	envURL              = "III_URL"
	envNamespace        = "III_NAMESPACE"
	envComposeNamespace = "III_COMPOSE_NAMESPACE"
	envComposeFile      = "III_COMPOSE_FILE"
	envComposeDir       = "III_COMPOSE_DIR"
	envWorkerName       = "III_WORKER_NAME"
	envConfig           = "III_CONFIG"
	envConfigName       = "III_CONFIG_NAME"
	envIsolation        = "III_ISOLATION"
	// envEngineToken is the engine token's variable; Compose gives it to
	// the engine it manages and to no worker.
	envEngineToken = engineproc.EnvToken
)

// workerEnv builds a host worker's environment, lowest layer first: the
// host baseline, each env_file in order, `environment`, then the reserved
// III_* variables. A file or map that sets a reserved variable is
// RESERVED_ENV_OVERRIDE.
func workerEnv(lookup func(string) (string, bool), c *composefile.Container, reserved map[string]string) ([]string, error) {
	return buildEnv(lookup, c, reserved, true)
}

// vmEnv is a VM worker's environment for worker::start: workerEnv without
// the host baseline (the guest has its own PATH and HOME). The adapter
// sets III_URL, III_ISOLATION and III_CONFIG itself, so reserved holds none
// of them. III_ENGINE_TOKEN is refused: the engine token never enters a VM.
func vmEnv(lookup func(string) (string, bool), c *composefile.Container, reserved map[string]string) ([]string, error) {
	env, err := buildEnv(lookup, c, reserved, false)
	if err != nil {
		return nil, err
	}
	for _, kv := range env {
		if strings.HasPrefix(kv, envEngineToken+"=") {
			return nil, compose.New(compose.CodeReservedEnvOverride, fmt.Sprintf(
				"container %q runs in a VM and its environment sets %s: the engine token never enters a VM (the adapter refuses it); remove it from environment/env_file", c.Key, envEngineToken))
		}
	}
	return env, nil
}

func buildEnv(lookup func(string) (string, bool), c *composefile.Container, reserved map[string]string, baseline bool) ([]string, error) {
	env := map[string]string{}
	if baseline {
		for _, k := range baselineEnv {
			if v, ok := lookup(k); ok {
				env[k] = v
			}
		}
	}
	for _, path := range c.EnvFile {
		vars, err := composefile.ReadEnvFile(path)
		if err != nil {
			return nil, err
		}
		for k, v := range vars {
			if composefile.IsReservedEnv(k) {
				return nil, compose.New(compose.CodeReservedEnvOverride, fmt.Sprintf(
					"container %q: env file %s sets %s, which Compose sets itself; remove it from the file", c.Key, path, k))
			}
			env[k] = v
		}
	}
	for k, v := range c.Environment {
		if composefile.IsReservedEnv(k) {
			return nil, compose.New(compose.CodeReservedEnvOverride, fmt.Sprintf(
				"container %q: environment sets %s, which Compose sets itself; remove it", c.Key, k))
		}
		env[k] = v
	}
	for k, v := range reserved {
		env[k] = v
	}
	out := make([]string, 0, len(env))
	for k, v := range env {
		out = append(out, k+"="+v)
	}
	slices.Sort(out)
	return out, nil
}
