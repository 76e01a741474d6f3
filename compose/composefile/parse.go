package composefile

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/iii-sandbox/iii/compose"
	"github.com/iii-sandbox/iii/internal/lazyre"
	"github.com/iii-sandbox/iii/internal/yamlnode"
)

var (
	namespaceRE = lazyre.New(`^[a-z0-9_-]+$`)
	// Container keys are worker names and also name files under the state
	// directory (logs/<key>.log, config/<key>.yaml), so they are kept
	// path-safe: no separators, no leading dot.
	containerKeyRE = lazyre.New(`^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$`)
	// configNameRE is the configuration worker's id alphabet.
	configNameRE = lazyre.New(`^[a-z0-9_-]{1,64}$`)
	envNameRE    = lazyre.New(`^[A-Za-z_][A-Za-z0-9_]*$`)
)

// reservedEnv are the variables Compose sets for every worker (spec §5.5);
// a compose file or env file may not set them.
var reservedEnv = []string{
	"III_URL", "III_NAMESPACE", "III_COMPOSE_NAMESPACE", "III_COMPOSE_FILE", "III_COMPOSE_DIR",
	"III_WORKER_NAME", "III_CONFIG", "III_CONFIG_NAME", "III_ISOLATION",
}

// ReservedEnv returns the variables Compose sets itself for every worker.
func ReservedEnv() []string { return append([]string(nil), reservedEnv...) }

// IsReservedEnv reports whether name is one of ReservedEnv.
func IsReservedEnv(name string) bool {
	for _, r := range reservedEnv {
		if r == name {
			return true
		}
	}
	return false
}

// Load reads the compose file at path and parses it. A file that cannot be
// read is COMPOSE_FILE_UNREADABLE; every other error is the one Parse
// returns. lookup reads Compose's environment for ${VAR}; nil means no
// variable is set.
func Load(path string, lookup func(string) (string, bool)) (*File, error) {
	data, err := readLimited(path)
	if err != nil {
		return nil, err
	}
	return Parse(data, path, lookup)
}

func readLimited(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, unreadable(path, err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, unreadable(path, err)
	}
	if st.IsDir() {
		return nil, compose.New(compose.CodeComposeFileUnreadable, fmt.Sprintf(
			"%s is a directory; name the compose file itself, e.g. %s", path, filepath.Join(path, FileName)))
	}
	data, err := io.ReadAll(io.LimitReader(f, maxFileSize+1))
	if err != nil {
		return nil, unreadable(path, err)
	}
	if len(data) > maxFileSize {
		return nil, compose.New(compose.CodeInvalidComposeFile, fmt.Sprintf(
			"%s is larger than %d MiB; a compose file declares workers, not data", path, maxFileSize>>20))
	}
	return data, nil
}

func unreadable(path string, err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		err = pe.Err
	}
	if errors.Is(err, fs.ErrNotExist) {
		return compose.New(compose.CodeComposeFileUnreadable, fmt.Sprintf(
			"%s does not exist; create it or name another compose file", path))
	}
	return compose.New(compose.CodeComposeFileUnreadable, fmt.Sprintf("cannot read %s: %v", path, err))
}

// Parse parses and validates the contents of the compose file at path.
// path names the file in messages (as given) and, made absolute with its
// symlinks resolved, is the project's identity: relative paths in the file
// resolve against its directory. lookup reads Compose's environment for
// ${VAR}; nil means no variable is set. Every error is a *compose.Error.
func Parse(data []byte, path string, lookup func(string) (string, bool)) (*File, error) {
	p := &parser{name: path, lookup: lookup}
	if len(data) > maxFileSize {
		return nil, compose.New(compose.CodeInvalidComposeFile, fmt.Sprintf(
			"%s is larger than %d MiB; a compose file declares workers, not data", path, maxFileSize>>20))
	}
	canon, err := canonicalPath(path)
	if err != nil {
		return nil, compose.New(compose.CodeComposeFileUnreadable, fmt.Sprintf("cannot resolve %s: %v", path, err))
	}
	p.dir = filepath.Dir(canon)
	f, err := p.parse(data)
	if err != nil {
		return nil, err
	}
	f.Path = canon
	f.Dir = p.dir
	return f, nil
}

