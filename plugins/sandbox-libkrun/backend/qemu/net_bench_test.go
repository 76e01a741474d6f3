package qemu

import (
	"context"
	"io"
	"net/http"
	"net/netip"
	"strings"
	"testing"
	"time"

	"gotest.tools/v3/assert"

	"github.com/iii-sandbox/iii/internal/testkit/netns"
	"github.com/iii-sandbox/iii/plugins/sandbox-libkrun/agentclient"
	"github.com/iii-sandbox/iii/plugins/sandbox-libkrun/agentproto"
	"github.com/iii-sandbox/iii/plugins/sandbox-libkrun/usernet"
)

// BenchmarkGuestNetwork compares the guest's network through usernet (the
// runner's stack, what VMs get) with QEMU's own user network (slirp, what
// they had), guest → an HTTP server on a test host in a network namespace,
// under the same VM (TCG on the build machines):
//
//   - download: busybox wget of 16 MiB (b.SetBytes: MB/s);
//   - connect: one busybox wget of a 2-byte object per iteration, i.e. a
//     process start, a TCP connect, a request and a close (ns/op).
//
// go test -run '^$' -bench BenchmarkGuestNetwork ./plugins/sandbox-libkrun/backend/qemu/
func BenchmarkGuestNetwork(b *testing.B) {
	k := needVM(b)
	host := netns.Start(b)
	ln, _ := host.Listen(b, "tcp", 0)
	const size = 16 << 20
	blob := strings.Repeat("x", size)
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/big" {
			_, _ = io.WriteString(w, blob)
			return
		}
		_, _ = io.WriteString(w, "ok")
	})}
	go func() { _ = srv.Serve(ln) }()
	b.Cleanup(func() { _ = srv.Close() })
	base := "http://" + ln.Addr().String()

	for _, stack := range []string{"usernet", "slirp"} {
		b.Run(stack, func(b *testing.B) {
			cfg := Config{RootDisk: k.rootImg, MemoryMiB: 256}
			if stack == "usernet" {
				cfg.Network = true
				cfg.NetSocket = serveNetwork(b, usernet.Config{DNSServers: []netip.AddrPort{netip.MustParseAddrPort("127.0.0.1:1")}})
			} else {
				cfg.extraArgs = []string{"-netdev", "user,id=net0", "-device", "virtio-net-device,netdev=net0"}
			}
			vm := boot(b, k, cfg)
			if cfg.NetSocket != nil {
				_ = cfg.NetSocket.Close()
			}
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			_, err := vm.client.ConfigureNetwork(ctx, agentproto.NetRequest{})
			assert.NilError(b, err)
			wget := func(url string) {
				out := run(b, vm.client, agentclient.ExecRequest{Argv: []string{"wget", "-q", "-O", "/dev/null", url}})
				assert.Equal(b, out.ExitCode, 0, "%s", out.Stderr)
			}
			wget(base + "/small") // ARP, first connection
			b.Run("download", func(b *testing.B) {
				b.SetBytes(size)
				for b.Loop() {
					wget(base + "/big")
				}
			})
			b.Run("connect", func(b *testing.B) {
				for b.Loop() {
					wget(base + "/small")
				}
			})
		})
	}
}
