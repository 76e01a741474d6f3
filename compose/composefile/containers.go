package composefile

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strings"

	"github.com/Masterminds/semver/v3"
	"gopkg.in/yaml.v3"

	"github.com/iii-sandbox/iii/compose"
	"github.com/iii-sandbox/iii/internal/lazyre"
	"github.com/iii-sandbox/iii/internal/yamlnode"
)

var (
	// Registry package names are path-safe: they name cache directories.
	packageNameRE = lazyre.New(`^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$`)
	registryRE    = lazyre.New(`^[A-Za-z0-9]([A-Za-z0-9.-]{0,252})(:[0-9]{1,5})?$`)
	// versionTagRE is a registry tag such as latest or next.
	versionTagRE = lazyre.New(`^[A-Za-z][A-Za-z0-9._-]{0,63}$`)
)

func (p *parser) containers(f *File, key, n *yaml.Node) error {
	if yamlnode.IsNull(n) {
		if f.Engine == nil {
			return p.fail(compose.CodeEmptyContainers, key, "containers has no value and the file has no engine: section; declare at least one worker under containers:")
		}
		return p.fail(compose.CodeInvalidComposeFile, n, "containers has no value; write `containers: {}` for none, or remove the key")
	}
	if n.Kind != yaml.MappingNode {
		return p.fail(compose.CodeInvalidComposeFile, n, "containers must be a mapping from worker name to its declaration, not %s", aKind(n))
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		c, err := p.container(f, k, v)
		if err != nil {
			return err
		}
		f.Containers[c.Key] = c
		f.Order = append(f.Order, c.Key)
	}
	return nil
}

