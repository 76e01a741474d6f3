package contract

// The contract version this package implements. A different Major means an
// incompatible contract: hosts refuse such adapters with S302. Minor grows
// additively (1.1 added stdout_truncated and stderr_truncated), so a host
// accepts any minor of its own major.
const (
	Major = 1
	Minor = 1
)

// Operation names, as they follow the "sandbox::" prefix (router side) or
// the "<adapter>::" prefix (adapter side).
const (
	OpCreate      = "create"
	OpExec        = "exec"
	OpRun         = "run"
	OpList        = "list"
	OpStop        = "stop"
	OpCatalogList = "catalog::list"
	OpFsLs        = "fs::ls"
	OpFsStat      = "fs::stat"
	OpFsMkdir     = "fs::mkdir"
	OpFsWrite     = "fs::write"
	OpFsRead      = "fs::read"
	OpFsRm        = "fs::rm"
	OpFsChmod     = "fs::chmod"
	OpFsMv        = "fs::mv"
	OpFsGrep      = "fs::grep"
	OpFsSed       = "fs::sed"

	// OpAdapterInfo is served by adapters only (<adapter>::adapter::info);
	// the 0.26 router has no sandbox::adapter::info.
	OpAdapterInfo = "adapter::info"
)

// RouterPrefix is the prefix of the public functions the router serves in
// the default namespace.
const RouterPrefix = "sandbox::"

// Ops returns the sixteen public operations in the contract's documented
// order. It returns a fresh slice so callers cannot alter a shared table.
func Ops() []string {
	return []string{
		OpCreate, OpExec, OpRun, OpList, OpStop, OpCatalogList,
		OpFsLs, OpFsStat, OpFsMkdir, OpFsWrite, OpFsRead, OpFsRm,
		OpFsChmod, OpFsMv, OpFsGrep, OpFsSed,
	}
}

// IsFsOp reports whether op is one of the filesystem operations, whose
// invalid requests are S210 rather than S001.
func IsFsOp(op string) bool {
	switch op {
	case OpFsLs, OpFsStat, OpFsMkdir, OpFsWrite, OpFsRead, OpFsRm,
		OpFsChmod, OpFsMv, OpFsGrep, OpFsSed:
		return true
	}
	return false
}

// AdapterFunctionID is the function id an adapter named adapter registers
// for op, e.g. "sandbox-libkrun::fs::read".
func AdapterFunctionID(adapter, op string) string { return adapter + "::" + op }

// HostFunctionID is the function id one host of a fleet of adapter
// registers for op: "<adapter>::host::<host>::<op>", e.g.
// "sandbox-libkrun::host::h1::exec" (docs/scale-out.md).
func HostFunctionID(adapter, host, op string) string {
	return adapter + "::host::" + host + "::" + op
}

// HostOfFunctionID returns the host of a HostFunctionID of adapter for op,
// or "" when id is not one.
func HostOfFunctionID(adapter, op, id string) string {
	prefix, suffix := adapter+"::host::", "::"+op
	if len(id) <= len(prefix)+len(suffix) || id[:len(prefix)] != prefix || id[len(id)-len(suffix):] != suffix {
		return ""
	}
	host := id[len(prefix) : len(id)-len(suffix)]
	if !ValidHostName(host) {
		return ""
	}
	return host
}

// ValidHostName reports whether s can name a sandbox host: 1 to 63 of
// a-z, 0-9 and -, as sandbox host credentials spell it.
func ValidHostName(s string) bool {
	if len(s) == 0 || len(s) > 63 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-') {
			return false
		}
	}
	return true
}

// RouterFunctionID is the public function id of op, e.g. "sandbox::exec".
func RouterFunctionID(op string) string { return RouterPrefix + op }

// ContractVersion is the {major, minor} pair adapter::info reports.
type ContractVersion struct {
	Major uint32 `json:"major"`
	Minor uint32 `json:"minor"`
}

// Current is the contract version of this package.
func Current() ContractVersion { return ContractVersion{Major: Major, Minor: Minor} }

// CheckContract refuses an adapter whose contract major differs from this
// package's: S302, not retryable, since only a different adapter build can
// fix it. Any minor of the same major is accepted (minors are additive).
func CheckContract(adapter string, got ContractVersion) *Error {
	if got.Major == Major {
		return nil
	}
	return NewError(S302,
		"sandbox adapter %q implements sandbox contract %d.%d, but this engine speaks contract %d.%d; install an adapter release for contract major %d",
		adapter, got.Major, got.Minor, Major, Minor, Major)
}
