// Command cron is the registry's `cron` worker (workers/cron): Compose
// installs it from the `cron` package and starts it with the environment
// workers/workerkit reads.
package main

import (
	"os"

	"github.com/iii-sandbox/iii/workers/cron"
	"github.com/iii-sandbox/iii/workers/workerkit"
)

func main() {
	os.Exit(workerkit.Main(cron.Spec(), cron.Run))
}
