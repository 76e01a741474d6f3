// Command queue is the registry's `queue` worker (workers/queue): Compose
// installs it from the `queue` package and starts it with the environment
// workers/workerkit reads (and, for this package only, the provider
// credential in III_QUEUE_PROVIDER_TOKEN).
package main

import (
	"os"

	"github.com/iii-sandbox/iii/workers/queue"
	"github.com/iii-sandbox/iii/workers/workerkit"
)

func main() {
	os.Exit(workerkit.Main(queue.Spec(), queue.Run))
}
