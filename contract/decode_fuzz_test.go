package contract

import (
	"encoding/json"
	"errors"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
)

// FuzzDecode drives every operation's decoder with arbitrary payloads. It
// checks that nothing panics, that every refusal is a sandbox error with a
// validation code, and that every accepted request survives a trip through
// its own JSON encoding unchanged.
func FuzzDecode(f *testing.F) {
	seeds := map[string][]string{
		OpCreate: {`{"image":"node","cpus":2,"memory_mb":1,"name":"w","network":true,"idle_timeout_secs":0,"env":{"A":"1","b":"2"}}`, `{"image":"p","env":["A=1"]}`,
			`{"image":"p","progress":{"channel_id":"c","access_key":"k","direction":"read"}}`},
		OpExec: {`{"sandbox_id":"` + sid + `","cmd":"sh -c 'echo \"$A\"'","stdin":"AAEC/w==","env":["A=1"],"timeout_ms":7,"workdir":"/w"}`,
			`{"sandbox_id":"` + sid + `","argv":["a","b"]}`, `{"sandbox_id":"` + sid + `","cmd":"ls","args":["-l"]}`},
		OpRun: {`{"image":"p","code":"c","lang":"l","files":[{"path":"/a","content":"b"}],"stdin":"eA==","keep_sandbox":true}`,
			`{"image":"p","code":"c","lang":"l","progress":{"channel_id":"c","access_key":"k","direction":"write"}}`},
		OpList:        {`{}`, `null`},
		OpStop:        {`{"sandbox_id":"` + sid + `","wait":true}`},
		OpCatalogList: {`{}`},
		OpFsLs:        {`{"sandbox_id":"` + sid + `","path":"/"}`},
		OpFsStat:      {`{"sandbox_id":"` + sid + `","path":"/a"}`},
		OpFsMkdir:     {`{"sandbox_id":"` + sid + `","path":"/w","mode":"0700","parents":true}`},
		OpFsWrite: {`{"sandbox_id":"` + sid + `","path":"/w","content_b64":"/w=="}`,
			`{"sandbox_id":"` + sid + `","path":"/w","content":{"channel_id":"c","access_key":"k","direction":"read"}}`,
			`{"sandbox_id":"` + sid + `","path":"/w","content":"text","mode":"600"}`},
		OpFsRead:  {`{"sandbox_id":"` + sid + `","path":"/a"}`},
		OpFsRm:    {`{"sandbox_id":"` + sid + `","path":"/w","recursive":true}`},
		OpFsChmod: {`{"sandbox_id":"` + sid + `","path":"/w","mode":"1777","uid":5}`},
		OpFsMv:    {`{"sandbox_id":"` + sid + `","src":"/a","dst":"/b"}`},
		OpFsGrep:  {`{"sandbox_id":"` + sid + `","path":"/w","pattern":"x(y|z)+","exclude_glob":["a"],"max_line_bytes":3,"ignore_case":true}`},
		OpFsSed: {`{"sandbox_id":"` + sid + `","path":"/w","pattern":"x","replacement":"y","regex":false}`,
			`{"sandbox_id":"` + sid + `","files":["/a"],"pattern":"a+","replacement":"$1"}`},
	}
	ops := Ops()
	for i, op := range ops {
		for _, s := range seeds[op] {
			f.Add(uint8(i), []byte(s))
		}
	}
	dec := decoders()
	f.Fuzz(func(t *testing.T, which uint8, data []byte) {
		op := ops[int(which)%len(ops)]
		got, err := dec[op](data)
		if err != nil {
			var e *Error
			if !errors.As(err, &e) {
				t.Fatalf("%s: a refusal that is not a sandbox error: %T %v", op, err, err)
			}
			switch e.Code {
			case S001, S210, S217:
			default:
				t.Fatalf("%s: refusal with code %s: %s", op, e.Code, e.Message)
			}
			if got != nil {
				t.Fatalf("%s: a request came back with an error", op)
			}
			return
		}
		b, err := json.Marshal(got)
		if err != nil {
			t.Fatalf("%s: cannot marshal %#v: %v", op, got, err)
		}
		again, err := dec[op](b)
		if err != nil {
			t.Fatalf("%s: re-encoded request %s refused: %v", op, b, err)
		}
		if diff := cmp.Diff(got, again, cmpopts.EquateEmpty()); diff != "" {
			t.Fatalf("%s: round trip changed the request (-first +second):\n%s", op, diff)
		}
	})
}
