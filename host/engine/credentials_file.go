package engine

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/iii-sandbox/iii/internal/atomicfile"
	"github.com/iii-sandbox/iii/internal/ownfile"
	"github.com/iii-sandbox/iii/protocol"
)

// The credentials file keeps the persisted credentials (issued with
// persist: true) across restarts of the engine: for each, the sha256 of
// its token and its spec, never the token (docs/security.md).
const (
	// CredentialsFileName is the file's name in the engine's state
	// directory (~/.iii).
	CredentialsFileName = "engine-credentials.json"
	// credentialsFileVersion is the format this engine reads and writes.
	credentialsFileVersion = 1
	// maxCredentialsFile bounds what is read: maxCredentials entries.
	maxCredentialsFile = 32 << 20
)

// credentialsFile is the file's content.
type credentialsFile struct {
	Version     int                   `json:"version"`
	Credentials []persistedCredential `json:"credentials"`
}

// persistedCredential is one credential of the file.
type persistedCredential struct {
	// TokenSHA256 is the hex sha256 of the token.
	TokenSHA256 string `json:"token_sha256"`
	// IssuedAt is when it was issued (RFC 3339, UTC); informative.
	IssuedAt string `json:"issued_at,omitempty"`
	CredentialSpec
}

// parseCredentialsFile decodes and checks a credentials file: the
// version, every entry's hash and spec, no hash twice. Unknown fields are
// refused, as a typo would otherwise change what a credential allows.
func parseCredentialsFile(data []byte, g RegistrationGuard) (map[[32]byte]persistedCredential, error) {
	d := json.NewDecoder(bytes.NewReader(data))
	d.DisallowUnknownFields()
	var f credentialsFile
	if err := d.Decode(&f); err != nil {
		return nil, fmt.Errorf("it is not a credentials file: %w", err)
	}
	if _, err := d.Token(); err != io.EOF {
		return nil, errors.New("it is not a credentials file: data after its JSON object")
	}
	if f.Version != credentialsFileVersion {
		return nil, fmt.Errorf("its version is %d; this engine reads version %d", f.Version, credentialsFileVersion)
	}
	if len(f.Credentials) > maxCredentials {
		return nil, fmt.Errorf("it holds %d credentials, more than the %d an engine keeps", len(f.Credentials), maxCredentials)
	}
	out := make(map[[32]byte]persistedCredential, len(f.Credentials))
	for i, pc := range f.Credentials {
		raw, err := hex.DecodeString(pc.TokenSHA256)
		if err != nil || len(raw) != sha256.Size {
			return nil, fmt.Errorf("credential %d: token_sha256 is not 64 hex digits", i)
		}
		if pc.Persist {
			return nil, fmt.Errorf("credential %d: persist is not a field of a stored credential", i)
		}
		if _, errb := newCredential(pc.CredentialSpec, g); errb != nil {
			return nil, fmt.Errorf("credential %d (%s): %s", i, quote(pc.Label), errb.Message)
		}
		k := [32]byte(raw)
		if _, dup := out[k]; dup {
			return nil, fmt.Errorf("credential %d: the same token_sha256 twice", i)
		}
		out[k] = pc
	}
	return out, nil
}

// encodeCredentialsFile is parseCredentialsFile's inverse, entries in a
// stable order (by hash).
func encodeCredentialsFile(m map[[32]byte]persistedCredential) ([]byte, error) {
	f := credentialsFile{Version: credentialsFileVersion, Credentials: make([]persistedCredential, 0, len(m))}
	for _, pc := range m {
		f.Credentials = append(f.Credentials, pc)
	}
	slices.SortFunc(f.Credentials, func(a, b persistedCredential) int { return strings.Compare(a.TokenSHA256, b.TokenSHA256) })
	b, err := json.MarshalIndent(f, "", "  ")
	if err != nil {
		return nil, err
	}
	return append(b, '\n'), nil
}

