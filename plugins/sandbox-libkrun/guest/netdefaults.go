package guest

// QEMU user-network defaults. Plain values, so the portable parts of the
// agent (netstats.go) build on every GOOS the tree is vetted for.
const (
	DefaultInterface = "eth0"
	DefaultAddress   = "10.0.2.15/24"
	DefaultGateway   = "10.0.2.2"
	DefaultDNS       = "10.0.2.3"
)
