// Package keeper is a long-running Python process for tests of sandboxes
// that must keep their processes (pause and resume, adoption by a new
// adapter): it holds a random secret and a counter in memory, so a test
// can tell the same process from a restarted one.
package keeper

// Script is the keeper, to be written into a sandbox and started detached
// (`nohup python3 <path> >/dev/null 2>&1 &`). Whenever /tmp/ask appears it
// writes "<secret> <counter> <pid>" to /tmp/answer.
const Script = `import os, time
secret = os.urandom(8).hex()
n = 0
while True:
    n += 1
    if os.path.exists("/tmp/ask"):
        os.remove("/tmp/ask")
        with open("/tmp/answer.tmp", "w") as f:
            f.write("%s %d %d" % (secret, n, os.getpid()))
        os.rename("/tmp/answer.tmp", "/tmp/answer")
    time.sleep(0.02)
`

// Ask is the shell script that asks the keeper and prints its answer
// (waiting up to 30 s).
const Ask = `rm -f /tmp/answer; touch /tmp/ask; i=0; while [ ! -f /tmp/answer ] && [ $i -lt 1500 ]; do sleep 0.02; i=$((i+1)); done; cat /tmp/answer`
