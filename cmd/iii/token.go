package main

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/iii-sandbox/iii/client"
	"github.com/iii-sandbox/iii/compose/composefile"
	"github.com/iii-sandbox/iii/compose/state"
	"github.com/iii-sandbox/iii/internal/enginetoken"
	"github.com/iii-sandbox/iii/protocol"
)

// codeAuthError is the engine's refusal of a bearer token it does not know.
const codeAuthError = "AUTH_ERROR"

// tokenChoice is what a CLI connection presents to the engine
// (docs/security.md, "The engine token").
type tokenChoice struct {
	// explicit is --token, else $III_ENGINE_TOKEN: sent as given, and a
	// refusal is final.
	explicit string
	// found are tokens found on disk, tried in order while the engine
	// refuses them (AUTH_ERROR), before connecting without one: the
	// user's ~/.iii/engine-token, then the project tokens of the compose
	// file in the working directory (an engine Compose manages has its
	// project's token).
	found []string
}

// chooseToken gathers the tokens for the engine at engineURL. ns, when not
// empty, is the namespace the command addresses: its project token comes
// first. A token file that is unsafe (others may read it) is reported on
// warn and skipped.
func chooseToken(e env, flagToken, engineURL, ns string, warn func(string)) tokenChoice {
	if flagToken != "" {
		return tokenChoice{explicit: flagToken}
	}
	if v := strings.TrimSpace(e.getenv(enginetoken.Env)); v != "" {
		return tokenChoice{explicit: v}
	}
	var tc tokenChoice
	add := func(tok string) {
		if tok != "" && !slices.Contains(tc.found, tok) {
			tc.found = append(tc.found, tok)
		}
	}
	userToken := func() {
		tok, err := client.TokenFromFile(engineURL)
		if err != nil {
			warn(err.Error())
		}
		add(tok)
	}
	hostport, ok := engineHostPort(engineURL)
	if !ok || !enginetoken.MayReceive(hostport) {
		userToken()
		return tc
	}
	files, manages := projectTokenFiles(e, ns, hostport)
	if !manages {
		userToken()
	}
	for _, p := range files {
		tok, err := enginetoken.Read(p)
		if err != nil {
			if !errors.Is(err, fs.ErrNotExist) && !errors.Is(err, fs.ErrPermission) {
				warn(err.Error())
			}
			continue
		}
		add(tok)
	}
	if manages {
		userToken()
	}
	return tc
}

// engineHostPort is the host:port of a ws:// address.
func engineHostPort(raw string) (string, bool) {
	u, err := url.Parse(raw)
	if err != nil || u.Host == "" || u.Port() == "" {
		return "", false
	}
	return u.Host, true
}

// projectTokenFiles lists the project tokens of ./worker-compose.yaml,
// one per namespace Compose keeps state for (<dir>/.iii/compose/<ns>/, or
// under $III_COMPOSE_STATE_DIR); ns's first. manages reports that the
// file's engine: section starts the engine on hostport's port: its
// project token is then the likelier one.
func projectTokenFiles(e env, ns, hostport string) (files []string, manages bool) {
	path, err := filepath.Abs(composefile.FileName)
	if err != nil {
		return nil, false
	}
	if _, err := os.Stat(path); err != nil {
		return nil, false
	}
	if real, err := filepath.EvalSymlinks(path); err == nil {
		path = real
	}
	lookup := func(k string) (string, bool) {
		v := e.getenv(k)
		return v, v != ""
	}
	if f, err := composefile.Load(path, lookup); err == nil && f.Engine != nil && !f.Engine.Empty {
		engineURL := f.Engine.URL
		if engineURL == "" {
			engineURL = composefile.DefaultEngineURL
		}
		if hp, ok := engineHostPort(engineURL); ok {
			_, p1, _ := net.SplitHostPort(hp)
			_, p2, _ := net.SplitHostPort(hostport)
			manages = p1 == p2
		}
	}
	base := filepath.Dir(state.DirFor(path, "x", e.getenv))
	files, _ = filepath.Glob(filepath.Join(base, "*", state.ProjectTokenFile))
	slices.Sort(files)
	if ns != "" {
		first := filepath.Join(base, ns, state.ProjectTokenFile)
		if i := slices.Index(files, first); i > 0 {
			files = append([]string{first}, slices.Delete(files, i, i+1)...)
		}
	}
	return files, manages
}

// dialWithToken connects like client.Dial, presenting the chosen token. A
// found token the engine refuses (it has another: engine_token in its
// config.yaml, a project's) is dropped for the next, and at last the
// connection is made without one: functions that are not privileged still
// answer. It reports whether the connection presents a token.
func dialWithToken(ctx context.Context, engineURL string, opts client.Options, tc tokenChoice) (*client.Client, bool, error) {
	if tc.explicit != "" {
		opts.Token = tc.explicit
		c, err := client.Dial(ctx, engineURL, opts)
		return c, true, err
	}
	for _, tok := range tc.found {
		opts.Token = tok
		c, err := client.Dial(ctx, engineURL, opts)
		if client.CodeOf(err) != codeAuthError {
			return c, true, err
		}
	}
	opts.Token = ""
	c, err := client.Dial(ctx, engineURL, opts)
	return c, false, err
}

// tokenConnectError words a failed connection; a refused explicit token
// says where it came from.
func tokenConnectError(engineURL string, err error, tc tokenChoice) error {
	xe := connectError(engineURL, err)
	var ex *exitError
	if tc.explicit != "" && client.CodeOf(err) == codeAuthError && errors.As(xe, &ex) {
		ex.msg += fmt.Sprintf(" (the token given with --token or %s is not this engine's)", enginetoken.Env)
	}
	return xe
}

// unauthorizedHint is added to an UNAUTHORIZED error of a connection that
// presented no token.
func unauthorizedHint(err error, withToken bool) string {
	var eb *protocol.ErrorBody
	if withToken || !errors.As(err, &eb) || eb.Code != "UNAUTHORIZED" {
		return ""
	}
	return "this call presented no engine token: the engine's token is in ~/.iii/engine-token of the user who runs it " +
		"(an engine Compose manages uses <project>/.iii/compose/<namespace>/project-token); run iii call as that user, " +
		"from the project's directory, or pass --token (docs/security.md)"
}
