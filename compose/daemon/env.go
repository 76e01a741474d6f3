package daemon

import (
	"fmt"
	"slices"

	"github.com/iii-sandbox/iii/compose"
	"github.com/iii-sandbox/iii/compose/composefile"
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
)

// workerEnv builds a host worker's environment, lowest layer first: the
// host baseline, each env_file in order, `environment`, then the reserved
// III_* variables. A file or map that sets a reserved variable is
// RESERVED_ENV_OVERRIDE.
func workerEnv(lookup func(string) (string, bool), c *composefile.Container, reserved map[string]string) ([]string, error) {
	env := map[string]string{}
	for _, k := range baselineEnv {
		if v, ok := lookup(k); ok {
			env[k] = v
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
