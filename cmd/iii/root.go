package main

import (
	"strings"

	"github.com/hashicorp/go-hclog"
	"github.com/spf13/cobra"

	"github.com/iii-sandbox/iii/compose/daemon"
	"github.com/iii-sandbox/iii/host/server"
	"github.com/iii-sandbox/iii/host/stream"
	"github.com/iii-sandbox/iii/internal/version"
)

// envLogLevel sets the engine's log level (trace, debug, info, warn, error).
const envLogLevel = "III_LOG_LEVEL"

func newRootCmd(e env) *cobra.Command {
	var (
		configPath    string
		noUpdateCheck bool
	)
	root := &cobra.Command{
		Use:   "iii",
		Short: "Run the iii engine, or talk to a running one",
		Long: `iii with no command runs the engine from config.yaml (or the file given with -c).
The engine serves workers on the WebSocket port of its iii-worker-manager (49134 by default)
and stops on SIGINT or SIGTERM.`,
		Version:       version.Version,
		SilenceErrors: true,
		SilenceUsage:  true,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) > 0 {
				return usageErrorf(cmd, "unknown command %q for %q", args[0], cmd.CommandPath())
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, _ []string) error {
			// There is no background update check in this build; the flag
			// is accepted so scripts written for upstream iii keep working.
			_ = noUpdateCheck
			return runEngine(cmd, e, configPath)
		},
	}
	root.SetVersionTemplate("{{.Version}}\n")
	root.SetIn(e.stdin)
	root.SetOut(e.stdout)
	root.SetErr(e.stderr)
	root.SetFlagErrorFunc(func(cmd *cobra.Command, err error) error {
		return &usageError{err: err, hint: cmd.CommandPath()}
	})
	root.Flags().StringVarP(&configPath, "config", "c", "config.yaml", "engine configuration file")
	root.Flags().BoolVar(&noUpdateCheck, "no-update-check", false, "turn off update checks (this build never checks)")

	root.AddCommand(newCallCmd(e, root.HelpFunc()))
	root.AddCommand(newComposeCmd(e), newReaperCmd(e))
	root.AddCommand(newUpdateCmd(e))
	return root
}

// runEngine runs the engine until SIGINT/SIGTERM (a clean stop) or until
// its configuration becomes invalid.
func runEngine(cmd *cobra.Command, e env, configPath string) error {
	level := hclog.LevelFromString(strings.TrimSpace(e.getenv(envLogLevel)))
	if level == hclog.NoLevel {
		level = hclog.Info
	}
	logger := hclog.New(&hclog.LoggerOptions{Name: "iii", Output: e.stderr, Level: level})
	stream.RouteRedisLogs(logger)
	// An engine `iii compose --up` started has a lifeline to it; Compose
	// then starts the adapter it binds, with its layered configuration.
	byCompose := e.getenv(daemon.EnvEngineLifeline) != ""
	ctx, release := engineLifeline(cmd.Context(), e, logger)
	defer release()
	err := server.Run(ctx, server.Options{
		ConfigPath:       configPath,
		Interactive:      e.interactive,
		Stdin:            e.stdin,
		Stderr:           e.stderr,
		Logger:           logger,
		Version:          version.Version,
		AdapterByCompose: byCompose,
	})
	if err != nil {
		return &exitError{code: exitFailure, msg: err.Error()}
	}
	return nil
}
