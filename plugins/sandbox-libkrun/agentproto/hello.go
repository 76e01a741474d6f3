package agentproto

import (
	"encoding/json"
	"fmt"
	"slices"
)

// Roles in a Hello.
const (
	RoleHost  = "host"
	RoleAgent = "agent"
)

// Capabilities a guest agent may announce. The host checks the one an
// operation needs before sending it, so an older agent fails only the
// operations it lacks.
const (
	CapExec     = "exec"
	CapFSLs     = "fs.ls"
	CapFSStat   = "fs.stat"
	CapFSMkdir  = "fs.mkdir"
	CapFSWrite  = "fs.write"
	CapFSRead   = "fs.read"
	CapFSRm     = "fs.rm"
	CapFSChmod  = "fs.chmod"
	CapFSMv     = "fs.mv"
	CapFSGrep   = "fs.grep"
	CapFSSed    = "fs.sed"
	CapNet      = "net"
	CapShutdown = "shutdown"
	// Protocol 1.1.
	CapSpawn     = "spawn"     // spawn and proc_stop
	CapWorkspace = "workspace" // workspace
	// Protocol 1.2.
	CapNetStats = "net.stats" // net_stats
	// Protocol 1.3.
	CapReseed = "reseed" // reseed
	// Protocol 1.4.
	CapProcAttach = "proc.attach" // spawn keep and proc_attach
)

// AllCapabilities lists every capability this version of the protocol
// defines, in a stable order.
func AllCapabilities() []string {
	return []string{
		CapExec, CapFSLs, CapFSStat, CapFSMkdir, CapFSWrite, CapFSRead, CapFSRm,
		CapFSChmod, CapFSMv, CapFSGrep, CapFSSed, CapNet, CapShutdown,
		CapSpawn, CapWorkspace, CapNetStats, CapReseed, CapProcAttach,
	}
}

// FSCapability maps an fs op name to the capability that serves it.
func FSCapability(op string) string { return "fs." + op }

// Hello opens a connection in each direction. The host's hello carries its
// nonce; the agent's echoes it, so the host can tell the answer to this
// connection from a stale one.
type Hello struct {
	Role          string   `json:"role"`
	ProtocolMajor int      `json:"protocol_major"`
	ProtocolMinor int      `json:"protocol_minor"`
	Nonce         string   `json:"nonce"`
	Version       string   `json:"version,omitempty"` // agent or host build version
	Capabilities  []string `json:"capabilities,omitempty"`
	// Facts about the guest, for logs and measurements.
	Arch     string `json:"arch,omitempty"`
	Kernel   string `json:"kernel,omitempty"`
	Root     string `json:"root,omitempty"` // "overlay" (image + tmpfs upper) or "initramfs"
	UptimeMS int64  `json:"uptime_ms,omitempty"`
	BootMS   int64  `json:"boot_ms,omitempty"` // kernel uptime when the agent was ready to serve
}

// Has reports whether the hello announces capability c.
func (h *Hello) Has(c string) bool { return slices.Contains(h.Capabilities, c) }

// DecodeHello parses a KindHello payload.
func DecodeHello(p []byte) (*Hello, error) {
	var h Hello
	if err := json.Unmarshal(p, &h); err != nil {
		return nil, fmt.Errorf("agentproto: decode hello: %w", err)
	}
	if h.Role != RoleHost && h.Role != RoleAgent {
		return nil, fmt.Errorf("agentproto: hello with unknown role %q", h.Role)
	}
	if h.ProtocolMajor <= 0 || h.ProtocolMinor < 0 {
		return nil, fmt.Errorf("agentproto: hello with invalid protocol version %d.%d", h.ProtocolMajor, h.ProtocolMinor)
	}
	return &h, nil
}

// CheckCompatible refuses a peer whose protocol major differs from ours.
func CheckCompatible(h *Hello) error {
	if h.ProtocolMajor != ProtocolMajor {
		return &Error{
			Code: CodeProtocolMismatch,
			Message: fmt.Sprintf("guest agent speaks protocol %d.%d, this host speaks %d.%d: rebuild the initramfs with a matching agent",
				h.ProtocolMajor, h.ProtocolMinor, ProtocolMajor, ProtocolMinor),
		}
	}
	return nil
}
