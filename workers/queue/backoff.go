package queue

import "time"

// Backoff is the wait before the next attempt after attempt failed
// attempts (attempt ≥ 1): base × 2^(attempt-1), upstream's, capped at a
// day.
func Backoff(baseMS int64, attempt int) time.Duration {
	if baseMS <= 0 || attempt < 1 {
		return 0
	}
	ms := baseMS
	for i := 1; i < attempt; i++ {
		if ms >= maxBackoffMS/2 {
			ms = maxBackoffMS
			break
		}
		ms *= 2
	}
	return time.Duration(min(ms, maxBackoffMS)) * time.Millisecond
}
