package workervm

import (
	"testing"
	"time"

	"gotest.tools/v3/assert"

	"github.com/iii-sandbox/iii/plugins/sandbox-libkrun/boot"
)

func TestFormatTimings(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   []boot.StepTiming
		want string
	}{
		{name: "none", in: nil, want: "none ran"},
		{name: "milliseconds below a second", in: []boot.StepTiming{{Step: "select-backend", Duration: 1234567 * time.Nanosecond}}, want: "select-backend 1ms"},
		{name: "tenths above a second, in order", in: []boot.StepTiming{
			{Step: "resolve-image", Duration: 14237 * time.Millisecond}, {Step: "install", Duration: 999600 * time.Microsecond}, {Step: "start-worker", Duration: 2 * time.Second},
		}, want: "resolve-image 14.2s, install 1s, start-worker 2s"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, formatTimings(tc.in), tc.want)
		})
	}
}
