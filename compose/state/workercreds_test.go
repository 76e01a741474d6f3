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

// worker-credentials.json: recorded owner-only, forgotten one by one, gone
// when empty, and read back as written.
func TestWorkerCredentials(t *testing.T) {
	root := t.TempDir()
	s, err := Open(filepath.Join(root, "state"), filepath.Join(root, "worker-compose.yaml"), "dev")
	assert.NilError(t, err)
	defer s.Close()

	m, err := s.LoadWorkerCredentials()
	assert.NilError(t, err)
	assert.Check(t, is.Len(m, 0))
	assert.NilError(t, s.SetWorkerCredential("vm-a", "tok-a"))
	assert.NilError(t, s.SetWorkerCredential("vm-b", "tok-b"))
	assert.NilError(t, s.SetWorkerCredential("vm-a", "tok-a2"))
	fi, err := os.Stat(s.WorkerCredentialsPath())
	assert.NilError(t, err)
	assert.Check(t, is.Equal(fi.Mode().Perm(), os.FileMode(0o600)), "the file holds credentials")
	m, err = s.LoadWorkerCredentials()
	assert.NilError(t, err)
	assert.Check(t, is.DeepEqual(m, map[string]string{"vm-a": "tok-a2", "vm-b": "tok-b"}))

	assert.NilError(t, s.SetWorkerCredential("vm-a", ""))
	assert.NilError(t, s.SetWorkerCredential("nobody", ""))
	m, err = s.LoadWorkerCredentials()
	assert.NilError(t, err)
	assert.Check(t, is.DeepEqual(m, map[string]string{"vm-b": "tok-b"}))
	assert.NilError(t, s.SetWorkerCredential("vm-b", ""))
	_, err = os.Stat(s.WorkerCredentialsPath())
	assert.Check(t, os.IsNotExist(err), "an empty record set leaves no file")
}

func TestDecodeWorkerCredentialsRejects(t *testing.T) {
	for _, tc := range []struct{ name, data, want string }{
		{"not json", "nope", "not a Compose worker-credentials file"},
		{"unknown field", `{"version":1,"credentials":{},"extra":1}`, "not a Compose worker-credentials file"},
		{"other version", `{"version":2,"credentials":{}}`, "version 2 is not supported"},
		{"trailing", `{"version":1,"credentials":{}} {}`, "trailing data"},
		{"empty token", `{"version":1,"credentials":{"vm":""}}`, "without an id or a token"},
		{"empty id", `{"version":1,"credentials":{"":"t"}}`, "without an id or a token"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := DecodeWorkerCredentials([]byte(tc.data), "/x/worker-credentials.json")
			assert.ErrorContains(t, err, tc.want)
			assert.ErrorContains(t, err, "/x/worker-credentials.json")
		})
	}
	var b strings.Builder
	b.WriteString(`{"version":1,"credentials":{`)
	for i := range maxWorkerCredentials + 1 {
		if i > 0 {
			b.WriteString(",")
		}
		b.WriteString(`"vm-` + strconv.Itoa(i) + `":"t"`)
	}
	b.WriteString("}}")
	_, err := DecodeWorkerCredentials([]byte(b.String()), "f")
	assert.ErrorContains(t, err, "more than the 1024")
}

// FuzzDecodeWorkerCredentials: any input decodes or fails with an error, and
// what decodes has no empty id or token.
func FuzzDecodeWorkerCredentials(f *testing.F) {
	f.Add([]byte(`{"version":1,"credentials":{"vm-a":"tok"}}`))
	f.Add([]byte(`{"version":1,"credentials":null}`))
	f.Add([]byte(`{}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		m, err := DecodeWorkerCredentials(data, "f")
		if err != nil {
			return
		}
		assert.Assert(t, m != nil)
		for id, tok := range m {
			assert.Assert(t, id != "" && tok != "")
		}
	})
}