// readCredentialsFile reads and checks the file at path. A missing file is
// an empty set. A file that is a symbolic link or not a regular file, that
// another user owns, or that the group or others may write is refused.
func readCredentialsFile(path string, g RegistrationGuard) (map[[32]byte]persistedCredential, error) {
	data, err := ownfile.Read(path, ownfile.Rules{MaxBytes: maxCredentialsFile, ForbiddenPerm: 0o022})
	var refused *ownfile.RefusedError
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return map[[32]byte]persistedCredential{}, nil
	case errors.As(err, &refused) && refused.Why == ownfile.ForeignOwner:
		return nil, fmt.Errorf("the credentials file %s %v: refusing credentials another user controls; fix its owner or delete it", path, refused)
	case errors.As(err, &refused) && refused.Why == ownfile.OpenMode:
		return nil, fmt.Errorf("the credentials file %s %v and so add credentials; refusing it (chmod 600 %s after checking its content, or delete it)", path, refused, path)
	case errors.As(err, &refused):
		return nil, fmt.Errorf("the credentials file %s %v", path, refused)
	case err != nil:
		return nil, fmt.Errorf("cannot read the credentials file: %w", err)
	}
	m, err := parseCredentialsFile(data, g)
	if err != nil {
		return nil, fmt.Errorf("the credentials file %s: %v (fix it or delete it)", path, err)
	}
	return m, nil
}

// UseCredentialsFile makes path the engine's credentials file: the
// credentials it holds are loaded (their tokens are accepted from now on),
// and issue with persist: true writes there. A file that cannot be used
// (malformed, a link, another user's, writable by others) is logged and
// ignored: no credential is loaded from it, and persisting is refused
// until it is fixed. loaded counts the credentials taken from it.
func (e *Engine) UseCredentialsFile(path string) (loaded int, err error) {
	e.creds.file.Store(&path)
	e.creds.fileMu.Lock()
	g := e.guard()
	m, err := readCredentialsFile(path, g)
	e.creds.fileMu.Unlock()
	if err != nil {
		e.log.Error("credentials file refused: no persisted credential is loaded, and persist: true is refused until it is fixed", "file", path, "error", err)
		return 0, err
	}
	e.creds.mu.Lock()
	defer e.creds.mu.Unlock()
	if e.creds.m == nil {
		e.creds.m = map[[32]byte]*credential{}
	}
	for k, pc := range m {
		if _, ok := e.creds.m[k]; ok {
			continue
		}
		c, errb := newCredential(pc.CredentialSpec, g)
		if errb != nil { // parseCredentialsFile checked it
			continue
		}
		c.persisted = true
		e.creds.m[k] = c
		loaded++
		if c.claims != "" {
			defer e.ReserveName(c.claims)
		}
	}
	if loaded > 0 {
		e.log.Info("persisted credentials loaded", "file", path, "count", loaded)
	}
	return loaded, nil
}

// persistCredential adds a credential to the file (read, changed, written
// whole and atomically, mode 0600).
func (e *Engine) persistCredential(k [32]byte, spec CredentialSpec) *protocol.ErrorBody {
	p := e.creds.file.Load()
	if p == nil || *p == "" {
		return &protocol.ErrorBody{Code: CodeInvalidArgument, Message: "persist: this engine keeps no credentials file; issue the credential without persist"}
	}
	err := e.rewriteCredentialsFile(*p, func(m map[[32]byte]persistedCredential) bool {
		m[k] = persistedCredential{TokenSHA256: hex.EncodeToString(k[:]), IssuedAt: time.Now().UTC().Format(time.RFC3339), CredentialSpec: spec}
		return true
	})
	if err != nil {
		e.log.Error("credential not persisted", "file", *p, "error", err)
		return &protocol.ErrorBody{Code: protocol.CodeInvocationFailed, Message: "persist: " + err.Error()}
	}
	return nil
}

// unpersistCredential removes a credential from the file; it reports
// whether the file held it.
func (e *Engine) unpersistCredential(k [32]byte) bool {
	p := e.creds.file.Load()
	if p == nil || *p == "" {
		return false
	}
	found := false
	err := e.rewriteCredentialsFile(*p, func(m map[[32]byte]persistedCredential) bool {
		_, found = m[k]
		delete(m, k)
		return found
	})
	if err != nil {
		e.log.Error("revoked credential could not be removed from the credentials file; the engine refuses it until it restarts, so fix the file", "file", *p, "error", err)
	}
	return found
}

// rewriteCredentialsFile applies change to the file's credentials and
// writes the result when change reports a change.
func (e *Engine) rewriteCredentialsFile(path string, change func(map[[32]byte]persistedCredential) bool) error {
	e.creds.fileMu.Lock()
	defer e.creds.fileMu.Unlock()
	m, err := readCredentialsFile(path, e.guard())
	if err != nil {
		return err
	}
	if !change(m) {
		return nil
	}
	data, err := encodeCredentialsFile(m)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return fmt.Errorf("cannot make the directory of the credentials file: %w", err)
	}
	if err := atomicfile.Write(path, data, 0o600); err != nil {
		return fmt.Errorf("cannot write the credentials file: %w", err)
	}
	return nil
}
