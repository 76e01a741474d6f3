// Package tenancy holds acceptance tests of issue 20's items 2 and 6
// against a real `iii` process: a worker cannot squat on a sandbox
// adapter's names (so it neither receives what is sent to the adapter,
// such as a VM worker's engine credential, nor keeps the adapter from
// starting), and a principal other than the engine token's holder sees
// and acts only on the sandboxes it created (docs/security.md).
package tenancy
