// Command pubsub is the registry's deprecated `pubsub` worker
// (workers/pubsub): Compose installs it from the `pubsub` package and
// starts it with the environment workers/workerkit reads.
package main

import (
	"os"

	"github.com/iii-sandbox/iii/workers/pubsub"
	"github.com/iii-sandbox/iii/workers/workerkit"
)

func main() {
	os.Exit(workerkit.Main(pubsub.Spec(), pubsub.Run))
}
