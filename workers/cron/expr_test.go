package cron

import (
	"strings"
	"testing"
	"time"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
)

func utc(s string) time.Time {
	t, err := time.Parse(time.RFC3339, s)
	if err != nil {
		panic(err)
	}
	return t.UTC()
}

// TestNext: the crate's format, fired at the times it would fire.
// 2026-01-01 is a Thursday.
func TestNext(t *testing.T) {
	for _, tc := range []struct {
		expr, from string
		want       []string
	}{
		{"* * * * * *", "2026-01-01T00:00:00Z", []string{"2026-01-01T00:00:01Z", "2026-01-01T00:00:02Z"}},
		{"* * * * * *", "2026-01-01T00:00:00.900Z", []string{"2026-01-01T00:00:01Z"}},
		{"*/15 * * * * *", "2026-01-01T00:00:14Z", []string{"2026-01-01T00:00:15Z", "2026-01-01T00:00:30Z", "2026-01-01T00:00:45Z", "2026-01-01T00:01:00Z"}},
		{"5/20 * * * * *", "2026-01-01T00:00:00Z", []string{"2026-01-01T00:00:05Z", "2026-01-01T00:00:25Z", "2026-01-01T00:00:45Z", "2026-01-01T00:01:05Z"}},
		{"0 30 9,12 * * *", "2026-01-01T10:00:00Z", []string{"2026-01-01T12:30:00Z", "2026-01-02T09:30:00Z"}},
		{"0 0 0 * * Mon-Fri", "2026-01-02T12:00:00Z", []string{"2026-01-05T00:00:00Z", "2026-01-06T00:00:00Z"}},
		// Numeric days of the week: Sunday=1 (2026-01-04 is a Sunday).
		{"0 0 0 * * 1", "2026-01-01T00:00:00Z", []string{"2026-01-04T00:00:00Z", "2026-01-11T00:00:00Z"}},
		{"0 0 0 * * 7", "2026-01-01T00:00:00Z", []string{"2026-01-03T00:00:00Z"}},
		{"0 0 0 * * SUN", "2026-01-01T00:00:00Z", []string{"2026-01-04T00:00:00Z"}},
		{"0 0 0 * * saturday", "2026-01-01T00:00:00Z", []string{"2026-01-03T00:00:00Z"}},
		// Day of month AND day of week: Friday the 13th.
		{"0 0 0 13 * Fri", "2026-01-01T00:00:00Z", []string{"2026-02-13T00:00:00Z", "2026-03-13T00:00:00Z", "2026-11-13T00:00:00Z"}},
		{"0 0 12 1 JAN,jul *", "2026-02-01T00:00:00Z", []string{"2026-07-01T12:00:00Z", "2027-01-01T12:00:00Z"}},
		{"0 0 0 29 2 *", "2026-01-01T00:00:00Z", []string{"2028-02-29T00:00:00Z", "2032-02-29T00:00:00Z"}},
		{"0 0 0 31 * *", "2026-01-31T00:00:00Z", []string{"2026-03-31T00:00:00Z", "2026-05-31T00:00:00Z"}},
		{"0 0 0 1 1 * 2030-2031", "2026-01-01T00:00:00Z", []string{"2030-01-01T00:00:00Z", "2031-01-01T00:00:00Z"}},
		{"0 0 0 1 1 ? 2026", "2026-01-01T00:00:00Z", nil},
		{"0 0 0 1 1 * 2100", "2100-01-01T00:00:00Z", nil},
		{"0 0 0 1 1 * 2100", "2099-06-01T00:00:00Z", []string{"2100-01-01T00:00:00Z"}},
		// A step past the field's end is its start alone.
		{"*/61 * * * * *", "2026-01-01T00:00:00Z", []string{"2026-01-01T00:01:00Z", "2026-01-01T00:02:00Z"}},
		{"0 0 0 ? * Mon-Fri/2", "2026-01-01T00:00:00Z", []string{"2026-01-02T00:00:00Z", "2026-01-05T00:00:00Z", "2026-01-07T00:00:00Z"}},
		{"0 0 0 * * Tues-Thurs", "2026-01-01T00:00:00Z", []string{"2026-01-06T00:00:00Z", "2026-01-07T00:00:00Z", "2026-01-08T00:00:00Z", "2026-01-13T00:00:00Z"}},
		{"0 0 0 1 Sept *", "2026-01-01T00:00:00Z", []string{"2026-09-01T00:00:00Z"}},
		{"@hourly", "2026-01-01T00:59:59Z", []string{"2026-01-01T01:00:00Z"}},
		{"@daily", "2026-01-01T00:00:00Z", []string{"2026-01-02T00:00:00Z"}},
		{"@weekly", "2026-01-01T00:00:00Z", []string{"2026-01-04T00:00:00Z"}},
		{"@monthly", "2026-01-15T00:00:00Z", []string{"2026-02-01T00:00:00Z"}},
		{"@yearly", "2026-01-15T00:00:00Z", []string{"2027-01-01T00:00:00Z"}},
		{"59 59 23 31 12 *", "2026-06-01T00:00:00Z", []string{"2026-12-31T23:59:59Z", "2027-12-31T23:59:59Z"}},
		// A local time is read in UTC.
		{"0 0 * * * *", "2026-01-01T10:30:00+02:00", []string{"2026-01-01T09:00:00Z"}},
		// Never: 30 February.
		{"0 0 0 30 2 *", "2026-01-01T00:00:00Z", nil},
	} {
		t.Run(tc.expr+"@"+tc.from, func(t *testing.T) {
			s, err := Parse(tc.expr)
			assert.NilError(t, err)
			at := utc(tc.from)
			if strings.Contains(tc.from, ".") || strings.Contains(tc.from, "+") {
				at, _ = time.Parse(time.RFC3339Nano, tc.from)
			}
			for i, w := range tc.want {
				got, ok := s.Next(at)
				assert.Assert(t, ok, "fire %d: none", i)
				assert.Check(t, is.Equal(got.Format(time.RFC3339), w), "fire %d", i)
				at = got
			}
			if tc.want == nil {
				_, ok := s.Next(at)
				assert.Check(t, !ok, "never fires")
			}
		})
	}
}

