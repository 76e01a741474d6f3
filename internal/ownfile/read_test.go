package ownfile

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"testing"

	"gotest.tools/v3/assert"
)

func TestRead(t *testing.T) {
	dir := t.TempDir()
	file := func(name string, mode os.FileMode, content string) string {
		p := filepath.Join(dir, name)
		assert.NilError(t, os.WriteFile(p, []byte(content), 0o600))
		assert.NilError(t, os.Chmod(p, mode))
		return p
	}
	secret := Rules{MaxBytes: 8, ForbiddenPerm: 0o077}
	readOnly := Rules{MaxBytes: 8, ForbiddenPerm: 0o027, FollowSymlinks: true, RootMayOwn: true}
	good := file("good", 0o600, "tok")
	link := filepath.Join(dir, "link")
	assert.NilError(t, os.Symlink(good, link))
	foreign := file("foreign", 0o600, "tok")
	foreignOwned := os.Getuid() == 0 && os.Chown(foreign, 65534, 65534) == nil

	type readCase struct {
		name  string
		path  string
		rules Rules
		why   Refusal // 0: read
	}
	tests := []readCase{
		{"own 0600", good, secret, 0},
		{"group-readable secret", file("g", 0o640, "tok"), secret, OpenMode},
		{"group-readable, read only", file("g2", 0o640, "tok"), readOnly, 0},
		{"world-readable, read only", file("w", 0o604, "tok"), readOnly, OpenMode},
		{"group-writable, read only", file("gw", 0o620, "tok"), readOnly, OpenMode},
		{"too large", file("big", 0o600, "123456789"), secret, TooLarge},
		{"a directory", dir, secret, NotRegular},
		{"a link", link, secret, Symlink},
		{"a link, followed", link, readOnly, 0},
	}
	if foreignOwned {
		tests = append(tests, readCase{"another user's", foreign, readOnly, ForeignOwner})
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			data, err := Read(tc.path, tc.rules)
			if tc.why == 0 {
				assert.NilError(t, err)
				assert.Equal(t, string(data), "tok")
				return
			}
			var refused *RefusedError
			assert.Assert(t, errors.As(err, &refused), "%v", err)
			assert.Equal(t, refused.Why, tc.why, refused.Reason)
		})
	}
	_, err := Read(filepath.Join(dir, "missing"), secret)
	assert.Assert(t, errors.Is(err, fs.ErrNotExist), "%v", err)
}