// canonicalPath is path made absolute with symlinks resolved. A file that
// does not exist (Parse of in-memory data) keeps its absolute form.
func canonicalPath(path string) (string, error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return "", err
	}
	if real, err := filepath.EvalSymlinks(abs); err == nil {
		return real, nil
	}
	// The file may not exist, but its directory might be a symlink; resolve
	// that so the project dir is canonical either way.
	if realDir, err := filepath.EvalSymlinks(filepath.Dir(abs)); err == nil {
		return filepath.Join(realDir, filepath.Base(abs)), nil
	}
	return abs, nil
}

type parser struct {
	name   string // the file as messages name it
	dir    string // absolute directory relative paths resolve against
	lookup LookupFunc
}

// fail builds an error located at n.
func (p *parser) fail(code string, n *yaml.Node, format string, args ...any) *compose.Error {
	loc := p.name
	if n != nil && n.Line > 0 {
		loc = fmt.Sprintf("%s:%d", p.name, n.Line)
	}
	return compose.New(code, loc+": "+fmt.Sprintf(format, args...))
}

// relocate adds the location of n to a located-less *compose.Error (from
// Interpolate or ParseDuration) and names the key it came from.
func (p *parser) relocate(err error, n *yaml.Node, path string) error {
	var ce *compose.Error
	if !errors.As(err, &ce) {
		return p.fail(compose.CodeInvalidComposeFile, n, "%s: %v", path, err)
	}
	return p.fail(ce.Code, n, "%s: %s", path, ce.Message)
}

// topNode parses data into the document's top node with references
// shielded, aliases unfolded, and duplicate or malformed keys refused.
func (p *parser) topNode(data []byte) (*yaml.Node, error) {
	src, sh := shieldRefs(data)
	dec := yaml.NewDecoder(strings.NewReader(src))
	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, nil
		}
		return nil, p.yamlError(sh.Restore(err.Error()))
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); err == nil {
		return nil, p.fail(compose.CodeInvalidComposeFile, &extra, "a second YAML document starts here; a compose file holds one document (remove the --- separator)")
	} else if !errors.Is(err, io.EOF) {
		return nil, p.yamlError(sh.Restore(err.Error()))
	}
	budget := yamlnode.MaxNodes
	unfolded, bad, msg := yamlnode.Unfold(&doc, &budget)
	if bad != nil {
		return nil, p.fail(compose.CodeInvalidComposeFile, bad, "%s", msg)
	}
	restoreTree(sh, unfolded)
	if err := p.checkKeys(unfolded, ""); err != nil {
		return nil, err
	}
	if len(unfolded.Content) == 0 {
		return nil, nil
	}
	return unfolded.Content[0], nil
}

var yamlLineRE = lazyre.New(`^yaml: line ([0-9]+): (.*)$`)

// yamlError turns a yaml.v3 syntax error into file:line form.
func (p *parser) yamlError(msg string) error {
	if m := yamlLineRE.FindStringSubmatch(msg); m != nil {
		return compose.New(compose.CodeInvalidComposeFile, fmt.Sprintf("%s:%s: not valid YAML: %s", p.name, m[1], m[2]))
	}
	return compose.New(compose.CodeInvalidComposeFile, fmt.Sprintf("%s: not valid YAML: %s", p.name, strings.TrimPrefix(msg, "yaml: ")))
}

// checkKeys walks every mapping at any depth (config_override and
// engine.workers values included): yaml.v3 keeps repeated keys without
// complaint, and a repeated key silently dropping the first value is
// exactly the surprise a strict file must refuse.
func (p *parser) checkKeys(n *yaml.Node, path string) error {
	switch n.Kind {
	case yaml.DocumentNode, yaml.SequenceNode:
		for i, c := range n.Content {
			sub := path
			if n.Kind == yaml.SequenceNode {
				sub = fmt.Sprintf("%s[%d]", path, i)
			}
			if err := p.checkKeys(c, sub); err != nil {
				return err
			}
		}
	case yaml.MappingNode:
		seen := map[string]int{}
		for i := 0; i+1 < len(n.Content); i += 2 {
			k := n.Content[i]
			if k.Kind != yaml.ScalarNode {
				return p.fail(compose.CodeInvalidComposeFile, k, "%s: a key must be a plain value, not %s", orTop(path), aKind(k))
			}
			if k.ShortTag() == yamlnode.TagMerge {
				return p.fail(compose.CodeInvalidComposeFile, k, "%s: merge keys (<<) are not supported; repeat the keys, or use an alias (*name) for a whole value", orTop(path))
			}
			if first, dup := seen[k.Value]; dup {
				return p.fail(compose.CodeInvalidComposeFile, k, "key %q appears twice in %s (first at line %d); keep one", k.Value, orTop(path), first)
			}
			seen[k.Value] = k.Line
			if err := p.checkKeys(n.Content[i+1], joinPath(path, k.Value)); err != nil {
				return err
			}
		}
	}
	return nil
}

