// Command state is the registry's `state` worker (workers/state): Compose
// installs it from the `state` package and starts it with the environment
// workers/workerkit reads.
package main

import (
	"os"

	"github.com/iii-sandbox/iii/workers/state"
	"github.com/iii-sandbox/iii/workers/workerkit"
)

func main() {
	os.Exit(workerkit.Main(state.Spec(), state.Run))
}
