package sdktest

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/iii-sandbox/iii/contract"
)

// TestObserved pins how failure messages name what a call returned: the
// reply itself, not a guess at what it meant.
func TestObserved(t *testing.T) {
	exit := 137
	cases := []struct {
		raw  json.RawMessage
		err  error
		want string
	}{
		{json.RawMessage(`{"success":false,"exit_code":137}`), nil, `a reply {"success":false,"exit_code":137}`},
		{nil, contract.NewError(contract.S300, "boom"), "the error S300: boom"},
		{nil, errors.New("connection reset"), "a non-sandbox error: connection reset"},
	}
	for _, tc := range cases {
		if got := observed(tc.raw, tc.err); got != tc.want {
			t.Errorf("observed(%s, %v) = %q, want %q", tc.raw, tc.err, got, tc.want)
		}
	}
	if got, want := js(contract.ExecResponse{ExitCode: &exit}), `"exit_code":137`; !strings.Contains(got, want) {
		t.Errorf("js(ExecResponse) = %s, want it to show %s", got, want)
	}
}
