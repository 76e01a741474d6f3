// Package testkit is the root of small helper packages shared by this
// repository's tests and benchmark harnesses (scripts/bench). Each
// subpackage does one job:
//
//   - bins: build the repository's binaries once per test binary (and the
//     VM adapter with its guest agent, for tests and benchmarks);
//   - enginetest: a real engine on a loopback WebSocket with a Go client;
//   - adapterproc: start an adapter binary as a go-plugin subprocess, the
//     way the engine's plugin host does;
//   - nodesdk: find node and the pinned iii-sdk, run Node SDK scripts (with
//     the shared driver.mjs), and pack the SDK into VM worker directories
//     with the one unpack.mjs;
//   - procscan: list live processes by what their command line names;
//   - syncbuf: a buffer that subprocess and logger goroutines write while
//     the test reads it;
//   - dirs: short temporary directories (unix socket paths), image caches
//     on the local OCI layout, and listings;
//   - benchstat: medians, percentiles and the load average for benchmark
//     reports;
//   - netns: a test host in a network namespace (Linux, root), the one
//     address besides loopback that tests send packets to;
//   - tcpserve: the accept loop of a test's small TCP servers (echo,
//     scripted upstreams), closed and waited for at clean-up;
//   - flood: a hostile worker's floods against a real engine process, for
//     tests/flood and scripts/bench/flood.
//   - composeproj: a Compose project run by a real `iii compose --up` in
//     private directories (status, `iii call`, logs, clean stop), and the
//     build of iii with registry workers published beside it;
//   - waitfor: bounded waits (channel receive, close, WaitGroup, a blocking
//     call) that fail the test naming what they waited for instead of
//     hanging until the package timeout.
//
// Nothing here is product code: no package outside tests, scripts/bench and
// plugins/sdk/sdktest imports these.
package testkit
