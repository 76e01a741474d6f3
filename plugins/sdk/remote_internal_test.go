package sdk

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"

	"github.com/iii-sandbox/iii/contract"
	"github.com/iii-sandbox/iii/protocol"
)

func TestRemoteArgs(t *testing.T) {
	env := func(kv ...string) func(string) string {
		m := map[string]string{}
		for i := 0; i+1 < len(kv); i += 2 {
			m[kv[i]] = kv[i+1]
		}
		return func(k string) string { return m[k] }
	}
	for _, tc := range []struct {
		name   string
		args   []string
		env    func(string) string
		remote bool
		want   RemoteOptions
		err    string
	}{
		{name: "no flags: go-plugin or by hand", args: nil, env: env()},
		{name: "--version stays by hand", args: []string{"--version"}, env: env()},
		{name: "serve with flags", args: []string{"serve", "--engine", "wss://e:1", "--credential-file", "/c", "--host-name", "h-1", "--config-file", "/cfg.json"},
			env: env(), remote: true, want: RemoteOptions{EngineURL: "wss://e:1", CredentialFile: "/c", Namespace: "default", HostName: "h-1", ConfigFile: "/cfg.json"}},
		{name: "flags without serve", args: []string{"--engine=ws://127.0.0.1:9", "--credential-file=/c", "--namespace", "sbx"},
			env: env(), remote: true, want: RemoteOptions{EngineURL: "ws://127.0.0.1:9", CredentialFile: "/c", Namespace: "sbx"}},
		{name: "environment only", args: nil,
			env:    env(EnvEngineURL, "ws://e:1", EnvCredentialFile, "/c", EnvNamespace, "ns", EnvHostName, "h", EnvConfigFile, "/f"),
			remote: true, want: RemoteOptions{EngineURL: "ws://e:1", CredentialFile: "/c", Namespace: "ns", HostName: "h", ConfigFile: "/f"}},
		{name: "flags win over the environment", args: []string{"--engine", "ws://flag:1"}, env: env(EnvEngineURL, "ws://env:1", EnvCredentialFile, "/c"),
			remote: true, want: RemoteOptions{EngineURL: "ws://flag:1", CredentialFile: "/c", Namespace: "default"}},
		{name: "a fleet host", args: []string{"serve", "--engine", "ws://e:1", "--credential-file", "/c", "--host-name", "h2", "--fleet"},
			env: env(), remote: true, want: RemoteOptions{EngineURL: "ws://e:1", CredentialFile: "/c", Namespace: "default", HostName: "h2", Fleet: true}},
		{name: "a fleet host from the environment", args: nil, env: env(EnvEngineURL, "ws://e:1", EnvCredentialFile, "/c", EnvHostName, "h3", EnvFleet, "1"),
			remote: true, want: RemoteOptions{EngineURL: "ws://e:1", CredentialFile: "/c", Namespace: "default", HostName: "h3", Fleet: true}},
		{name: "a fleet host without a name", args: []string{"--engine", "ws://e:1", "--credential-file", "/c", "--fleet"}, env: env(), remote: true, err: "--fleet needs --host-name"},
		{name: "serve without engine", args: []string{"serve"}, env: env(), remote: true, err: "--engine"},
		{name: "no credential", args: []string{"--engine", "ws://e:1"}, env: env(), remote: true, err: "--credential-file"},
		{name: "http URL", args: []string{"--engine", "http://e:1", "--credential-file", "/c"}, env: env(), remote: true, err: "ws:// or wss://"},
		{name: "bad namespace", args: []string{"--engine", "ws://e:1", "--credential-file", "/c", "--namespace", "A B"}, env: env(), remote: true, err: "--namespace"},
		{name: "bad host name", args: []string{"--engine", "ws://e:1", "--credential-file", "/c", "--host-name", "Host_1"}, env: env(), remote: true, err: "--host-name"},
		{name: "unknown flag", args: []string{"serve", "--engine", "ws://e:1", "--credential-file", "/c", "--nope"}, env: env(), remote: true, err: "nope"},
		{name: "stray argument", args: []string{"serve", "--engine", "ws://e:1", "--credential-file", "/c", "extra"}, env: env(), remote: true, err: "extra"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, remote, err := remoteArgs(tc.args, tc.env)
			assert.Equal(t, remote, tc.remote)
			if tc.err != "" {
				assert.ErrorContains(t, err, tc.err)
				return
			}
			assert.NilError(t, err)
			if tc.remote {
				assert.DeepEqual(t, got, tc.want)
			}
		})
	}
}

