package config

import (
	"errors"
	"testing"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"

	"github.com/iii-sandbox/iii/host/httpfn"
)

func TestParseHTTPFunctions(t *testing.T) {
	defaults := HTTPFunctions{Name: "iii-http-functions", BlockPrivateIPs: true, RequireHTTPS: true}
	tests := []struct {
		name string
		src  string
		env  map[string]string
		want HTTPFunctions
		sec  httpfn.Security
	}{
		{name: "bare", src: "workers:\n  - name: iii-http-functions\n", want: defaults, sec: httpfn.DefaultSecurity()},
		{name: "empty config", src: "workers:\n  - name: iii-http-functions\n    config: {}\n", want: defaults, sec: httpfn.DefaultSecurity()},
		{name: "empty security", src: "workers:\n  - name: iii-http-functions\n    config: { security: {} }\n", want: defaults, sec: httpfn.DefaultSecurity()},
		{name: "empty allowlist is every host", src: "workers:\n  - name: iii-http-functions\n    config: { security: { url_allowlist: [] } }\n", want: defaults, sec: httpfn.DefaultSecurity()},
		{
			name: "every key",
			src:  "workers:\n  - name: iii-http-functions#dev\n    config:\n      security:\n        url_allowlist: [api.example.com, '*.example.org', '127.0.0.1']\n        block_private_ips: false\n        require_https: false\n",
			want: HTTPFunctions{Name: "iii-http-functions#dev", URLAllowlist: "api.example.com\n*.example.org\n127.0.0.1"},
			sec:  httpfn.Security{URLAllowlist: []string{"api.example.com", "*.example.org", "127.0.0.1"}},
		},
		{
			name: "from the environment",
			src:  "workers:\n  - name: iii-http-functions\n    config: { security: { require_https: ${HTTPS:true}, url_allowlist: ['${HOST}'] } }\n",
			env:  map[string]string{"HTTPS": "false", "HOST": "localhost"},
			want: HTTPFunctions{Name: "iii-http-functions", URLAllowlist: "localhost", BlockPrivateIPs: true},
			sec:  httpfn.Security{URLAllowlist: []string{"localhost"}, BlockPrivateIPs: true},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := parse(t, tc.src, tc.env)
			assert.NilError(t, err)
			assert.Assert(t, cfg.HTTPFunctions != nil)
			assert.DeepEqual(t, *cfg.HTTPFunctions, tc.want)
			assert.DeepEqual(t, cfg.HTTPFunctions.Security(), tc.sec)
		})
	}

	cfg, err := parse(t, "workers: []\n", nil)
	assert.NilError(t, err)
	assert.Assert(t, cfg.HTTPFunctions == nil, "absent: the worker does not run")
}

func TestParseHTTPFunctionsErrors(t *testing.T) {
	for _, tc := range []struct {
		name, src, msg string
	}{
		{"unknown config key", "workers:\n  - name: iii-http-functions\n    config: { fake_key: true }\n", `unknown key "fake_key" in iii-http-functions.config; allowed keys: security`},
		{"unknown security key", "workers:\n  - name: iii-http-functions\n    config: { security: { allowlist: ['*'] } }\n", "allowed keys: block_private_ips, require_https, url_allowlist"},
		{"config a list", "workers:\n  - name: iii-http-functions\n    config: [1]\n", "must be a mapping"},
		{"security a string", "workers:\n  - name: iii-http-functions\n    config: { security: strict }\n", "must be a mapping"},
		{"allowlist a string", "workers:\n  - name: iii-http-functions\n    config: { security: { url_allowlist: '*' } }\n", "must be a list of host patterns"},
		{"allowlist of lists", "workers:\n  - name: iii-http-functions\n    config: { security: { url_allowlist: [[a]] } }\n", "must be a string"},
		{"blank pattern", "workers:\n  - name: iii-http-functions\n    config: { security: { url_allowlist: [' '] } }\n", "blank"},
		{"bad pattern", "workers:\n  - name: iii-http-functions\n    config: { security: { url_allowlist: ['[a-'] } }\n", "url_allowlist[0]"},
		{"bool as string", "workers:\n  - name: iii-http-functions\n    config: { security: { require_https: 'false' } }\n", "must be true or false"},
		{"bool as yes", "workers:\n  - name: iii-http-functions\n    config: { security: { block_private_ips: no } }\n", "must be true or false"},
		{"bool as number", "workers:\n  - name: iii-http-functions\n    config: { security: { block_private_ips: 0 } }\n", "must be true or false"},
		{"second instance", "workers:\n  - name: iii-http-functions\n  - name: iii-http-functions#b\n", "a second iii-http-functions worker"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := parse(t, tc.src, nil)
			assert.Assert(t, cfg == nil)
			var ce *Error
			assert.Assert(t, errors.As(err, &ce), "got %v", err)
			assert.Equal(t, ce.Code, CodeInvalidConfig)
			assert.Check(t, is.Contains(ce.Message, tc.msg))
			assert.Check(t, is.Contains(ce.Message, "config.yaml:"), "the message names the line")
		})
	}
}
