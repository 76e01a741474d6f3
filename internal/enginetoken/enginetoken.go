// Package enginetoken keeps the local user's engine token: the secret in
// ~/.iii/engine-token that makes a connection to the engine an admin one
// (docs/security.md, "The engine token").
//
// The engine uses the file when neither III_ENGINE_TOKEN nor config.yaml's
// engine_token sets a token: it creates it on its first start (256 random
// bits, hex, mode 0600, created exclusively so two engines starting at once
// agree) and reuses it afterwards. The same user's clients (iii call,
// iii compose, the Go client's DiscoverToken) read it and present it; other
// users cannot read it. A file another user owns, or that others may read
// or write, is refused.
package enginetoken

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"unicode"

	"github.com/iii-sandbox/iii/internal/atomicfile"
	"github.com/iii-sandbox/iii/internal/ownfile"
)

const (
	// Env sets the engine token explicitly: the engine's environment wins
	// over config.yaml and the file, and a client's is sent as given.
	Env = "III_ENGINE_TOKEN"
	// Dir is the user's state directory under the home directory.
	Dir = ".iii"
	// FileName is the token file in Dir.
	FileName = "engine-token"
	// tokenBytes is the entropy of a token the engine makes: 256 bits.
	tokenBytes = 32
	// maxFileSize bounds what Read reads: a token is a line.
	maxFileSize = 4096
)

// Path is the token file: ~/.iii/engine-token, the home directory as
// os.UserHomeDir finds it ($HOME on Unix), as every other ~/.iii path of
// iii.
func Path() (string, error) {
	home, err := os.UserHomeDir()
	if err != nil {
		return "", fmt.Errorf("cannot find the home directory for ~/%s/%s: %w", Dir, FileName, err)
	}
	return filepath.Join(home, Dir, FileName), nil
}

// New returns a fresh token: 256 bits from the OS's CSPRNG, hex-encoded.
func New() (string, error) {
	var raw [tokenBytes]byte
	if _, err := rand.Read(raw[:]); err != nil {
		return "", fmt.Errorf("make an engine token: %w", err)
	}
	return hex.EncodeToString(raw[:]), nil
}

// Ensure returns the token in path, making the file first when it does
// not exist (its directory too, mode 0700). Of several callers at once
// exactly one writes it and all return its token. created reports that
// this call wrote it.
func Ensure(path string) (token string, created bool, err error) {
	tok, err := Read(path)
	if err == nil || !errors.Is(err, fs.ErrNotExist) {
		return tok, false, err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return "", false, fmt.Errorf("cannot make %s for the engine token: %w (set %s or engine_token in config.yaml instead)", filepath.Dir(path), err, Env)
	}
	fresh, err := New()
	if err != nil {
		return "", false, err
	}
	created, err = atomicfile.Create(path, []byte(fresh+"\n"), 0o600)
	if err != nil {
		return "", false, fmt.Errorf("cannot write the engine token to %s: %w (set %s or engine_token in config.yaml instead)", path, err, Env)
	}
	// Read it back whoever wrote it: another engine may have won.
	tok, err = Read(path)
	if err != nil {
		return "", false, err
	}
	return tok, created, nil
}

// Read returns the token in path. The file must be a regular file (not a
// symbolic link) owned by this user, that no other user may read or
// write, holding one token: printable characters without whitespace, and
// an optional final newline. A missing file is an error that
// errors.Is(err, fs.ErrNotExist).
func Read(path string) (string, error) {
	data, err := ownfile.Read(path, ownfile.Rules{MaxBytes: maxFileSize, ForbiddenPerm: 0o077})
	var refused *ownfile.RefusedError
	switch {
	case errors.As(err, &refused):
		return "", fmt.Errorf("the engine token file %s %v: %s", path, refused, remedy(path, refused.Why))
	case err != nil:
		return "", fmt.Errorf("cannot read the engine token file: %w", err)
	}
	tok, err := parse(data)
	if err != nil {
		return "", fmt.Errorf("the engine token file %s: %v (delete it and start the engine to make a new one)", path, err)
	}
	return tok, nil
}

// remedy says what to do about a refused token file.
func remedy(path string, why ownfile.Refusal) string {
	switch why {
	case ownfile.ForeignOwner:
		return "refusing a token another user controls; delete it (or fix its owner) and start the engine again"
	case ownfile.OpenMode:
		return fmt.Sprintf("refusing it (chmod 600 %s, or delete it and restart the engine to make a new token)", path)
	default:
		return "delete it and start the engine to make a new one"
	}
}

// parse reads a token file's content.
func parse(data []byte) (string, error) {
	s := strings.TrimSuffix(strings.TrimSuffix(string(data), "\n"), "\r")
	if s == "" {
		return "", errors.New("it is empty")
	}
	for _, r := range s {
		if unicode.IsSpace(r) || !unicode.IsPrint(r) {
			return "", errors.New("it holds whitespace or a control character; a token is one line of printable characters")
		}
	}
	return s, nil
}
