// Package httpfunctions is the acceptance test of the iii-http-functions
// worker (docs/http-functions.md) as users meet it: the real `iii` binary
// runs an engine from a config.yaml, a worker written with the published
// Node SDK (iii-sdk) registers HTTP-invocation functions, and `iii call`
// calls them.
//
// It has no code of its own. It uses $III_BIN_DIR/iii when set (`make
// test` sets it to bin/), else it builds iii; without node or the SDK
// (make setup-test) its tests skip and say why.
package httpfunctions
