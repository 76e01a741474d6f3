package composefile

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"gopkg.in/yaml.v3"
	"gotest.tools/v3/assert"

	"github.com/iii-sandbox/iii/compose"
	"github.com/iii-sandbox/iii/host/config"
)

func TestInterpolate(t *testing.T) {
	env := map[string]string{"A": "alpha", "EMPTY": "", "N_1": "one", "DOLLAR": "$B"}
	lookup := func(k string) (string, bool) { v, ok := env[k]; return v, ok }
	tests := []struct {
		in, want, code string
	}{
		{in: "", want: ""},
		{in: "plain text", want: "plain text"},
		{in: "${A}", want: "alpha"},
		{in: "x-${A}-y", want: "x-alpha-y"},
		{in: "${A}${N_1}", want: "alphaone"},
		{in: "${_x:-u}", want: "u"},
		{in: "${UNSET:-default text}", want: "default text"},
		{in: "${UNSET:-}", want: ""},
		{in: "${EMPTY:-unused}", want: ""}, // set-but-empty wins over the default
		{in: "${UNSET:-a:-b}", want: "a:-b"},
		{in: "${UNSET:-{x}", want: "{x"},
		{in: "$A and $PWD", want: "$A and $PWD"},
		{in: "$${A}", want: "${A}"},
		{in: "$$${A}", want: "$${A}"}, // the escape is found wherever it starts
		{in: "$$", want: "$$"},
		{in: "cost: $5", want: "cost: $5"},
		{in: "trailing $", want: "trailing $"},
		{in: "${DOLLAR}", want: "$B"}, // values are not expanded again
		{in: "a}b", want: "a}b"},
		{in: "${UNSET}", code: compose.CodeUndefinedVariable},
		{in: "ok ${A} then ${MISSING}", code: compose.CodeUndefinedVariable},
		{in: "${A", code: compose.CodeUnterminatedReference},
		{in: "${UNSET:-text", code: compose.CodeUnterminatedReference},
		{in: "${}", code: compose.CodeInvalidReference},
		{in: "${1A}", code: compose.CodeInvalidReference},
		{in: "${A-B}", code: compose.CodeInvalidReference},
		{in: "${A:default}", code: compose.CodeInvalidReference},
		{in: "${ A }", code: compose.CodeInvalidReference},
		{in: "${A:-${B}}", code: compose.CodeInvalidReference},
		{in: "${é}", code: compose.CodeInvalidReference},
	}
	for _, tc := range tests {
		t.Run(tc.in, func(t *testing.T) {
			got, err := Interpolate(tc.in, lookup)
			if tc.code != "" {
				assert.Equal(t, compose.CodeOf(err), tc.code, "got %q", got)
				return
			}
			assert.NilError(t, err)
			assert.Equal(t, got, tc.want)
		})
	}
	t.Run("nil lookup means nothing is set", func(t *testing.T) {
		got, err := Interpolate("${X:-d}", nil)
		assert.NilError(t, err)
		assert.Equal(t, got, "d")
		_, err = Interpolate("${X}", nil)
		assert.Equal(t, compose.CodeOf(err), compose.CodeUndefinedVariable)
	})
}

func TestParseDuration(t *testing.T) {
	tests := []struct {
		in   string
		want time.Duration
		ok   bool
	}{
		{"500ms", 500 * time.Millisecond, true},
		{"0ms", 0, true},
		{"30s", 30 * time.Second, true},
		{"2m", 2 * time.Minute, true},
		{"1h", time.Hour, true},
		{"007s", 7 * time.Second, true},
		{"30", 0, false},
		{"", 0, false},
		{"s", 0, false},
		{"ms", 0, false},
		{"1.5s", 0, false},
		{"-1s", 0, false},
		{"+1s", 0, false},
		{"1m30s", 0, false},
		{"10sec", 0, false},
		{"10 s", 0, false},
		{" 10s", 0, false},
		{"1d", 0, false},
		{"10us", 0, false},
		{"9223372036854775807ms", 0, false},
		{"2562047h", 2562047 * time.Hour, true},
		{"2562048h", 0, false},
		{"99999999999999999999s", 0, false},
	}
	for _, tc := range tests {
		t.Run(tc.in, func(t *testing.T) {
			got, err := ParseDuration(tc.in)
			if !tc.ok {
				assert.Equal(t, compose.CodeOf(err), compose.CodeInvalidDuration)
				return
			}
			assert.NilError(t, err)
			assert.Equal(t, got, tc.want)
		})
	}
}

