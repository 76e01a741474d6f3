package daemon

import (
	"testing"

	"github.com/iii-sandbox/iii/compose"
	"github.com/iii-sandbox/iii/compose/fileedit"
)

func FuzzDecodeRequest(f *testing.F) {
	f.Add([]byte(`{"file":"x","tail":5,"cursors":{"a":{"generation":1,"offset":2}}}`))
	f.Add([]byte(`null`))
	f.Add([]byte(`[1]`))
	f.Add([]byte(`{"tail":"x"}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		r, err := decodeRequest("compose::up", data)
		if err != nil {
			if compose.CodeOf(err) != CodeInvalidArgument {
				t.Fatalf("uncoded error %v", err)
			}
			return
		}
		if _, err := fileedit.ParseAdditions(r.Worker, r.Workers); err != nil && compose.CodeOf(err) == "" {
			t.Fatalf("uncoded error %v", err)
		}
	})
}