func (p *parser) container(f *File, k, n *yaml.Node) (*Container, error) {
	key := k.Value
	path := "containers." + key
	if !containerKeyRE.MatchString(key) {
		return nil, p.fail(compose.CodeInvalidComposeFile, k,
			"container key %q is not a valid worker name: the key is the name the worker registers under, so use 1 to 64 letters, digits, ., _ or -, starting with a letter or digit", clip(key, 80))
	}
	if yamlnode.IsNull(n) {
		return nil, p.fail(compose.CodeInvalidComposeFile, n, "%s has no value; declare at least worker: path://<dir> or worker: package://<name> with a version:", path)
	}
	if n.Kind != yaml.MappingNode {
		return nil, p.fail(compose.CodeInvalidComposeFile, n, "%s must be a mapping with worker: and its settings, not %s", path, aKind(n))
	}
	c := &Container{Key: key, Line: k.Line, StartupTimeout: f.StartupTimeout, Environment: map[string]string{}}
	c.Scripts.PreRunTimeout = DefaultPreRunTimeout
	var workerNode, versionNode, runtimeNode, runNode *yaml.Node
	for i := 0; i+1 < len(n.Content); i += 2 {
		fk, v := n.Content[i], n.Content[i+1]
		fpath := path + "." + fk.Value
		var err error
		switch fk.Value {
		case "worker":
			workerNode = v
			if yamlnode.IsNull(v) || (v.Kind == yaml.ScalarNode && strings.TrimSpace(v.Value) == "") {
				err = p.fail(compose.CodeInvalidComposeFile, v, "%s is empty; write worker: path://<dir> (a directory, relative to this file) or worker: package://<name> with a version:", fpath)
				break
			}
			c.Worker, err = p.nonEmpty(v, fpath)
		case "version":
			versionNode = v
			c.Version, err = p.version(v, fpath)
		case "runtime":
			runtimeNode = v
			c.Runtime, err = p.str(v, fpath)
			if err == nil && c.Runtime != "host" && c.Runtime != "vm" {
				err = p.fail(compose.CodeInvalidComposeFile, v, "%s is %q; write runtime: host or runtime: vm (the default)", fpath, clip(c.Runtime, 40))
			}
		case "start_after":
			c.StartAfter, err = p.startAfter(v, fpath)
		case "config_name":
			c.ConfigName, err = p.str(v, fpath)
			if err == nil && !configNameRE.MatchString(c.ConfigName) {
				err = p.fail(compose.CodeInvalidComposeFile, v, "%s %q is not a valid configuration id: use 1 to 64 characters from a-z, 0-9, _ and -", fpath, clip(c.ConfigName, 80))
			}
		case "config_override":
			// Never interpolated: the configuration worker resolves its
			// own ${VAR} when the worker reads it, which is how secrets
			// stay references instead of landing in files.
			if err = p.mapping(v, fpath); err == nil {
				c.ConfigOverride, err = p.opaque(v, fpath)
			}
		case "working_dir":
			var s string
			if s, err = p.nonEmpty(v, fpath); err == nil {
				c.WorkingDir = p.resolvePath(s)
			}
		case "environment":
			err = p.environment(c, v, fpath)
		case "env_file":
			err = p.envFiles(c, v, fpath)
		case "startup_timeout":
			c.StartupTimeout, err = p.duration(v, fpath, false)
		case "scripts":
			runNode, err = p.scripts(c, v, fpath)
		default:
			err = p.fail(compose.CodeInvalidComposeFile, fk,
				"unknown key %q in %s; a container has worker, version, runtime, start_after, config_name, config_override, working_dir, environment, env_file, startup_timeout and scripts%s",
				fk.Value, path, containerKeyHint(fk.Value))
		}
		if err != nil {
			return nil, err
		}
	}
	if workerNode == nil {
		return nil, p.fail(compose.CodeInvalidComposeFile, k, "%s has no worker:; add worker: path://<dir> (a directory, relative to this file) or worker: package://<name> with a version:", path)
	}
	src, err := p.source(c.Worker, workerNode, path)
	if err != nil {
		return nil, err
	}
	c.Source = src
	switch src.Kind {
	case SourcePackage:
		if versionNode == nil {
			return nil, p.fail(compose.CodeMissingVersionForPackage, workerNode,
				"%s: package://%s needs a version selector; add version: '<selector>' (an exact version such as '1.2.3', a range such as '^1.2', or a tag such as latest)", path, src.Name)
		}
		if runNode != nil && c.Runtime != "host" {
			return nil, p.fail(compose.CodePackageRunRequiresHostRuntime, runNode,
				"%s.scripts.run: a package starts with its own command; scripts.run is allowed only for a bundle run on the host, so add runtime: host or remove scripts.run", path)
		}
	case SourcePath:
		if versionNode != nil {
			return nil, p.fail(compose.CodeInvalidComposeFile, versionNode, "%s.version: a path:// worker has no version (it runs what is in its directory); remove version:", path)
		}
		if runtimeNode != nil {
			return nil, p.fail(compose.CodeRuntimeOnlyForBundles, runtimeNode,
				"%s.runtime: runtime applies only to registry bundles (package://); a path:// worker runs on the host, or in a VM when its iii.worker.yaml sets runtime.base_image; remove runtime:", path)
		}
	}
	return c, nil
}

func containerKeyHint(key string) string {
	switch key {
	case "depends_on":
		return " (write start_after: instead)"
	case "command", "entrypoint", "run":
		return " (the start command is scripts.run)"
	case "env":
		return " (write environment:)"
	case "image", "build":
		return " (Compose runs workers, not images: write worker: path://<dir> or package://<name>)"
	case "config":
		return " (write config_override:, or config_name: for a configuration entry)"
	case "pre_run", "post_run", "pre_run_timeout":
		return " (it goes under scripts:)"
	}
	return ""
}