func (p *parser) parse(data []byte) (*File, error) {
	top, err := p.topNode(data)
	if err != nil {
		return nil, err
	}
	f := &File{
		Namespace:      DefaultNamespace,
		StartupTimeout: DefaultStartupTimeout,
		StopTimeout:    DefaultStopTimeout,
		Containers:     map[string]*Container{},
	}
	if top == nil || yamlnode.IsNull(top) {
		return nil, compose.New(compose.CodeEmptyContainers, fmt.Sprintf(
			"%s is empty; declare at least one worker under containers: (or an engine: section)", p.name))
	}
	if top.Kind != yaml.MappingNode {
		return nil, p.fail(compose.CodeInvalidComposeFile, top,
			"the top level must be a mapping with namespace, startup_timeout, stop_timeout, engine and containers, not %s", aKind(top))
	}
	var containersKey, containersNode *yaml.Node
	for i := 0; i+1 < len(top.Content); i += 2 {
		k, v := top.Content[i], top.Content[i+1]
		switch k.Value {
		case "namespace":
			ns, err := p.namespace(v, "namespace")
			if err != nil {
				return nil, err
			}
			f.Namespace, f.NamespaceSet = ns, true
		case "startup_timeout":
			d, err := p.duration(v, "startup_timeout", false)
			if err != nil {
				return nil, err
			}
			f.StartupTimeout = d
		case "stop_timeout":
			d, err := p.duration(v, "stop_timeout", true)
			if err != nil {
				return nil, err
			}
			f.StopTimeout = d
		case "engine":
			e, err := p.engine(v, top)
			if err != nil {
				return nil, err
			}
			f.Engine = e
		case "containers":
			containersKey, containersNode = k, v
		default:
			return nil, p.fail(compose.CodeInvalidComposeFile, k, "unknown key %q at the top level; a compose file has namespace, startup_timeout, stop_timeout, engine and containers%s",
				k.Value, topKeyHint(k.Value))
		}
	}
	// Containers are read after the top-level scalars so their startup
	// timeout inherits the file's value wherever startup_timeout is written.
	if containersNode != nil {
		if err := p.containers(f, containersKey, containersNode); err != nil {
			return nil, err
		}
	}
	if len(f.Containers) == 0 && f.Engine == nil {
		at := containersKey
		return nil, p.fail(compose.CodeEmptyContainers, at,
			"the file declares no containers and has no engine: section; declare at least one worker under containers:, or add engine: to start an engine with no project workers")
	}
	if f.Engine != nil && f.Engine.Sandbox != nil && !f.Engine.Sandbox.NamespaceSet {
		f.Engine.Sandbox.Namespace = f.Namespace
	}
	if err := p.checkGraph(f); err != nil {
		return nil, err
	}
	return f, nil
}

func topKeyHint(key string) string {
	switch key {
	case "services":
		return " (Compose calls them containers:)"
	case "workers":
		return " (project workers go under containers:, engine workers under engine.workers)"
	case "version":
		return " (worker-compose.yaml has no version: key; remove it)"
	case "sandbox":
		return " (the sandbox binding is engine.sandbox in a compose file)"
	case "registration_namespace_grace_ms":
		return " (it goes under engine:)"
	}
	return ""
}

