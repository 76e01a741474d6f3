package composefile

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/iii-sandbox/iii/compose"
)

// durationUnits are the units a compose duration may carry. "ms" is listed
// before "m" and "s" so the longest suffix wins.
var durationUnits = []struct {
	suffix string
	unit   time.Duration
}{
	{"ms", time.Millisecond},
	{"s", time.Second},
	{"m", time.Minute},
	{"h", time.Hour},
}

// ParseDuration reads a compose duration: a whole number followed by one
// unit (500ms, 30s, 2m, 1h). A bare number is refused because it is
// ambiguous (seconds? milliseconds?), and compound forms such as 1m30s are
// refused to keep one obvious way to write a value. Errors are
// INVALID_DURATION without a location.
func ParseDuration(s string) (time.Duration, error) {
	bad := func(why string) error {
		return compose.New(compose.CodeInvalidDuration, fmt.Sprintf(
			"%q is not a duration: %s; write a whole number with a unit: 500ms, 30s, 2m or 1h", clip(s, 40), why))
	}
	t := s
	if t == "" {
		return 0, bad("it is empty")
	}
	for _, u := range durationUnits {
		if !strings.HasSuffix(t, u.suffix) {
			continue
		}
		num := t[:len(t)-len(u.suffix)]
		if num == "" || !allDigits(num) {
			return 0, bad("the part before the unit must be a whole number")
		}
		n, err := strconv.ParseInt(num, 10, 64)
		if err != nil || n > math.MaxInt64/int64(u.unit) {
			return 0, bad("it is too large")
		}
		return time.Duration(n) * u.unit, nil
	}
	if allDigits(t) {
		return 0, bad("it has no unit")
	}
	return 0, bad("the unit must be ms, s, m or h")
}

func allDigits(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return s != ""
}