// graphFile builds a File from "key:dep,dep" specs in file order.
func graphFile(t *testing.T, specs ...string) *File {
	t.Helper()
	var b strings.Builder
	b.WriteString("containers:\n")
	for _, s := range specs {
		key, deps, _ := strings.Cut(s, ":")
		fmt.Fprintf(&b, "  %s:\n    worker: path://./%s\n", key, key)
		if deps != "" {
			fmt.Fprintf(&b, "    start_after: [%s]\n", deps)
		}
	}
	f, err := Parse([]byte(b.String()), filepath.Join(t.TempDir(), FileName), nil)
	assert.NilError(t, err)
	return f
}

func TestStartOrder(t *testing.T) {
	tests := []struct {
		name    string
		specs   []string
		targets []string
		want    []string
		waves   [][]string
	}{
		{name: "no edges keeps file order", specs: []string{"c", "a", "b"},
			want: []string{"c", "a", "b"}, waves: [][]string{{"c", "a", "b"}}},
		{name: "dependency declared later comes first", specs: []string{"web:api", "api:db", "db"},
			want: []string{"db", "api", "web"}, waves: [][]string{{"db"}, {"api"}, {"web"}}},
		{name: "file order breaks ties", specs: []string{"web:api,auth", "api:db", "auth", "db", "metrics"},
			want: []string{"auth", "db", "api", "web", "metrics"}, waves: [][]string{{"auth", "db", "metrics"}, {"api"}, {"web"}}},
		{name: "diamond", specs: []string{"top:l,r", "l:base", "r:base", "base"},
			want: []string{"base", "l", "r", "top"}, waves: [][]string{{"base"}, {"l", "r"}, {"top"}}},
		{name: "target pulls in transitive deps only", specs: []string{"web:api", "api:db", "db", "other"},
			targets: []string{"api"}, want: []string{"db", "api"}, waves: [][]string{{"db"}, {"api"}}},
		{name: "leaf target", specs: []string{"web:api", "api:db", "db"},
			targets: []string{"db"}, want: []string{"db"}, waves: [][]string{{"db"}}},
		{name: "several targets", specs: []string{"a:x", "b:y", "x", "y", "z"},
			targets: []string{"b", "a"}, want: []string{"x", "a", "y", "b"}, waves: [][]string{{"x", "y"}, {"a", "b"}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := graphFile(t, tc.specs...)
			got, err := f.StartOrder(tc.targets...)
			assert.NilError(t, err)
			assert.DeepEqual(t, got, tc.want)
			waves, err := f.StartWaves(tc.targets...)
			assert.NilError(t, err)
			assert.DeepEqual(t, waves, tc.waves)
		})
	}
	t.Run("unknown target", func(t *testing.T) {
		f := graphFile(t, "a", "b")
		_, err := f.StartOrder("nope")
		assert.Equal(t, compose.CodeOf(err), compose.CodeUnknownContainer)
		_, err = f.StartWaves("nope")
		assert.Equal(t, compose.CodeOf(err), compose.CodeUnknownContainer)
	})
}

func TestDependents(t *testing.T) {
	f := graphFile(t, "web:api,auth", "api:db", "auth", "db", "metrics", "report:web")
	tests := []struct {
		key  string
		want []string
	}{
		{"db", []string{"api", "web", "report"}},
		{"auth", []string{"web", "report"}},
		{"web", []string{"report"}},
		{"report", []string{}},
		{"metrics", []string{}},
		{"nope", nil},
	}
	for _, tc := range tests {
		t.Run(tc.key, func(t *testing.T) {
			assert.DeepEqual(t, f.Dependents(tc.key), tc.want)
		})
	}
}

