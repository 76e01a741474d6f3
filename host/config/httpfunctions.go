package config

import (
	"strings"

	"gopkg.in/yaml.v3"

	"github.com/iii-sandbox/iii/host/httpfn"
	"github.com/iii-sandbox/iii/internal/yamlnode"
)

// HTTPFunctions is the iii-http-functions worker's settings
// (docs/http-functions.md): its security: block, upstream's defaults
// when absent. It is comparable, so a reload sees any change as a changed
// worker.
type HTTPFunctions struct {
	Name string // the worker entry's name, e.g. "iii-http-functions"
	// URLAllowlist is security.url_allowlist joined by newlines ("" when
	// the list is absent or empty: every host, "*"). A string keeps the
	// struct comparable; Security returns the list.
	URLAllowlist    string
	BlockPrivateIPs bool
	RequireHTTPS    bool
}

// Security is the block as the invoker takes it.
func (h HTTPFunctions) Security() httpfn.Security {
	s := httpfn.Security{BlockPrivateIPs: h.BlockPrivateIPs, RequireHTTPS: h.RequireHTTPS}
	if h.URLAllowlist != "" {
		s.URLAllowlist = strings.Split(h.URLAllowlist, "\n")
	} else {
		s.URLAllowlist = []string{"*"}
	}
	return s
}

// httpFunctions reads an iii-http-functions entry; prev is the entry read
// already, if any: the engine runs one such worker.
func (p *parser) httpFunctions(e entry, prev *HTTPFunctions) (*HTTPFunctions, error) {
	if prev != nil {
		return nil, p.fail(CodeInvalidConfig, e.nameNode, "a second iii-http-functions worker (%s; the first is %s): the engine runs one, whose security: block applies to every HTTP-invocation function", e.Name, prev.Name)
	}
	def := httpfn.DefaultSecurity()
	h := &HTTPFunctions{Name: e.Name, BlockPrivateIPs: def.BlockPrivateIPs, RequireHTTPS: def.RequireHTTPS}
	path := e.Name + ".config"
	fields, err := p.mapping(e.configNode, path, "security")
	if err != nil {
		return nil, err
	}
	sec, err := p.mapping(fields["security"], path+".security", "url_allowlist", "block_private_ips", "require_https")
	if err != nil {
		return nil, err
	}
	if v := sec["url_allowlist"]; !yamlnode.IsNull(v) {
		if h.URLAllowlist, err = p.urlAllowlist(v, path+".security.url_allowlist"); err != nil {
			return nil, err
		}
	}
	for key, dst := range map[string]*bool{"block_private_ips": &h.BlockPrivateIPs, "require_https": &h.RequireHTTPS} {
		if v := sec[key]; !yamlnode.IsNull(v) {
			if *dst, err = p.boolValue(v, path+".security."+key); err != nil {
				return nil, err
			}
		}
	}
	return h, nil
}

func (p *parser) urlAllowlist(v *yaml.Node, path string) (string, error) {
	if v.Kind != yaml.SequenceNode {
		return "", p.fail(CodeInvalidConfig, v, "%s must be a list of host patterns such as [\"api.example.com\", \"*.example.org\"], not a %s", path, yamlnode.KindName(v))
	}
	pats := make([]string, 0, len(v.Content))
	for i, item := range v.Content {
		s, err := p.stringValue(item, path)
		if err != nil {
			return "", err
		}
		if strings.TrimSpace(s) == "" || strings.ContainsAny(s, "\n\r") {
			return "", p.fail(CodeInvalidConfig, item, "%s[%d] is blank or spans lines; write a host pattern such as api.example.com or *.example.org", path, i)
		}
		if err := httpfn.CheckPattern(s); err != nil {
			return "", p.fail(CodeInvalidConfig, item, "%s[%d]: %v; patterns use *, ? and [...] as in shell globs", path, i, err)
		}
		pats = append(pats, s)
	}
	return strings.Join(pats, "\n"), nil
}

func (p *parser) boolValue(n *yaml.Node, path string) (bool, error) {
	if n.Kind != yaml.ScalarNode || n.ShortTag() != yamlnode.TagBool {
		return false, p.fail(CodeInvalidConfig, n, "%s must be true or false, not a %s", path, yamlnode.KindName(n))
	}
	var b bool
	if err := n.Decode(&b); err != nil {
		return false, p.fail(CodeInvalidConfig, n, "%s must be true or false", path)
	}
	return b, nil
}
