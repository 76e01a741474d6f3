// Command http is the registry's `http` worker (workers/http): Compose
// installs it from the `http` package and starts it with the environment
// workers/workerkit reads.
package main

import (
	"os"

	httpworker "github.com/iii-sandbox/iii/workers/http"
	"github.com/iii-sandbox/iii/workers/workerkit"
)

func main() {
	os.Exit(workerkit.Main(httpworker.Spec(), httpworker.Run))
}