// SetNamespace changes the project namespace, as `iii compose -n <ns>`
// does for every project it loads, and moves the engine.sandbox namespace
// with it when the file leaves that to the default. The caller validates
// ns (INVALID_NAMESPACE) with ValidNamespace.
func (f *File) SetNamespace(ns string) {
	f.Namespace = ns
	if f.Engine != nil && f.Engine.Sandbox != nil && !f.Engine.Sandbox.NamespaceSet {
		f.Engine.Sandbox.Namespace = ns
	}
}

// ValidNamespace reports an INVALID_NAMESPACE error for ns, or nil.
func ValidNamespace(ns string) error {
	if namespaceRE.MatchString(ns) {
		return nil
	}
	return compose.New(compose.CodeInvalidNamespace, fmt.Sprintf(
		"namespace %q is not valid: use only a-z, 0-9, _ and - (no upper case, no blank); leave it out for default", clip(ns, 80)))
}

// ---- scalar readers -------------------------------------------------------

// str reads a string value and expands its references. A YAML number or
// boolean is refused rather than converted: `version: 1.10` would silently
// become "1.1".
func (p *parser) str(n *yaml.Node, path string) (string, error) {
	if yamlnode.IsNull(n) {
		return "", p.fail(compose.CodeInvalidComposeFile, n, "%s has no value; give it one or remove the key", path)
	}
	if n.Kind != yaml.ScalarNode || n.ShortTag() != yamlnode.TagStr {
		hint := ""
		if n.Kind == yaml.ScalarNode {
			hint = fmt.Sprintf("; quote it: %s: '%s'", lastKey(path), n.Value)
		}
		return "", p.fail(compose.CodeInvalidComposeFile, n, "%s must be a string, not %s%s", path, aKind(n), hint)
	}
	s, err := Interpolate(n.Value, p.lookup)
	if err != nil {
		return "", p.relocate(err, n, path)
	}
	return s, nil
}

// nonEmpty is str that also refuses a blank result.
func (p *parser) nonEmpty(n *yaml.Node, path string) (string, error) {
	s, err := p.str(n, path)
	if err != nil {
		return "", err
	}
	if strings.TrimSpace(s) == "" {
		return "", p.fail(compose.CodeInvalidComposeFile, n, "%s is blank; give it a value or remove the key", path)
	}
	return s, nil
}

func (p *parser) namespace(n *yaml.Node, path string) (string, error) {
	if yamlnode.IsNull(n) {
		return "", p.fail(compose.CodeInvalidNamespace, n, "%s has no value; write a name such as shop, or remove the key for default", path)
	}
	s, err := p.str(n, path)
	if err != nil {
		return "", err
	}
	if !namespaceRE.MatchString(s) {
		return "", p.fail(compose.CodeInvalidNamespace, n,
			"%s %q is not a valid namespace: use only a-z, 0-9, _ and - (no upper case, no blank); remove the key for default", path, clip(s, 80))
	}
	return s, nil
}

// duration reads a duration. zeroOK allows 0 (stop_timeout: 0s means kill
// at once); a zero readiness or hook budget could never succeed.
func (p *parser) duration(n *yaml.Node, path string, zeroOK bool) (d time.Duration, err error) {
	if yamlnode.IsNull(n) {
		return 0, p.fail(compose.CodeInvalidDuration, n, "%s has no value; write a duration such as 30s, or remove the key for the default", path)
	}
	if n.Kind != yaml.ScalarNode {
		return 0, p.fail(compose.CodeInvalidDuration, n, "%s must be a duration such as 30s, not %s", path, aKind(n))
	}
	if tag := n.ShortTag(); tag != yamlnode.TagStr {
		return 0, p.fail(compose.CodeInvalidDuration, n, "%s: %s is a bare %s; durations need a unit: write %s: %ss (or ms, m, h)",
			path, n.Value, yamlnode.KindName(n), lastKey(path), n.Value)
	}
	s, err := Interpolate(n.Value, p.lookup)
	if err != nil {
		return 0, p.relocate(err, n, path)
	}
	d, err = ParseDuration(s)
	if err != nil {
		return 0, p.relocate(err, n, path)
	}
	if d == 0 && !zeroOK {
		return 0, p.fail(compose.CodeInvalidDuration, n, "%s is 0; it must be longer than 0 (or remove the key for the default)", path)
	}
	return d, nil
}