func TestReadCredential(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		assert.NilError(t, os.WriteFile(p, []byte(content), 0o600))
		return p
	}
	tok, err := readCredential(write("ok", "  secret-token\n"))
	assert.NilError(t, err)
	assert.Equal(t, tok, "secret-token")
	_, err = readCredential(write("empty", "\n"))
	assert.ErrorContains(t, err, "is empty")
	_, err = readCredential(write("two", "a\nb\n"))
	assert.ErrorContains(t, err, "more than one line")
	_, err = readCredential(filepath.Join(dir, "missing"))
	assert.ErrorContains(t, err, "read the credential file")

	// A token every user can see, or others can change, is refused; its
	// own group may read it (a secret volume's fsGroup).
	for mode, refused := range map[os.FileMode]bool{0o604: true, 0o620: true, 0o602: true, 0o644: true, 0o640: false, 0o440: false, 0o400: false} {
		p := write(fmt.Sprintf("mode%o", mode), "tok\n")
		assert.NilError(t, os.Chmod(p, mode))
		tok, err := readCredential(p)
		if refused {
			assert.ErrorContains(t, err, fmt.Sprintf("has mode %04o", mode))
		} else {
			assert.NilError(t, err, "mode %04o", mode)
			assert.Equal(t, tok, "tok")
		}
	}
	// A link is read through (a Kubernetes secret volume's files are
	// links), and its target is what is checked.
	link := filepath.Join(dir, "link")
	assert.NilError(t, os.Symlink(write("target", "tok\n"), link))
	tok, err = readCredential(link)
	assert.NilError(t, err)
	assert.Equal(t, tok, "tok")
	open := write("open-target", "tok\n")
	assert.NilError(t, os.Chmod(open, 0o644))
	assert.NilError(t, os.Symlink(open, filepath.Join(dir, "open-link")))
	_, err = readCredential(filepath.Join(dir, "open-link"))
	assert.ErrorContains(t, err, "has mode 0644")
	big := write("big", strings.Repeat("x", maxCredentialFile+1))
	_, err = readCredential(big)
	assert.ErrorContains(t, err, "is larger than")
}

func TestReply(t *testing.T) {
	ctx := context.Background()
	out, err := reply(ctx, contract.OpList, &contract.ListResponse{}, nil)
	assert.NilError(t, err)
	assert.Check(t, json.Valid(out.(json.RawMessage)))

	_, err = reply(ctx, contract.OpExec, nil, contract.NewError(contract.S002, "no such sandbox"))
	var eb *protocol.ErrorBody
	assert.Assert(t, errors.As(err, &eb))
	assert.Equal(t, eb.Code, string(contract.S002))

	_, err = reply(ctx, contract.OpFsRead, nil, errors.New("disk on fire"))
	assert.Assert(t, errors.As(err, &eb))
	assert.Equal(t, eb.Code, string(contract.S216))
	_, err = reply(ctx, contract.OpExec, nil, errors.New("broken"))
	assert.Assert(t, errors.As(err, &eb))
	assert.Equal(t, eb.Code, string(contract.S300))

	cctx, cancel := context.WithCancel(ctx)
	cancel()
	_, err = reply(cctx, contract.OpExec, nil, errors.New("broken"))
	assert.Check(t, is.ErrorIs(err, context.Canceled))
}

func TestLoopback(t *testing.T) {
	for u, want := range map[string]bool{"ws://127.0.0.1:1": true, "ws://localhost:1": true, "ws://[::1]:1": true, "wss://engine.example:1": false, "ws://10.0.0.1:1": false} {
		assert.Equal(t, loopback(u), want, u)
	}
}
