package client

import (
	"math"
	"math/rand/v2"
	"time"
)

// delay is the wait before reconnect attempt number attempt (0-based):
// Initial·Multiplier^attempt capped at Max, then spread by ±Jitter. r is a
// uniform number in [0,1); it is a parameter so tests can pin it.
func (p ReconnectPolicy) delay(attempt int, r float64) time.Duration {
	d := float64(p.Initial) * math.Pow(p.Multiplier, float64(attempt))
	if d > float64(p.Max) || math.IsInf(d, 0) || math.IsNaN(d) {
		d = float64(p.Max)
	}
	d *= 1 + p.Jitter*(2*r-1)
	if d < 0 {
		d = 0
	}
	return time.Duration(d)
}

// nextDelay draws the jitter from the runtime's random source.
func (p ReconnectPolicy) nextDelay(attempt int) time.Duration {
	return p.delay(attempt, rand.Float64())
}

// exhausted reports whether attempt failures used up the policy.
func (p ReconnectPolicy) exhausted(failures int) bool {
	return p.Disable || (p.MaxAttempts > 0 && failures >= p.MaxAttempts)
}
