package cron

import (
	"testing"
	"time"
)

// FuzzParse: any expression parses or is refused without panicking; a
// parsed one's next fire is after the start, and matches its fields.
func FuzzParse(f *testing.F) {
	for _, s := range []string{"* * * * * *", "0 30 9,12 * * Mon-Fri", "*/15 0-30/5 * 1,15 JAN-jun ? 2030-2040/2",
		"@daily", "0 0 0 29 2 *", "5/20 * * * * *", "1-2,,3 * * * * *", "* * * * *", "60 * * * * *", "0 0 0 30 2 *"} {
		f.Add(s, int64(1767225600))
	}
	f.Fuzz(func(t *testing.T, expr string, unix int64) {
		s, err := Parse(expr)
		if err != nil {
			return
		}
		from := time.Unix(unix%(4102444800), 0).UTC()
		next, ok := s.Next(from)
		if !ok {
			return
		}
		if !next.After(from) {
			t.Fatalf("%q: next %s is not after %s", expr, next, from)
		}
		if !has(s.sec, next.Second()) || !has(s.min, next.Minute()) || !has(s.hour, next.Hour()) ||
			!has(s.dom, next.Day()) || !has(s.month, int(next.Month())) || !has(s.dow, int(next.Weekday())+1) || !s.yearOK(next.Year()) {
			t.Fatalf("%q: next %s does not match the expression", expr, next)
		}
	})
}
