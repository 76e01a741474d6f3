//go:build !linux

package hostdir

import "github.com/hashicorp/go-hclog"

// killStragglers has no portable way to find processes by working
// directory outside Linux; stopping relies on the execs' process groups.
func killStragglers(string, hclog.Logger) {}
