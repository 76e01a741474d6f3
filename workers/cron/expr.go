package cron

import (
	"errors"
	"fmt"
	"math/bits"
	"strconv"
	"strings"
	"time"
)

// Expression format: upstream's, the Rust `cron` crate's. Six fields,
// seconds first, or seven with a year:
//
//	sec  min  hour  day-of-month  month  day-of-week  [year]
//	0-59 0-59 0-23  1-31          1-12   1-7          1970-2100
//
// Each field is `*`, a value, a range `a-b`, a step `*/n`, `a/n` (a to
// the field's end) or `a-b/n`, or a comma list of those; `?` is `*` in the
// two day fields only. Months take names (JAN or January), days of the
// week too (MON or Monday), in any case, as single values or ranges (a
// name takes no step of its own: `Mon-Fri/2`, not `Mon/2`); numeric days of the week count as the crate does, Sunday=1 ..
// Saturday=7. A time matches when every field matches: the day of the
// month AND the day of the week (the crate's rule, not Vixie cron's OR).
// The shorthands @yearly, @annually, @monthly, @weekly, @daily, @midnight
// and @hourly fire at second 0. Five-field (minute-first) expressions are
// refused: they read differently in the crate's format, and a silent
// shift of every field would be worse than an error. Times are UTC.

// Year bounds of the seventh field.
const (
	minYear = 1970
	maxYear = 2100
)

// Schedule is a parsed expression.
type Schedule struct {
	sec, min, hour, dom, month, dow uint64 // bit i set: value i matches
	years                           [3]uint64
	src                             string
}

// String is the expression as given.
func (s *Schedule) String() string { return s.src }

type field struct {
	name     string
	min, max int
	names    map[string]int
	any      bool // `?` allowed
}

var (
	monthNames = map[string]int{"jan": 1, "feb": 2, "mar": 3, "apr": 4, "may": 5, "jun": 6, "jul": 7, "aug": 8, "sep": 9, "oct": 10, "nov": 11, "dec": 12,
		"january": 1, "february": 2, "march": 3, "april": 4, "june": 6, "july": 7, "august": 8, "september": 9, "october": 10, "november": 11, "december": 12, "sept": 9}
	dayNames = map[string]int{"sun": 1, "mon": 2, "tue": 3, "wed": 4, "thu": 5, "fri": 6, "sat": 7,
		"sunday": 1, "monday": 2, "tuesday": 3, "wednesday": 4, "thursday": 5, "friday": 6, "saturday": 7, "tues": 3, "thurs": 5}
)

func fields() [7]field {
	return [7]field{
		{name: "seconds", min: 0, max: 59},
		{name: "minutes", min: 0, max: 59},
		{name: "hours", min: 0, max: 23},
		{name: "day of month", min: 1, max: 31, any: true},
		{name: "month", min: 1, max: 12, names: monthNames},
		{name: "day of week", min: 1, max: 7, names: dayNames, any: true},
		{name: "year", min: minYear, max: maxYear},
	}
}

var shorthands = map[string]string{
	"@yearly":   "0 0 0 1 1 *",
	"@annually": "0 0 0 1 1 *",
	"@monthly":  "0 0 0 1 * *",
	"@weekly":   "0 0 0 * * 1",
	"@daily":    "0 0 0 * * *",
	"@midnight": "0 0 0 * * *",
	"@hourly":   "0 0 * * * *",
}

// maxExprLen bounds what is parsed (a trigger's config is user input).
const maxExprLen = 1024

// Parse reads an expression (format above).
func Parse(expr string) (*Schedule, error) {
	src := expr
	if len(expr) > maxExprLen {
		return nil, fmt.Errorf("longer than %d bytes", maxExprLen)
	}
	expr = strings.TrimSpace(expr)
	if expr == "" {
		return nil, errors.New("empty expression")
	}
	if strings.HasPrefix(expr, "@") {
		full, ok := shorthands[strings.ToLower(expr)]
		if !ok {
			return nil, fmt.Errorf("unknown shorthand %q (one of @yearly, @annually, @monthly, @weekly, @daily, @midnight, @hourly)", expr)
		}
		expr = full
	}
	parts := strings.Fields(expr)
	switch {
	case len(parts) == 5:
		return nil, errors.New("5 fields: this format has 6 or 7, seconds first (sec min hour day-of-month month day-of-week [year]); put `0 ` before a minute-first expression")
	case len(parts) < 6 || len(parts) > 7:
		return nil, fmt.Errorf("%d fields: expected 6 or 7 (sec min hour day-of-month month day-of-week [year])", len(parts))
	}
	fs := fields()
	s := &Schedule{src: src}
	var sets [6]uint64
	for i := 0; i < 6; i++ {
		set, err := parseField(parts[i], fs[i], func(lo, hi, step int, set *uint64) {
			for v := lo; v <= hi; v += step {
				*set |= 1 << uint(v)
			}
		})
		if err != nil {
			return nil, err
		}
		sets[i] = set
	}
	s.sec, s.min, s.hour, s.dom, s.month, s.dow = sets[0], sets[1], sets[2], sets[3], sets[4], sets[5]
	year := "*"
	if len(parts) == 7 {
		year = parts[6]
	}
	if _, err := parseField(year, fs[6], func(lo, hi, step int, _ *uint64) {
		for v := lo; v <= hi; v += step {
			i := v - minYear
			s.years[i/64] |= 1 << uint(i%64)
		}
	}); err != nil {
		return nil, err
	}
	return s, nil
}