func TestGraphErrors(t *testing.T) {
	tests := []struct {
		name  string
		specs []string
		code  string
		path  string
	}{
		{"self", []string{"a:a"}, compose.CodeSelfDependency, ""},
		{"unknown", []string{"a:b"}, compose.CodeUnknownDependency, ""},
		{"two-cycle", []string{"a:b", "b:a"}, compose.CodeDependencyCycle, "a → b → a"},
		{"long cycle behind a tail", []string{"t:a", "a:b", "b:c", "c:a"}, compose.CodeDependencyCycle, "a → b → c → a"},
		{"cycle among others", []string{"ok", "x:ok,y", "y:z", "z:x"}, compose.CodeDependencyCycle, "x → y → z → x"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var b strings.Builder
			b.WriteString("containers:\n")
			for _, s := range tc.specs {
				key, deps, _ := strings.Cut(s, ":")
				fmt.Fprintf(&b, "  %s:\n    worker: path://./%s\n", key, key)
				if deps != "" {
					fmt.Fprintf(&b, "    start_after: [%s]\n", deps)
				}
			}
			_, err := Parse([]byte(b.String()), FileName, nil)
			assert.Equal(t, compose.CodeOf(err), tc.code)
			if tc.path != "" {
				assert.Assert(t, strings.Contains(err.Error(), tc.path), err.Error())
			}
		})
	}
}

func TestParseEnvFile(t *testing.T) {
	tests := []struct {
		name, in string
		want     map[string]string
		code     string
	}{
		{name: "empty", in: "", want: map[string]string{}},
		{name: "basic", in: "A=1\nB=two\n", want: map[string]string{"A": "1", "B": "two"}},
		{name: "comments and blanks", in: "# c\n\n  # indented\nA=1\n", want: map[string]string{"A": "1"}},
		{name: "export", in: "export A=1\nexport\tB=2\n", want: map[string]string{"A": "1", "B": "2"}},
		{name: "a variable named export", in: "export=1\n", want: map[string]string{"export": "1"}},
		{name: "spaces around", in: "  A = spaced value  \n", want: map[string]string{"A": "spaced value"}},
		{name: "inline comment", in: "A=value # note\nB=a#b\n", want: map[string]string{"A": "value", "B": "a#b"}},
		{name: "single quotes literal", in: `A='$x \n # kept'` + "\n", want: map[string]string{"A": `$x \n # kept`}},
		{name: "double quotes escapes", in: `A="line\nnext \"q\" \\ \$ \x"` + "\n", want: map[string]string{"A": "line\nnext \"q\" \\ $ \\x"}},
		{name: "quoted then comment", in: `A="v" # c` + "\n", want: map[string]string{"A": "v"}},
		{name: "empty value", in: "A=\nB=''\nC=\"\"\n", want: map[string]string{"A": "", "B": "", "C": ""}},
		{name: "equals in value", in: "A=b=c\n", want: map[string]string{"A": "b=c"}},
		{name: "later wins", in: "A=1\nA=2\n", want: map[string]string{"A": "2"}},
		{name: "crlf and bom", in: "\uFEFFA=1\r\nB=2\r\n", want: map[string]string{"A": "1", "B": "2"}},
		{name: "no interpolation", in: "A=${HOME}\n", want: map[string]string{"A": "${HOME}"}},
		{name: "no equals", in: "A\n", code: compose.CodeInvalidComposeFile},
		{name: "bad name", in: "1A=x\n", code: compose.CodeInvalidComposeFile},
		{name: "bad name dash", in: "A-B=x\n", code: compose.CodeInvalidComposeFile},
		{name: "unclosed double", in: "A=\"x\n", code: compose.CodeInvalidComposeFile},
		{name: "unclosed single", in: "A='x\n", code: compose.CodeInvalidComposeFile},
		{name: "junk after quote", in: "A=\"x\"y\n", code: compose.CodeInvalidComposeFile},
		{name: "nul", in: "A=\"a\x00b\"\n", code: compose.CodeInvalidComposeFile},
		{name: "reserved", in: "III_WORKER_NAME=x\n", code: compose.CodeReservedEnvOverride},
		{name: "reserved exported", in: "export III_CONFIG=/x\n", code: compose.CodeReservedEnvOverride},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseEnvFile([]byte(tc.in), "test.env")
			if tc.code != "" {
				assert.Equal(t, compose.CodeOf(err), tc.code, "got %v", got)
				assert.Assert(t, strings.HasPrefix(err.(*compose.Error).Message, "test.env:1: "), err.Error())
				return
			}
			assert.NilError(t, err)
			assert.DeepEqual(t, got, tc.want)
		})
	}
}

