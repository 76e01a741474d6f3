// Package server boots an engine from config.yaml and keeps it in step with
// the file.
package server

import (
	"context"
	"errors"
	"io"

	"github.com/hashicorp/go-hclog"
)

// Options configure Run.
type Options struct {
	ConfigPath  string    // default "config.yaml"
	Interactive bool      // true when stdin is a terminal: ask before creating a missing file
	Stdin       io.Reader // answers to the creation prompt
	Stderr      io.Writer // the reason the engine stopped, for humans
	Logger      hclog.Logger
	Version     string
}

// Run serves until ctx ends (clean stop, nil error) or the configuration
// becomes invalid (the error says why).
func Run(ctx context.Context, opts Options) error {
	// Placeholder until host/server lands (being written now); replaced, not shipped.
	return errors.New("engine assembly not built yet")
}