// source parses a worker: reference.
func (p *parser) source(w string, n *yaml.Node, path string) (Source, error) {
	bad := func(format string, args ...any) (Source, error) {
		return Source{}, p.fail(compose.CodeUnsupportedWorkerSource, n, "%s.worker %q: %s", path, clip(w, 120), fmt.Sprintf(format, args...))
	}
	scheme, rest, ok := strings.Cut(w, "://")
	if !ok {
		if strings.HasPrefix(w, ".") || strings.HasPrefix(w, "/") || strings.HasPrefix(w, "~") {
			return bad("a directory is written path://%s", w)
		}
		return bad("write path://<dir> for a directory or package://%s for a registry package", w)
	}
	switch scheme {
	case "path":
		if rest == "" {
			return bad("path:// names no directory; write path://./<dir> (relative to this file) or an absolute path")
		}
		if strings.HasPrefix(rest, "~") {
			return bad("~ is not expanded; write the path relative to this file or absolute")
		}
		return Source{Kind: SourcePath, Path: p.resolvePath(rest)}, nil
	case "package":
		if i := strings.IndexByte(rest, '@'); i >= 0 {
			return bad("put the version in version: (write worker: package://%s and version: '%s')", rest[:i], rest[i+1:])
		}
		parts := strings.Split(rest, "/")
		var reg, name string
		switch len(parts) {
		case 1:
			name = parts[0]
		case 2:
			reg, name = parts[0], parts[1]
			if !registryRE.MatchString(reg) {
				return bad("%q is not a registry host; write package://<name> or package://<registry-host>/<name>", clip(reg, 80))
			}
		default:
			return bad("write package://<name> or package://<registry-host>/<name>")
		}
		if !packageNameRE.MatchString(name) {
			return bad("%q is not a package name: use letters, digits, ., _ and -, starting with a letter or digit", clip(name, 80))
		}
		return Source{Kind: SourcePackage, Registry: reg, Name: name}, nil
	}
	return bad("the %s:// scheme is not supported; write path://<dir> or package://<name>", clip(scheme, 20))
}

// version reads a selector: an exact version, a range or a registry tag.
// It is refused early when it can be none of those, so a typo fails at
// validation instead of at the registry.
func (p *parser) version(n *yaml.Node, path string) (string, error) {
	if n.Kind == yaml.ScalarNode && (n.ShortTag() == yamlnode.TagFloat || n.ShortTag() == yamlnode.TagInt) {
		return "", p.fail(compose.CodeInvalidComposeFile, n, "%s %s is a YAML number; quote it so it stays as written: version: '%s'", path, n.Value, n.Value)
	}
	s, err := p.nonEmpty(n, path)
	if err != nil {
		return "", err
	}
	if s != strings.TrimSpace(s) {
		return "", p.fail(compose.CodeInvalidComposeFile, n, "%s %q has spaces around it; remove them", path, clip(s, 80))
	}
	if versionTagRE.MatchString(s) {
		return s, nil
	}
	if _, err := semver.NewConstraint(s); err != nil {
		return "", p.fail(compose.CodeInvalidComposeFile, n,
			"%s %q is not a version selector; write an exact version ('1.2.3'), a range ('^1.2', '~1.2.0', '>=1 <2', '1.2.x') or a tag (latest, next)", path, clip(s, 80))
	}
	return s, nil
}

func (p *parser) startAfter(n *yaml.Node, path string) ([]string, error) {
	deps, err := p.stringList(n, path)
	if err != nil {
		return nil, err
	}
	seen := map[string]bool{}
	for i, d := range deps {
		if seen[d] {
			return nil, p.fail(compose.CodeInvalidComposeFile, n.Content[i], "%s lists %q twice; keep one", path, d)
		}
		seen[d] = true
	}
	return deps, nil
}

func (p *parser) environment(c *Container, n *yaml.Node, path string) error {
	if err := p.mapping(n, path); err != nil {
		if n.Kind == yaml.SequenceNode {
			return p.fail(compose.CodeInvalidComposeFile, n, "%s must be a mapping (KEY: value), not a list of KEY=value", path)
		}
		return err
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		name := k.Value
		vpath := path + "." + name
		if !envNameRE.MatchString(name) {
			return p.fail(compose.CodeInvalidComposeFile, k, "%s: %q is not a variable name; use letters, digits and _, not starting with a digit", path, clip(name, 80))
		}
		if IsReservedEnv(name) {
			return p.fail(compose.CodeReservedEnvOverride, k, "%s sets %s, which Compose sets itself for every worker; remove it (reserved: %s)",
				path, name, strings.Join(reservedEnv, ", "))
		}
		if yamlnode.IsNull(v) {
			return p.fail(compose.CodeInvalidComposeFile, v, "%s has no value; give it one (\"\" for empty) or remove it", vpath)
		}
		if v.Kind != yaml.ScalarNode {
			return p.fail(compose.CodeInvalidComposeFile, v, "%s must be a string, not %s", vpath, aKind(v))
		}
		value := v.Value
		// Numbers and booleans are taken as written (PORT: 8080): an
		// environment variable is text either way.
		if v.ShortTag() == yamlnode.TagStr {
			s, err := Interpolate(v.Value, p.lookup)
			if err != nil {
				return p.relocate(err, v, vpath)
			}
			value = s
		}
		c.Environment[name] = value
	}
	return nil
}