// intValue reads an integer in [lo, hi]. A plain ${VAR} that expands to a
// number counts as one, as it would if the number were written in place.
func (p *parser) intValue(n *yaml.Node, path string, lo, hi int) (int, error) {
	if yamlnode.IsNull(n) {
		return 0, p.fail(compose.CodeInvalidComposeFile, n, "%s has no value; give it an integer or remove the key", path)
	}
	text := n.Value
	ok := n.Kind == yaml.ScalarNode && n.ShortTag() == yamlnode.TagInt
	if n.Kind == yaml.ScalarNode && n.ShortTag() == yamlnode.TagStr && n.Style&quotedStyles == 0 && strings.Contains(n.Value, "${") {
		s, err := Interpolate(n.Value, p.lookup)
		if err != nil {
			return 0, p.relocate(err, n, path)
		}
		text, ok = s, true
	}
	if !ok {
		return 0, p.fail(compose.CodeInvalidComposeFile, n, "%s must be an integer, not %s", path, aKind(n))
	}
	v, err := strconv.ParseInt(strings.TrimSpace(strings.ReplaceAll(text, "_", "")), 0, 64)
	if err != nil {
		return 0, p.fail(compose.CodeInvalidComposeFile, n, "%s: %q is not an integer", path, clip(text, 40))
	}
	if v < int64(lo) || v > int64(hi) {
		return 0, p.fail(compose.CodeInvalidComposeFile, n, "%s is %d; it must be between %d and %d", path, v, lo, hi)
	}
	return int(v), nil
}

const quotedStyles = yaml.DoubleQuotedStyle | yaml.SingleQuotedStyle | yaml.LiteralStyle | yaml.FoldedStyle | yaml.TaggedStyle

// mapping checks that n is a mapping; null gets the "write {}" fix.
func (p *parser) mapping(n *yaml.Node, path string) error {
	if yamlnode.IsNull(n) {
		return p.fail(compose.CodeInvalidComposeFile, n, "%s has no value; write %s: {} or remove the key", path, lastKey(path))
	}
	if n.Kind != yaml.MappingNode {
		return p.fail(compose.CodeInvalidComposeFile, n, "%s must be a mapping, not %s", path, aKind(n))
	}
	return nil
}

// stringList reads a list of strings with references expanded.
func (p *parser) stringList(n *yaml.Node, path string) ([]string, error) {
	if yamlnode.IsNull(n) {
		return nil, p.fail(compose.CodeInvalidComposeFile, n, "%s has no value; write %s: [] or remove the key", path, lastKey(path))
	}
	if n.Kind != yaml.SequenceNode {
		hint := ""
		if n.Kind == yaml.ScalarNode {
			hint = fmt.Sprintf("; write a list: %s: [%s]", lastKey(path), n.Value)
		}
		return nil, p.fail(compose.CodeInvalidComposeFile, n, "%s must be a list, not %s%s", path, aKind(n), hint)
	}
	out := make([]string, 0, len(n.Content))
	for i, c := range n.Content {
		s, err := p.nonEmpty(c, fmt.Sprintf("%s[%d]", path, i))
		if err != nil {
			return nil, err
		}
		out = append(out, s)
	}
	return out, nil
}

// opaque converts a subtree Compose must not interpret
// (config_override, engine.workers values).
func (p *parser) opaque(n *yaml.Node, path string) (map[string]any, error) {
	v, err := toValue(n)
	if err != nil {
		return nil, p.fail(compose.CodeInvalidComposeFile, n, "%s: %v", path, err)
	}
	m, _ := v.(map[string]any)
	return m, nil
}

func joinPath(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

func lastKey(path string) string {
	if i := strings.LastIndexByte(path, '.'); i >= 0 {
		path = path[i+1:]
	}
	if i := strings.IndexByte(path, '['); i >= 0 {
		path = path[:i]
	}
	return path
}

func orTop(path string) string {
	if path == "" {
		return "the top level"
	}
	return path
}

// resolvePath makes a path from the file absolute against the file's dir.
func (p *parser) resolvePath(s string) string {
	if filepath.IsAbs(s) {
		return filepath.Clean(s)
	}
	return filepath.Join(p.dir, s)
}
