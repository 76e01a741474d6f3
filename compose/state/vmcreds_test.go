package state

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
)

// vm-credentials.json: recorded owner-only, forgotten one by one, gone
// when empty, and read back as written.
func TestVMCredentials(t *testing.T) {
	root := t.TempDir()
	s, err := Open(filepath.Join(root, "state"), filepath.Join(root, "worker-compose.yaml"), "dev")
	assert.NilError(t, err)
	defer s.Close()

	m, err := s.LoadVMCredentials()
	assert.NilError(t, err)
	assert.Check(t, is.Len(m, 0))
	assert.NilError(t, s.SetVMCredential("vm-a", "tok-a"))
	assert.NilError(t, s.SetVMCredential("vm-b", "tok-b"))
	assert.NilError(t, s.SetVMCredential("vm-a", "tok-a2"))
	fi, err := os.Stat(s.VMCredentialsPath())
	assert.NilError(t, err)
	assert.Check(t, is.Equal(fi.Mode().Perm(), os.FileMode(0o600)), "the file holds credentials")
	m, err = s.LoadVMCredentials()
	assert.NilError(t, err)
	assert.Check(t, is.DeepEqual(m, map[string]string{"vm-a": "tok-a2", "vm-b": "tok-b"}))

	assert.NilError(t, s.SetVMCredential("vm-a", ""))
	assert.NilError(t, s.SetVMCredential("nobody", ""))
	m, err = s.LoadVMCredentials()
	assert.NilError(t, err)
	assert.Check(t, is.DeepEqual(m, map[string]string{"vm-b": "tok-b"}))
	assert.NilError(t, s.SetVMCredential("vm-b", ""))
	_, err = os.Stat(s.VMCredentialsPath())
	assert.Check(t, os.IsNotExist(err), "an empty record set leaves no file")
}

func TestDecodeVMCredentialsRejects(t *testing.T) {
	for _, tc := range []struct{ name, data, want string }{
		{"not json", "nope", "not a Compose vm-credentials file"},
		{"unknown field", `{"version":1,"credentials":{},"extra":1}`, "not a Compose vm-credentials file"},
		{"other version", `{"version":2,"credentials":{}}`, "version 2 is not supported"},
		{"trailing", `{"version":1,"credentials":{}} {}`, "trailing data"},
		{"empty token", `{"version":1,"credentials":{"vm":""}}`, "without a vm_id or a token"},
		{"empty id", `{"version":1,"credentials":{"":"t"}}`, "without a vm_id or a token"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := DecodeVMCredentials([]byte(tc.data), "/x/vm-credentials.json")
			assert.ErrorContains(t, err, tc.want)
			assert.ErrorContains(t, err, "/x/vm-credentials.json")
		})
	}
	var b strings.Builder
	b.WriteString(`{"version":1,"credentials":{`)
	for i := range maxVMCredentials + 1 {
		if i > 0 {
			b.WriteString(",")
		}
		b.WriteString(`"vm-` + strconv.Itoa(i) + `":"t"`)
	}
	b.WriteString("}}")
	_, err := DecodeVMCredentials([]byte(b.String()), "f")
	assert.ErrorContains(t, err, "more than the 1024")
}

// FuzzDecodeVMCredentials: any input decodes or fails with an error, and
// what decodes has no empty id or token.
func FuzzDecodeVMCredentials(f *testing.F) {
	f.Add([]byte(`{"version":1,"credentials":{"vm-a":"tok"}}`))
	f.Add([]byte(`{"version":1,"credentials":null}`))
	f.Add([]byte(`{}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		m, err := DecodeVMCredentials(data, "f")
		if err != nil {
			return
		}
		assert.Assert(t, m != nil)
		for id, tok := range m {
			assert.Assert(t, id != "" && tok != "")
		}
	})
}
