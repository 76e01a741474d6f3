package loopback

import (
	"testing"

	"gotest.tools/v3/assert"
)

func TestHost(t *testing.T) {
	tests := []struct {
		host string
		want bool
	}{
		{"127.0.0.1", true}, {"127.0.0.1:3112", true}, {"localhost", true}, {"LOCALHOST:80", true},
		{"[::1]", true}, {"[::1]:49134", true}, {"::1", true},
		{"evil.example", false}, {"evil.example:3112", false}, {"127.0.0.2", false}, {"", false},
		{"localhost.evil.example", false}, {"0.0.0.0:3112", false},
	}
	for _, tc := range tests {
		assert.Equal(t, Host(tc.host), tc.want, tc.host)
	}
}

func TestAddr(t *testing.T) {
	tests := []struct {
		addr string
		want bool
	}{
		{"127.0.0.1:3112", true}, {"127.0.0.9:1", true}, {"[::1]:3112", true},
		{"0.0.0.0:3112", false}, {"192.168.1.2:80", false}, {"localhost:3112", false}, {"127.0.0.1", false},
	}
	for _, tc := range tests {
		assert.Equal(t, Addr(tc.addr), tc.want, tc.addr)
	}
}