func TestReadEnvFile(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "app.env")
	assert.NilError(t, os.WriteFile(p, []byte("A=1\n"), 0o600))
	got, err := ReadEnvFile(p)
	assert.NilError(t, err)
	assert.DeepEqual(t, got, map[string]string{"A": "1"})

	_, err = ReadEnvFile(filepath.Join(dir, "missing.env"))
	assert.Equal(t, compose.CodeOf(err), compose.CodeMissingEnvFile)
	_, err = ReadEnvFile(dir)
	assert.Equal(t, compose.CodeOf(err), compose.CodeMissingEnvFile)

	big := filepath.Join(dir, "big.env")
	assert.NilError(t, os.WriteFile(big, []byte(strings.Repeat("A=1\n", maxEnvFileSize/4+1)), 0o600))
	_, err = ReadEnvFile(big)
	assert.Equal(t, compose.CodeOf(err), compose.CodeInvalidComposeFile)
}

func TestEngineForms(t *testing.T) {
	parse := func(t *testing.T, src string) *File {
		t.Helper()
		f, err := Parse([]byte(src), FileName, nil)
		assert.NilError(t, err)
		return f
	}
	t.Run("absent", func(t *testing.T) {
		f := parse(t, "containers: {a: {worker: path://a}}\n")
		assert.Assert(t, f.Engine == nil)
	})
	t.Run("nothing under it", func(t *testing.T) {
		f := parse(t, "engine:\n")
		assert.DeepEqual(t, f.Engine, &Engine{Empty: true, URL: DefaultEngineURL})
		assert.Equal(t, len(f.Containers), 0)
	})
	t.Run("explicit null", func(t *testing.T) {
		f := parse(t, "engine: ~\n")
		assert.Assert(t, f.Engine.Empty)
	})
	t.Run("empty mapping is a managed engine with defaults", func(t *testing.T) {
		f := parse(t, "engine: {}\n")
		assert.Assert(t, !f.Engine.Empty)
		assert.Equal(t, f.Engine.URL, DefaultEngineURL)
		assert.Equal(t, f.Engine.URLPort(), 49134)
		assert.Assert(t, f.Engine.Sandbox == nil)
		assert.Assert(t, f.Engine.RegistrationNamespaceGraceMS == nil)
	})
}

func TestSetNamespace(t *testing.T) {
	f, err := Parse([]byte("namespace: shop\nengine:\n  sandbox: {}\n"), FileName, nil)
	assert.NilError(t, err)
	assert.Equal(t, f.Engine.Sandbox.Namespace, "shop")
	f.SetNamespace("dev")
	assert.Equal(t, f.Namespace, "dev")
	assert.Equal(t, f.Engine.Sandbox.Namespace, "dev")

	f, err = Parse([]byte("engine:\n  sandbox: {namespace: adapters}\n"), FileName, nil)
	assert.NilError(t, err)
	assert.Equal(t, f.Namespace, DefaultNamespace)
	assert.Assert(t, !f.NamespaceSet)
	f.SetNamespace("dev")
	assert.Equal(t, f.Engine.Sandbox.Namespace, "adapters")

	assert.NilError(t, ValidNamespace("a-b_0"))
	assert.Equal(t, compose.CodeOf(ValidNamespace("A")), compose.CodeInvalidNamespace)
	assert.Equal(t, compose.CodeOf(ValidNamespace("")), compose.CodeInvalidNamespace)
}

// TestCanonicalPath: the project is its canonical file, so a symlinked
// directory resolves to the real one and relative paths follow it.
func TestCanonicalPath(t *testing.T) {
	real := t.TempDir()
	link := filepath.Join(t.TempDir(), "link")
	assert.NilError(t, os.Symlink(real, link))
	realDir, err := filepath.EvalSymlinks(real)
	assert.NilError(t, err)
	file := filepath.Join(link, FileName)
	assert.NilError(t, os.WriteFile(file, []byte("containers: {api: {worker: path://./api, working_dir: run}}\n"), 0o600))
	f, err := Load(file, nil)
	assert.NilError(t, err)
	assert.Equal(t, f.Path, filepath.Join(realDir, FileName))
	assert.Equal(t, f.Dir, realDir)
	assert.Equal(t, f.Containers["api"].Source.Path, filepath.Join(realDir, "api"))
	assert.Equal(t, f.Containers["api"].WorkingDir, filepath.Join(realDir, "run"))
}

