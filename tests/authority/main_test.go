package authority

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"go.uber.org/goleak"

	"github.com/iii-sandbox/iii/internal/testkit/bins"
)

// envBinDir names a directory holding a built iii (`make test` sets it to
// bin/); without it the test builds one.
const envBinDir = "III_BIN_DIR"

// testBins builds iii when $III_BIN_DIR does not have it.
var testBins *bins.Set

func TestMain(m *testing.M) {
	var err error
	testBins, err = bins.New("iii-authority-", map[string]string{"iii": "github.com/iii-sandbox/iii/cmd/iii"})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := m.Run()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goroutines left behind:", err)
			code = 1
		}
	}
	testBins.Close()
	os.Exit(code)
}

// iiiBinary is $III_BIN_DIR/iii, or one built for these tests.
func iiiBinary(t *testing.T) string {
	t.Helper()
	if dir := os.Getenv(envBinDir); dir != "" {
		p, err := filepath.Abs(filepath.Join(dir, "iii"))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := os.Stat(p); err != nil {
			t.Fatalf("%v ($%s is set; run make build, or unset it to build here)", err, envBinDir)
		}
		return p
	}
	return testBins.Path(t, "iii")
}
