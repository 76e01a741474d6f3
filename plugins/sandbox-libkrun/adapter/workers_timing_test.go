package adapter

import (
	"testing"
	"time"

	"gotest.tools/v3/assert"
)

func TestFormatTimings(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   []StepTiming
		want string
	}{
		{name: "none", in: nil, want: "none ran"},
		{name: "milliseconds below a second", in: []StepTiming{{"select-backend", 1234567 * time.Nanosecond}}, want: "select-backend 1ms"},
		{name: "tenths above a second, in order", in: []StepTiming{
			{"resolve-image", 14237 * time.Millisecond}, {"install", 999600 * time.Microsecond}, {"start-worker", 2 * time.Second},
		}, want: "resolve-image 14.2s, install 1s, start-worker 2s"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, formatTimings(tc.in), tc.want)
		})
	}
}