// TestSandboxMovedReplacementParses: the YAML that SANDBOX_CONFIG_MOVED
// prints is a working compose file whose config_override holds exactly
// the old settings, whatever style they were written in.
func TestSandboxMovedReplacementParses(t *testing.T) {
	olds := []string{
		"{ image_allowlist: [python, node] }",
		"{ image_allowlist: [python, myimg], custom_images: { myimg: 'ghcr.io/acme/img:1.0' }, default_cpus: 2, auto_install: false }",
		"\n      per_image_caps:\n        python: { max_cpus: 2, max_memory_mb: 1024 }\n      note: '0123'\n      flag: 'true'\n      empty: {}\n      none: []\n      nested: [[1, 2], {k: v, k2: [x]}]\n      text: \"line one\\nline two\"\n      long: " + strings.Repeat("word ", 40),
	}
	for i, old := range olds {
		t.Run(fmt.Sprint(i), func(t *testing.T) {
			src := "engine:\n  workers:\n    iii-sandbox: " + old + "\n"
			_, err := Parse([]byte(src), FileName, nil)
			assert.Equal(t, compose.CodeOf(err), compose.CodeSandboxConfigMoved)
			msg := err.(*compose.Error).Message
			start := strings.Index(msg, "containers:\n")
			end := strings.Index(msg, "\n\nengine.sandbox")
			assert.Assert(t, start > 0 && end > start, msg)
			replacement := msg[start : end+1]

			f, err := Parse([]byte(replacement), FileName, nil)
			assert.NilError(t, err, replacement)
			c := f.Containers[AdapterPackage]
			assert.Equal(t, c.Worker, "package://"+AdapterPackage)
			assert.Equal(t, c.Version, AdapterSelector)

			var oldNode yaml.Node
			assert.NilError(t, yaml.Unmarshal([]byte("v: "+old), &oldNode))
			want, err := toValue(oldNode.Content[0].Content[1])
			assert.NilError(t, err)
			assert.DeepEqual(t, c.ConfigOverride, want)
		})
	}
}

// TestEngineWorkerNodeKeepsEngineTyping: encoding EngineWorker.Node into a
// config.yaml entry gives the engine's parser the same values it would
// read from the user's own text: a plain ${PORT:n} is a number, a quoted
// one stays a string.
func TestEngineWorkerNodeKeepsEngineTyping(t *testing.T) {
	f, err := Parse([]byte("engine:\n  url: ws://127.0.0.1:49300\n  workers:\n    iii-worker-manager: { host: 127.0.0.1, port: ${WM_PORT:49300} }\n"), FileName, nil)
	assert.NilError(t, err)
	w := f.Engine.Workers[0]
	assert.Equal(t, w.Type(), EngineWorkerManager)
	assert.Equal(t, w.Config["port"], "${WM_PORT:49300}")

	entry := &yaml.Node{Kind: yaml.MappingNode, Content: []*yaml.Node{
		{Kind: yaml.ScalarNode, Value: "name"}, {Kind: yaml.ScalarNode, Value: w.Name},
		{Kind: yaml.ScalarNode, Value: "config"}, w.EngineNode(),
	}}
	doc := &yaml.Node{Kind: yaml.MappingNode, Content: []*yaml.Node{
		{Kind: yaml.ScalarNode, Value: "workers"}, {Kind: yaml.SequenceNode, Content: []*yaml.Node{entry}},
	}}
	out, err := yaml.Marshal(doc)
	assert.NilError(t, err)
	for _, env := range []map[string]string{{}, {"WM_PORT": "49301"}} {
		cfg, err := config.Parse(out, config.ParseOptions{Name: "engine-config.yaml", Dir: t.TempDir(),
			Lookup: func(k string) (string, bool) { v, ok := env[k]; return v, ok }})
		assert.NilError(t, err, string(out))
		want := 49300
		if env["WM_PORT"] != "" {
			want = 49301
		}
		assert.Equal(t, cfg.Listeners[0].Port, want, string(out))
	}
}

func TestIsAdapter(t *testing.T) {
	f, err := Parse([]byte("containers:\n  sandbox-libkrun: {worker: package://sandbox-libkrun, version: '^0.3'}\n  x: {worker: path://sandbox-libkrun}\n"), FileName, nil)
	assert.NilError(t, err)
	assert.Assert(t, f.Containers["sandbox-libkrun"].IsAdapter(DefaultSandboxAdapter))
	assert.Assert(t, !f.Containers["x"].IsAdapter(DefaultSandboxAdapter))
}