func (p *parser) envFiles(c *Container, n *yaml.Node, path string) error {
	files, err := p.stringList(n, path)
	if err != nil {
		return err
	}
	for i, rel := range files {
		abs := p.resolvePath(rel)
		// Checked at validation, so a typo fails before anything starts;
		// the daemon reads the files again at start time.
		at := n.Content[i]
		epath := fmt.Sprintf("%s[%d]", path, i)
		st, err := os.Stat(abs)
		switch {
		case errors.Is(err, fs.ErrNotExist):
			return p.fail(compose.CodeMissingEnvFile, at, "%s: %s does not exist (paths are relative to the compose file's directory); create it or remove the entry", epath, rel)
		case err != nil:
			return p.fail(compose.CodeIOError, at, "%s: cannot read %s: %v", epath, rel, unwrapPath(err))
		case st.IsDir():
			return p.fail(compose.CodeMissingEnvFile, at, "%s: %s is a directory; name a file of KEY=value lines", epath, rel)
		}
		if _, err := ReadEnvFile(abs); err != nil {
			return p.relocate(err, at, epath)
		}
		c.EnvFile = append(c.EnvFile, abs)
	}
	return nil
}

func (p *parser) scripts(c *Container, n *yaml.Node, path string) (runNode *yaml.Node, err error) {
	if err := p.mapping(n, path); err != nil {
		return nil, err
	}
	var timeoutNode *yaml.Node
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		kpath := path + "." + k.Value
		switch k.Value {
		case "pre_run":
			c.Scripts.PreRun, err = p.nonEmpty(v, kpath)
		case "pre_run_timeout":
			timeoutNode = v
			c.Scripts.PreRunTimeout, err = p.duration(v, kpath, false)
		case "run":
			runNode = v
			c.Scripts.Run, err = p.nonEmpty(v, kpath)
		case "post_run":
			c.Scripts.PostRun, err = p.nonEmpty(v, kpath)
		default:
			hint := ""
			switch k.Value {
			case "start":
				hint = " (scripts.start belongs in the worker's iii.worker.yaml; here write run:)"
			case "install":
				hint = " (scripts.install belongs in the worker's iii.worker.yaml)"
			}
			err = p.fail(compose.CodeInvalidComposeFile, k, "unknown key %q in %s; scripts has pre_run, pre_run_timeout, run and post_run%s", k.Value, path, hint)
		}
		if err != nil {
			return nil, err
		}
	}
	if timeoutNode != nil && c.Scripts.PreRun == "" {
		return nil, p.fail(compose.CodePreRunTimeoutWithoutPreRun, timeoutNode, "%s.pre_run_timeout is set but there is no pre_run hook to time; add pre_run: <command> or remove pre_run_timeout", path)
	}
	return runNode, nil
}

// statEnvFile distinguishes a missing env file from an unreadable one.
func statEnvFile(path string) error {
	st, err := os.Stat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return compose.New(compose.CodeMissingEnvFile, fmt.Sprintf("env file %s does not exist", path))
	}
	if err != nil {
		return compose.New(compose.CodeIOError, fmt.Sprintf("cannot read env file %s: %v", path, unwrapPath(err)))
	}
	if st.IsDir() {
		return compose.New(compose.CodeMissingEnvFile, fmt.Sprintf("env file %s is a directory; name a file of KEY=value lines", path))
	}
	return nil
}

func unwrapPath(err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}