// parseField reads one field, calling add for each (lo, hi, step) it
// names; set is what add fills for fields that fit in 64 bits.
func parseField(text string, f field, add func(lo, hi, step int, set *uint64)) (uint64, error) {
	var set uint64
	for _, item := range strings.Split(text, ",") {
		lo, hi, step, err := parseItem(item, f)
		if err != nil {
			return 0, fmt.Errorf("%s field %q: %w", f.name, text, err)
		}
		add(lo, hi, step, &set)
	}
	return set, nil
}

func parseItem(item string, f field) (lo, hi, step int, err error) {
	if item == "" {
		return 0, 0, 0, errors.New("empty list item")
	}
	base, stepText, hasStep := strings.Cut(item, "/")
	step = 1
	if hasStep {
		n, err := strconv.Atoi(stepText)
		if err != nil || n <= 0 {
			return 0, 0, 0, fmt.Errorf("step %q is not a positive whole number", stepText)
		}
		// A step past the field's end is the start alone (the crate's).
		step = min(n, f.max-f.min+1)
	}
	switch {
	case base == "*":
		return f.min, f.max, step, nil
	case base == "?":
		if !f.any {
			return 0, 0, 0, errors.New("`?` is only for the day-of-month and day-of-week fields")
		}
		return f.min, f.max, step, nil
	case strings.Contains(base, "-"):
		a, b, _ := strings.Cut(base, "-")
		if lo, err = value(a, f); err != nil {
			return 0, 0, 0, err
		}
		if hi, err = value(b, f); err != nil {
			return 0, 0, 0, err
		}
		if isName(a) != isName(b) {
			return 0, 0, 0, fmt.Errorf("range %q mixes a number and a name", base)
		}
		if lo > hi {
			return 0, 0, 0, fmt.Errorf("range %q runs backwards", base)
		}
		return lo, hi, step, nil
	default:
		if lo, err = value(base, f); err != nil {
			return 0, 0, 0, err
		}
		if hasStep {
			if isName(base) {
				return 0, 0, 0, fmt.Errorf("a name takes no step (%q): use a range, e.g. Mon-Fri/2", item)
			}
			return lo, f.max, step, nil
		}
		return lo, lo, 1, nil
	}
}

func isName(s string) bool { return s != "" && (s[0] < '0' || s[0] > '9') }

func value(s string, f field) (int, error) {
	if s == "" {
		return 0, errors.New("missing value")
	}
	if s[0] >= '0' && s[0] <= '9' {
		n, err := strconv.Atoi(s)
		if err != nil || n < f.min || n > f.max {
			return 0, fmt.Errorf("%q is not in %d-%d", s, f.min, f.max)
		}
		return n, nil
	}
	if f.names != nil {
		if n, ok := f.names[strings.ToLower(s)]; ok {
			return n, nil
		}
	}
	if f.names == nil {
		return 0, fmt.Errorf("%q is not a number in %d-%d", s, f.min, f.max)
	}
	return 0, fmt.Errorf("%q is not a number in %d-%d or a name", s, f.min, f.max)
}

func (s *Schedule) yearOK(y int) bool {
	if y < minYear || y > maxYear {
		return false
	}
	i := y - minYear
	return s.years[i/64]&(1<<uint(i%64)) != 0
}

func has(set uint64, v int) bool { return set&(1<<uint(v)) != 0 }

// next is the smallest value ≥ v in set (ok false when none).
func next(set uint64, v int) (int, bool) {
	if v >= 64 {
		return 0, false
	}
	rest := set >> uint(v) << uint(v)
	if rest == 0 {
		return 0, false
	}
	return bits.TrailingZeros64(rest), true
}

// Next is the first time strictly after t (to the second, UTC) that the
// schedule matches; ok is false when there is none before 2100.
func (s *Schedule) Next(t time.Time) (time.Time, bool) {
	t = t.UTC().Truncate(time.Second).Add(time.Second)
	// Each step moves t forward to the start of the next candidate unit,
	// so the loop ends: at most one step per year, month, day, hour and
	// minute until 2100.
	for guard := 0; guard < 1_000_000; guard++ {
		y := t.Year()
		if y > maxYear {
			return time.Time{}, false
		}
		if !s.yearOK(y) {
			t = time.Date(y+1, 1, 1, 0, 0, 0, 0, time.UTC)
			continue
		}
		mo := int(t.Month())
		if !has(s.month, mo) {
			if n, ok := next(s.month, mo); ok {
				t = time.Date(y, time.Month(n), 1, 0, 0, 0, 0, time.UTC)
			} else {
				t = time.Date(y+1, 1, 1, 0, 0, 0, 0, time.UTC)
			}
			continue
		}
		if !has(s.dom, t.Day()) || !has(s.dow, int(t.Weekday())+1) {
			t = time.Date(y, t.Month(), t.Day()+1, 0, 0, 0, 0, time.UTC)
			continue
		}
		if n, ok := next(s.hour, t.Hour()); !ok {
			t = time.Date(y, t.Month(), t.Day()+1, 0, 0, 0, 0, time.UTC)
			continue
		} else if n != t.Hour() {
			t = time.Date(y, t.Month(), t.Day(), n, 0, 0, 0, time.UTC)
		}
		if n, ok := next(s.min, t.Minute()); !ok {
			t = time.Date(y, t.Month(), t.Day(), t.Hour()+1, 0, 0, 0, time.UTC)
			continue
		} else if n != t.Minute() {
			t = time.Date(y, t.Month(), t.Day(), t.Hour(), n, 0, 0, time.UTC)
		}
		if n, ok := next(s.sec, t.Second()); !ok {
			t = time.Date(y, t.Month(), t.Day(), t.Hour(), t.Minute()+1, 0, 0, time.UTC)
			continue
		} else {
			return time.Date(y, t.Month(), t.Day(), t.Hour(), t.Minute(), n, 0, time.UTC), true
		}
	}
	return time.Time{}, false
}
