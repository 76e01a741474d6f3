package workervm

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/iii-sandbox/iii/contract"
	"github.com/iii-sandbox/iii/plugins/sandbox-libkrun/backend"
	"github.com/iii-sandbox/iii/plugins/sandbox-libkrun/images/ocilayout"
)

// GuestGateway is the guest's gateway (usernet.GatewayAddr). It leads to
// the host only through a VM worker's forward of the engine's port.
const GuestGateway = "10.0.2.2"

// workerPlan is a validated worker::start, with everything resolved that
// does not need the VM: the host directory, the image, the guest's
// environment and working directory.
type workerPlan struct {
	req      *contract.WorkerStartRequest
	hostDir  string // symlinks resolved
	image    contract.CatalogImage
	env      []string
	workdir  string
	hostname string
	// forward is the gateway port that leads to the engine, when
	// engine_url names the host's loopback.
	forward  *backend.NetForward
	cpus     uint32
	memoryMB uint32
	// hash identifies what was asked for, so a start that asks for the
	// same running worker again changes nothing.
	hash string
}

// loopbackRE finds a URL authority that names the host's loopback.
var loopbackRE = regexp.MustCompile(`://(localhost|127\.0\.0\.1)([:/?#]|$)`)

// RewriteLoopback points URLs at the host's loopback (localhost,
// 127.0.0.1) to the gateway, as upstream's VM boot does for every
// environment value. Only the engine's port is forwarded there
// (EngineForward): a guest reaches no other service of the host.
func RewriteLoopback(v string) string {
	return loopbackRE.ReplaceAllString(v, "://"+GuestGateway+"$2")
}

// GuestEngineURL is engine_url as the guest must dial it: a loopback host
// becomes the gateway, the port and path stay.
func GuestEngineURL(raw string) (string, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return "", err
	}
	switch h := u.Hostname(); h {
	case "localhost", "127.0.0.1":
		if p := u.Port(); p != "" {
			u.Host = net.JoinHostPort(GuestGateway, p)
		} else {
			u.Host = GuestGateway
		}
	}
	return u.String(), nil
}

// EngineForward is the gateway forward that lets a VM worker reach the
// engine at engine_url: the guest dials GuestEngineURL, the gateway's port
// is connected to the engine's loopback address and to nothing else. It
// is an HTTP forward for ws and http: the handshake reaches the engine with
// Host set to the engine's loopback address, which a loopback listener
// requires. nil
// when engine_url does not name the host's loopback (the guest then dials
// it directly, and the network policy decides).
func EngineForward(raw string) (*backend.NetForward, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return nil, err
	}
	switch u.Hostname() {
	case "localhost", "127.0.0.1":
	default:
		return nil, nil
	}
	port := u.Port()
	if port == "" {
		switch u.Scheme {
		case "ws", "http":
			port = "80"
		case "wss", "https":
			port = "443"
		default:
			return nil, fmt.Errorf("%q has no port and scheme %q has no default one", raw, u.Scheme)
		}
	}
	p, err := strconv.ParseUint(port, 10, 16)
	if err != nil || p == 0 {
		return nil, fmt.Errorf("%q: port %q is not 1 to 65535", raw, port)
	}
	// TLS (wss, https) passes through as bytes: its Host is inside.
	plain := u.Scheme == "ws" || u.Scheme == "http"
	return &backend.NetForward{GuestPort: uint16(p), HostAddr: net.JoinHostPort("127.0.0.1", port), HTTP: plain}, nil
}

// guestHostname turns a vm_id into a host name (letters, digits, '-').
func guestHostname(id string) string {
	var b strings.Builder
	for _, r := range id {
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9':
			b.WriteRune(r)
		default:
			b.WriteByte('-')
		}
	}
	h := strings.Trim(b.String(), "-")
	if len(h) > 55 {
		h = strings.TrimRight(h[:55], "-")
	}
	if h == "" {
		h = "vm"
	}
	return "worker-" + h
}

// resolveHostRoots resolves each configured root's symbolic links once, at
// adapter start; a root that does not exist (yet) is kept as written.
func resolveHostRoots(roots []string) []string {
	out := make([]string, 0, len(roots))
	for _, r := range roots {
		if rr, err := filepath.EvalSymlinks(r); err == nil {
			r = rr
		}
		if !slices.Contains(out, r) {
			out = append(out, r)
		}
	}
	return out
}

// checkHostDir resolves dir and refuses it (S501) unless it lies under one
// of roots. Below the root that admits it, a directory inside a .iii
// directory is refused (S001): that is where Compose keeps a project's
// state and token. The roots themselves are trusted configuration: the
// default package cache (~/.iii/compose/packages), from which bundles run,
// is one of them.
func checkHostDir(dir string, roots []string) (string, error) {
	resolved, err := filepath.EvalSymlinks(dir)
	if err != nil {
		return "", contract.NewError(contract.S001, "invalid worker::start request: host_dir %s cannot be resolved: %v", dir, err)
	}
	fi, err := os.Stat(resolved)
	if err != nil || !fi.IsDir() {
		return "", contract.NewError(contract.S001, "invalid worker::start request: host_dir %s is not a directory", dir)
	}
	for _, r := range roots {
		if !pathUnder(resolved, r) {
			continue
		}
		rel, err := filepath.Rel(r, resolved)
		if err != nil {
			continue
		}
		if slices.Contains(strings.Split(rel, string(filepath.Separator)), ".iii") {
			return "", contract.NewError(contract.S001, "invalid worker::start request: host_dir %s lies inside a .iii directory, which holds Compose's state (the project token among it) and is never copied into a VM", dir)
		}
		return resolved, nil
	}
	shown := roots
	if len(shown) == 0 {
		shown = []string{"none: host_roots is empty"}
	}
	where := resolved
	if resolved != dir {
		where = fmt.Sprintf("%s (%s)", dir, resolved)
	}
	return "", contract.HostRootRefused(where, shown)
}