func TestParseErrors(t *testing.T) {
	for _, tc := range []struct{ expr, want string }{
		{"", "empty expression"},
		{"   ", "empty expression"},
		{"* * * * *", "5 fields"},
		{"* * * *", "4 fields"},
		{"* * * * * * * *", "8 fields"},
		{"60 * * * * *", `seconds field "60": "60" is not in 0-59`},
		{"* * 24 * * *", "hours field"},
		{"* * * 0 * *", "day of month field"},
		{"* * * * 13 *", "month field"},
		{"* * * * * 0", `day of week field "0": "0" is not in 1-7`},
		{"* * * * * 8", "day of week field"},
		{"* * * * * Funday", "is not a number in 1-7 or a name"},
		{"* * * * Smarch *", "month field"},
		{"MON * * * * *", "is not a number in 0-59"},
		{"*/0 * * * * *", "step \"0\""},
		{"? * * * * *", "only for the day-of-month and day-of-week fields"},
		{"* * * * ? *", "only for the day-of-month"},
		{"* * * * * Mon/2", "a name takes no step"},
		{"* * * * Feb/2 *", "a name takes no step"},
		{"* * * * * 3-Thurs", "mixes a number and a name"},
		{"*/x * * * * *", "step \"x\""},
		{"10-5 * * * * *", "runs backwards"},
		{"1,,2 * * * * *", "empty list item"},
		{"-1 * * * * *", "missing value"},
		{"1- * * * * *", "missing value"},
		{"* * * * * * 1969", "year field"},
		{"* * * * * * 2101", "year field"},
		{"@every 5s", "unknown shorthand"},
		{strings.Repeat("1", 2000), "longer than"},
	} {
		t.Run(tc.expr, func(t *testing.T) {
			_, err := Parse(tc.expr)
			assert.ErrorContains(t, err, tc.want)
		})
	}
}