func TestReservedEnv(t *testing.T) {
	r := ReservedEnv()
	assert.Equal(t, len(r), 9)
	r[0] = "changed"
	assert.Equal(t, ReservedEnv()[0], "III_URL")
	for _, n := range ReservedEnv() {
		assert.Assert(t, IsReservedEnv(n))
	}
	assert.Assert(t, !IsReservedEnv("III_OTHER"))
}

// TestReferencesInYAMLStyles: a reference reads the same in every YAML
// style, and YAML's own quoting is decoded before Compose expands.
func TestReferencesInYAMLStyles(t *testing.T) {
	env := func(k string) (string, bool) {
		v, ok := map[string]string{"A": "alpha", "DEP": "db"}[k]
		return v, ok
	}
	tests := []struct {
		name, yaml, want string
	}{
		{"block plain", "V: ${A}", "alpha"},
		{"flow plain", "{ V: ${A} }", "alpha"},
		{"flow plain twice", "{ V: ${A}-${A}, W: x }", "alpha-alpha"},
		{"double quoted", `V: "${A}"`, "alpha"},
		{"single quoted", `V: '${A}'`, "alpha"},
		{"escaped quote in default", `V: "${X:-say \"hi\"}"`, `say "hi"`},
		{"doubled single quote in default", `V: '${X:-it''s}'`, "it's"},
		{"flow default with spaces", "{ V: ${X:-a b c} }", "a b c"},
		{"literal escape in flow", "{ V: $${A} }", "${A}"},
		{"comment mentions a reference", "V: x # ${UNSET}", "x"},
		{"literal block", "V: |\n  ${A}\n  $HOME", "alpha\n$HOME\n"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			src := "containers:\n  api:\n    worker: path://./api\n    environment:\n" + indent(tc.yaml, "      ") + "\n"
			if strings.HasPrefix(tc.yaml, "{") {
				src = "containers:\n  api:\n    worker: path://./api\n    environment: " + tc.yaml + "\n"
			}
			f, err := Parse([]byte(src), FileName, env)
			assert.NilError(t, err, src)
			assert.Equal(t, f.Containers["api"].Environment["V"], tc.want)
		})
	}
	t.Run("flow list", func(t *testing.T) {
		f, err := Parse([]byte("containers:\n  db: {worker: path://db}\n  api: {worker: path://api, start_after: [${DEP}]}\n"), FileName, env)
		assert.NilError(t, err)
		assert.DeepEqual(t, f.Containers["api"].StartAfter, []string{"db"})
	})
	t.Run("a key is never expanded", func(t *testing.T) {
		f, err := Parse([]byte("containers:\n  api:\n    worker: path://api\n    config_override: { ${A}: ${A} }\n"), FileName, env)
		assert.NilError(t, err)
		assert.DeepEqual(t, f.Containers["api"].ConfigOverride, map[string]any{"${A}": "${A}"})
	})
}

func indent(s, prefix string) string {
	return prefix + strings.ReplaceAll(s, "\n", "\n"+prefix)
}

func TestEngineHelpers(t *testing.T) {
	assert.Equal(t, (&Engine{URL: "ws://127.0.0.1:5000"}).URLPort(), 5000)
	assert.Equal(t, (&Engine{URL: "::bad"}).URLPort(), 0)
	n := EngineWorker{Name: "iii-stream#b"}.EngineNode()
	assert.Equal(t, n.Kind, yaml.MappingNode)
	assert.Equal(t, EngineWorker{Name: "iii-stream#b"}.Type(), "iii-stream")
}

// TestSandboxMovedMatchesUpgradeGuide: for the guide's own example the
// printed replacement is, byte for byte, the block the 0.26 upgrade guide
// shows (testdata/valid/seed_sandbox_moved.yaml).
func TestSandboxMovedMatchesUpgradeGuide(t *testing.T) {
	guide, err := os.ReadFile("testdata/valid/seed_sandbox_moved.yaml")
	assert.NilError(t, err)
	for _, old := range []string{"{ image_allowlist: [python, node] }", "\n      image_allowlist:\n        - python\n        - node"} {
		_, err = Parse([]byte("engine:\n  workers:\n    iii-sandbox: "+old+"\n"), FileName, nil)
		assert.Equal(t, compose.CodeOf(err), compose.CodeSandboxConfigMoved)
		assert.Assert(t, strings.Contains(err.Error(), "\n\n"+string(guide)+"\n"), err.Error())
		assert.Assert(t, strings.Contains(err.Error(), "write `workers: {}`"), err.Error())
	}
}