// workerImage resolves image: a catalog name (presets and custom_images;
// the image_allowlist governs sandboxes, not a project's own workers) or
// any OCI reference.
func workerImage(image string, catalog []contract.CatalogImage) (contract.CatalogImage, error) {
	for _, c := range catalog {
		if c.Name == image {
			return c, nil
		}
	}
	ref, err := ocilayout.CanonicalRef(image)
	if err != nil {
		return contract.CatalogImage{}, contract.NewError(contract.S001,
			"invalid worker::start request: image %q is neither a catalog name nor a valid OCI reference: %v", truncate(image, 120), err)
	}
	return contract.CatalogImage{Name: image, OCIRef: ref}, nil
}

// workerEnv is the guest environment of a worker: the request's, with
// loopback URLs pointed at the gateway, and the variables only the adapter
// may set.
func workerEnv(req *contract.WorkerStartRequest, engineURL string) []string {
	forced := map[string]string{
		"III_ISOLATION":  "libkrun",
		"III_URL":        engineURL,
		"III_ENGINE_URL": engineURL,
	}
	if req.Config != nil {
		forced["III_CONFIG"] = contract.WorkerConfigDir + "/" + req.Config.FileName
	}
	var out []string
	for _, kv := range req.Env {
		k, v, _ := strings.Cut(kv, "=")
		// A host path in III_CONFIG means nothing in the guest; the
		// published file replaces it, and without one it goes.
		if _, own := forced[k]; own || k == "III_CONFIG" || k == contract.ForbiddenWorkerEnv {
			continue
		}
		out = append(out, k+"="+RewriteLoopback(v))
	}
	keys := make([]string, 0, len(forced))
	for k := range forced {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		out = append(out, k+"="+forced[k])
	}
	return out
}

// planHash identifies a request, Wait aside.
func planHash(req *contract.WorkerStartRequest, hostDir, ref string) string {
	q := *req
	q.Wait = false
	// A fresh credential for the same worker is not a different worker.
	q.EngineCredential = ""
	b, _ := json.Marshal(struct {
		R       contract.WorkerStartRequest
		Dir, Im string
	}{q, hostDir, ref})
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// workerMeta is a worker's record, worker.json in its state directory: what
// it last ran and how that went. It lets worker::status and worker::list
// answer for workers that do not run (after an adapter restart too).
type workerMeta struct {
	Version     int    `json:"version"`
	VMID        string `json:"vm_id"`
	Name        string `json:"name"`
	Namespace   string `json:"namespace,omitempty"`
	Image       string `json:"image,omitempty"`
	ImageDigest string `json:"image_digest,omitempty"`
	State       string `json:"state"`
	PID         *int   `json:"pid,omitempty"`
	ExitCode    *int   `json:"exit_code,omitempty"`
	StartedAt   string `json:"started_at,omitempty"`
	Starts      uint64 `json:"starts"`
	Restarts    uint64 `json:"restarts"`
	LastError   string `json:"last_error,omitempty"`
	// PlanHash is the hash of the start request the VM runs, so a start
	// of the same worker after an adoption takes the running VM over.
	PlanHash string `json:"plan_hash,omitempty"`
}

const (
	metaName    = "worker.json"
	metaVersion = 1
	// maxMetaBytes bounds worker.json; a real one is well under 2 KiB.
	maxMetaBytes = 64 << 10
)

// decodeMeta parses worker.json strictly.
func decodeMeta(b []byte) (*workerMeta, error) {
	if len(b) > maxMetaBytes {
		return nil, fmt.Errorf("%s is %d bytes, more than %d", metaName, len(b), maxMetaBytes)
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	var m workerMeta
	if err := dec.Decode(&m); err != nil {
		return nil, fmt.Errorf("%s: %w", metaName, err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("%s: trailing data", metaName)
	}
	if m.Version != metaVersion {
		return nil, fmt.Errorf("%s: version %d, want %d", metaName, m.Version, metaVersion)
	}
	if !contract.ValidVMID(m.VMID) {
		return nil, fmt.Errorf("%s: vm_id %q is not valid", metaName, m.VMID)
	}
	switch m.State {
	case contract.WorkerStarting, contract.WorkerRunning, contract.WorkerExited, contract.WorkerFailed, contract.WorkerStopped:
	default:
		return nil, fmt.Errorf("%s: unknown state %q", metaName, m.State)
	}
	return &m, nil
}

// writeMeta replaces worker.json atomically.
func writeMeta(dir string, m *workerMeta) error {
	b, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return err
	}
	tmp := filepath.Join(dir, metaName+".tmp")
	if err := os.WriteFile(tmp, append(b, '\n'), 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, filepath.Join(dir, metaName))
}

// truncate shortens s to n bytes for a message.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
