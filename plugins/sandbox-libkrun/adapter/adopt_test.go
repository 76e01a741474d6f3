package adapter

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"gotest.tools/v3/assert"

	"github.com/iii-sandbox/iii/plugins/sandbox-libkrun/boot"
)

const goodRecord = `{"format":1,"sandbox_id":"0b9c6a4e-1f7d-4c1e-9a57-3d2f3e1c9b10","image":"python","backend":"qemu","created":"2026-12-02T10:00:00Z","idle_timeout_ms":300000}`

// sandbox.json is read strictly: bounded, known fields, one object, a
// known format and back end, a UUID.
func TestSandboxRecordRead(t *testing.T) {
	for _, tc := range []struct {
		name, in, err string
	}{
		{name: "good", in: goodRecord},
		{name: "unknown field", in: strings.Replace(goodRecord, `"image"`, `"evil":1,"image"`, 1), err: "unknown field"},
		{name: "trailing", in: goodRecord + `{}`, err: "trailing"},
		{name: "format", in: strings.Replace(goodRecord, `"format":1`, `"format":2`, 1), err: "format 2"},
		{name: "back end", in: strings.Replace(goodRecord, `"qemu"`, `"xen"`, 1), err: "back end"},
		{name: "not a uuid", in: strings.Replace(goodRecord, `0b9c6a4e-`, `../../`, 1), err: "sandbox id"},
		{name: "negative idle", in: strings.Replace(goodRecord, `300000`, `-1`, 1), err: "negative"},
		{name: "huge", in: `{"format":1,"env":["` + strings.Repeat("a", boot.MaxRecordBytes) + `"]}`, err: "larger than"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := filepath.Join(t.TempDir(), recordName)
			assert.NilError(t, os.WriteFile(p, []byte(tc.in), 0o600))
			var rec sandboxRecord
			err := boot.ReadJSONFile(p, boot.MaxRecordBytes, &rec)
			if err == nil {
				err = rec.validate()
			}
			if tc.err == "" {
				assert.NilError(t, err)
				return
			}
			assert.ErrorContains(t, err, tc.err)
		})
	}
}

func FuzzSandboxRecord(f *testing.F) {
	f.Add([]byte(goodRecord))
	f.Add([]byte(`{"format":1}`))
	f.Add([]byte(`[]`))
	dir := f.TempDir()
	f.Fuzz(func(t *testing.T, b []byte) {
		p := filepath.Join(dir, recordName)
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Skip()
		}
		var rec sandboxRecord
		if boot.ReadJSONFile(p, boot.MaxRecordBytes, &rec) == nil {
			_ = rec.validate()
		}
	})
}
