package client

import (
	"errors"
	"io/fs"
	"net/http"
	"os"
	"strings"

	"github.com/iii-sandbox/iii/internal/enginetoken"
)

// EnvEngineToken is the environment variable that gives the engine token
// explicitly; DiscoverToken reads it first.
const EnvEngineToken = enginetoken.Env

// workerHeader is the header of the worker socket's upgrade: Options.Header
// and, with a token, its Authorization.
func (c *Client) workerHeader() http.Header {
	tok := c.currentToken()
	if tok == "" {
		return c.opts.Header
	}
	h := c.opts.Header.Clone()
	if h == nil {
		h = http.Header{}
	}
	h.Set("Authorization", "Bearer "+tok)
	return h
}

// currentToken is the token the next connection presents.
func (c *Client) currentToken() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.bearer
}

// refreshToken asks Options.TokenSource for the token and reports whether
// it differs from the one the engine refused.
func (c *Client) refreshToken() (changed bool) {
	if c.opts.TokenSource == nil {
		return false
	}
	tok := c.opts.TokenSource()
	c.mu.Lock()
	defer c.mu.Unlock()
	if tok == "" || tok == c.bearer {
		return false
	}
	c.bearer = tok
	return true
}

// TokenFile is where the engine keeps the same user's engine token when
// neither III_ENGINE_TOKEN nor config.yaml's engine_token sets one:
// ~/.iii/engine-token (the home directory from $HOME).
func TokenFile() (string, error) { return enginetoken.Path() }

// DiscoverToken returns the engine token the same user's clients present
// to the engine at engineURL (ws://host:port) when none is given:
// $III_ENGINE_TOKEN when it is set, else the token in TokenFile. The file's
// token goes only to an engine on a loopback address whose port no other
// user listens on (as far as the system shows), so it never leaves the
// host nor reaches a port another user took. "" with a nil error means
// there is no token to send (no file, another user's engine, or a remote
// one): connect without one. A file that is there but unsafe (others may
// read it, another user owns it) is an error that says how to fix it.
func DiscoverToken(engineURL string) (string, error) {
	if v := strings.TrimSpace(os.Getenv(EnvEngineToken)); v != "" {
		return v, nil
	}
	return TokenFromFile(engineURL)
}

// TokenFromFile is DiscoverToken without $III_ENGINE_TOKEN: the token in
// TokenFile when the engine at engineURL may receive it.
func TokenFromFile(engineURL string) (string, error) {
	u, err := hostPort(engineURL)
	if err != nil {
		return "", err
	}
	if !enginetoken.MayReceive(u) {
		return "", nil
	}
	p, err := enginetoken.Path()
	if err != nil {
		return "", nil
	}
	tok, err := enginetoken.Read(p)
	if errors.Is(err, fs.ErrNotExist) || errors.Is(err, fs.ErrPermission) {
		return "", nil
	}
	return tok, err
}

// hostPort is the host:port of an engine address.
func hostPort(raw string) (string, error) {
	u, err := engineURL(raw)
	if err != nil {
		return "", err
	}
	host := u.Host
	if u.Port() == "" {
		if u.Scheme == "wss" {
			host += ":443"
		} else {
			host += ":80"
		}
	}
	return host, nil
}
