// Command fsio measures sandbox file throughput through streaming
// channels, beside its floor measured in the same run:
//
//   - fs::write: a caller streams a file into a channel it passes as
//     sandbox::fs::write's content; the bytes go caller → engine (channel)
//     → plugin host → adapter (gRPC) → guest agent (virtio-serial) → the
//     sandbox's tmpfs. Timed from the call to its reply.
//   - fs::read: sandbox::fs::read answers with a channel the adapter fills
//     from the guest; timed from the call to the last byte read.
//   - the floor: the same bytes over one raw WebSocket on loopback with the
//     same library (github.com/coder/websocket) and the same 64 KiB frames,
//     client to server (write) and server to client (read), each side
//     hashing what it receives as the caller does.
//   - the VM's own ceiling, for reading the figures: the guest agent's
//     write and read of the same file over its port, from a QEMU VM booted
//     directly with the adapter's kernel, initramfs, image and accelerator
//     (no engine, no plugin, no runner). What the figure loses beyond it
//     is the engine's, the plugin host's and the adapter's share.
//
// The engine is assembled from a config.yaml by host/server (a real
// WebSocket listener), the adapter is the sandbox-libkrun plugin built from
// this tree, the sandbox boots the python preset (run
// scripts/build-images.sh first). From the repository root:
//
//	go run ./scripts/bench/fsio [-size-mib 100] [-runs 3]
package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"strings"
	"time"

	"github.com/coder/websocket"
	"github.com/hashicorp/go-hclog"

	"github.com/iii-sandbox/iii/client"
	"github.com/iii-sandbox/iii/host/server"
	"github.com/iii-sandbox/iii/internal/testkit/benchstat"
	"github.com/iii-sandbox/iii/internal/testkit/bins"
	"github.com/iii-sandbox/iii/internal/testkit/dirs"
	"github.com/iii-sandbox/iii/plugins/sandbox-libkrun/adapter"
	"github.com/iii-sandbox/iii/plugins/sandbox-libkrun/agentclient"
	"github.com/iii-sandbox/iii/plugins/sandbox-libkrun/agentproto"
	"github.com/iii-sandbox/iii/plugins/sandbox-libkrun/backend"
	"github.com/iii-sandbox/iii/plugins/sandbox-libkrun/backend/qemu"
	"github.com/iii-sandbox/iii/plugins/sandbox-libkrun/images"
	"github.com/iii-sandbox/iii/protocol"
)

func main() {
	sizeMiB := flag.Int("size-mib", 100, "file size in MiB")
	runs := flag.Int("runs", 3, "transfers per direction and path; the median is printed")
	cpuprofile := flag.String("cpuprofile", "", "write a CPU profile of this process (the engine and the caller) during the transfers here")
	flag.Parse()
	if err := run(*sizeMiB, *runs, *cpuprofile); err != nil {
		fmt.Fprintln(os.Stderr, "fsio bench:", err)
		os.Exit(1)
	}
}

// callTimeout bounds one call: the first create installs the image and
// chooses the back end.
const callTimeout = 5 * time.Minute

func run(sizeMiB, runs int, cpuprofile string) error {
	if sizeMiB < 1 || runs < 1 {
		return errors.New("-size-mib and -runs must be at least 1")
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
	defer cancel()
	data := make([]byte, sizeMiB<<20)
	_, _ = rand.NewChaCha8([32]byte{'f', 's', 'i', 'o'}).Read(data)
	want := sha256.Sum256(data)

	work, err := os.MkdirTemp("/tmp", "fsio")
	if err != nil {
		return err
	}
	defer os.RemoveAll(work)
	bin, err := bins.SandboxLibkrun(".", filepath.Join(work, "bin"), adapter.AgentName(runtime.GOARCH))
	if err != nil {
		return err
	}
	root, err := images.DefaultRoot()
	if err != nil {
		return err
	}
	// The adapter's cache reads the presets from the local OCI layout.
	cache := filepath.Join(work, "cache")
	if err := dirs.ImageCache(cache, filepath.Join(root, "oci")); err != nil {
		return err
	}

	eng, err := startEngine(ctx, work)
	if err != nil {
		return err
	}
	defer eng.close()
	c := eng.cl
	// No snapshot templates: the first create would also boot a second VM
	// to record one, whose boot competes with the first transfers and whose
	// CPU time (counted, then gone when it exits) lands on whichever
	// transfer is running. The sandbox VM is then booted exactly as the
	// direct one is; the transfer path does not involve templates.
	if _, err := c.Call(ctx, "engine::adapters::start", map[string]any{"adapter": "sandbox-libkrun", "namespace": "default", "path": bin,
		"config": map[string]any{"image_allowlist": []string{"python"}, "state_dir": filepath.Join(work, "s"), "cache_dir": cache, "snapshot_templates": false}}); err != nil {
		return fmt.Errorf("start the adapter: %w", err)
	}
	raw, err := c.Call(ctx, "sandbox::create", map[string]any{"image": "python"}, client.WithTimeout(callTimeout))
	if err != nil {
		return fmt.Errorf("sandbox::create: %w", err)
	}
	var created struct {
		SandboxID string `json:"sandbox_id"`
	}
	if err := json.Unmarshal(raw, &created); err != nil {
		return err
	}
	defer func() {
		_, _ = c.Call(context.Background(), "sandbox::stop", map[string]any{"sandbox_id": created.SandboxID, "wait": true})
	}()

	floor := startFloor()
	defer floor.Close()

	raw, err = c.Call(ctx, "sandbox-libkrun::adapter::info", nil)
	if err != nil {
		return err
	}
	var info struct {
		Hypervisor string `json:"hypervisor"`
		Accel      string `json:"accel"`
		Kernel     string `json:"kernel"`
		KernelBoot string `json:"kernel_boot_image"`
		Initramfs  string `json:"initramfs"`
	}
	if err := json.Unmarshal(raw, &info); err != nil {
		return err
	}
	if info.Hypervisor != "qemu" {
		return fmt.Errorf("the adapter chose %q; this harness boots its direct VM with QEMU", info.Hypervisor)
	}
	img, err := filepath.Glob(filepath.Join(cache, "images", "sha256", "*", "rootfs.erofs"))
	if err != nil || len(img) != 1 {
		return fmt.Errorf("want one installed image under %s, found %v", cache, img)
	}
	if info.KernelBoot != "" {
		// The file the adapter's VMs really boot.
		info.Kernel = info.KernelBoot
	}
	vm, agent, err := bootDirect(ctx, work, info.Kernel, info.Initramfs, img[0], info.Accel)
	if err != nil {
		return fmt.Errorf("boot the direct VM: %w", err)
	}
	defer vm.Kill()
	defer agent.Close()

	// Interleaved, so a change in the machine's load hits a figure and its
	// floor alike.
	var w, r, fw, fr, gw, gr []time.Duration
	cpuW, cpuR, cpuGW, cpuGR := cpuSample{}, cpuSample{}, cpuSample{}, cpuSample{}
	if cpuprofile != "" {
		f, err := os.Create(cpuprofile)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	for i := range runs {
		before := cpuTimes()
		d, err := fsWrite(ctx, c, created.SandboxID, data)
		if err != nil {
			return fmt.Errorf("fs::write run %d: %w", i+1, err)
		}
		w = append(w, d)
		mid := cpuTimes()
		cpuW.add(mid.sub(before))
		d, err = fsRead(ctx, c, created.SandboxID, int64(len(data)), want)
		if err != nil {
			return fmt.Errorf("fs::read run %d: %w", i+1, err)
		}
		r = append(r, d)
		cpuR.add(cpuTimes().sub(mid))
		if d, err = floorWrite(ctx, floor.URL, data, want); err != nil {
			return fmt.Errorf("floor write: %w", err)
		}
		fw = append(fw, d)
		if d, err = floorRead(ctx, floor.URL, int64(len(data)), want); err != nil {
			return fmt.Errorf("floor read: %w", err)
		}
		fr = append(fr, d)
		dw, dr, err := direct(ctx, agent, data, want, cpuGW, cpuGR)
		if err != nil {
			return fmt.Errorf("guest agent direct: %w", err)
		}
		gw, gr = append(gw, dw), append(gr, dr)
	}
	pprof.StopCPUProfile()

	fmt.Printf("host: %s/%s, %d CPUs, load average %s; VM: %s with %s, 512 MiB; %d MiB file, median of %d runs\n",
		runtime.GOOS, runtime.GOARCH, runtime.NumCPU(), benchstat.LoadAvg(), info.Hypervisor, info.Accel, sizeMiB, runs)
	n := len(data)
	row("fs::write through a channel", n, benchstat.Median(w), "raw WebSocket client → server", benchstat.Median(fw))
	row("fs::read through a channel", n, benchstat.Median(r), "raw WebSocket server → client", benchstat.Median(fr))
	fmt.Println("  the VM's own ceiling (guest agent over its port, no engine or plugin):")
	row("  fs::write through a channel", n, benchstat.Median(w), "agent write, direct", benchstat.Median(gw))
	row("  fs::read through a channel", n, benchstat.Median(r), "agent read, direct", benchstat.Median(gr))
	// Both VMs idle along during the other's transfers, so each line
	// includes the other QEMU's idle ticks.
	fmt.Printf("  CPU per transfer (all %d runs / %d), by process:\n", runs, runs)
	for _, l := range []struct {
		what string
		s    cpuSample
	}{{"fs::write", cpuW}, {"fs::read", cpuR}, {"agent write, direct", cpuGW}, {"agent read, direct", cpuGR}} {
		per := cpuSample{}
		for k, v := range l.s {
			per[k] = v / time.Duration(runs)
		}
		fmt.Printf("    %-20s %s\n", l.what, per)
	}
	return nil
}

func row(what string, n int, d time.Duration, floorWhat string, floor time.Duration) {
	fmt.Printf("  %-30s %8.1f MB/s (%6.0f ms) | floor: %-30s %8.1f MB/s (%6.0f ms) | floor/figure %.2fx\n",
		what, mbs(n, d), ms(d), floorWhat, mbs(n, floor), ms(floor), mbs(n, floor)/mbs(n, d))
}

func mbs(n int, d time.Duration) float64 { return float64(n) / 1e6 / d.Seconds() }

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1e3 }

// fsPath is where the file goes in the sandbox: its tmpfs upper layer.
const fsPath = "/root/fsio.bin"

// fsWrite streams data into sandbox::fs::write through a channel.
func fsWrite(ctx context.Context, c *client.Client, id string, data []byte) (time.Duration, error) {
	// The channel is part of the transfer, as the floor's dial is.
	start := time.Now()
	wref, rref, err := c.CreateChannel(ctx, 0)
	if err != nil {
		return 0, err
	}
	w, err := c.OpenChannelWriter(ctx, wref)
	if err != nil {
		return 0, err
	}
	wrote := make(chan error, 1)
	go func() {
		if _, err := w.Write(data); err != nil {
			wrote <- err
			return
		}
		wrote <- w.Close()
	}()
	raw, err := c.Call(ctx, "sandbox::fs::write", map[string]any{"sandbox_id": id, "path": fsPath, "content": rref}, client.WithTimeout(callTimeout))
	d := time.Since(start)
	if err != nil {
		_ = w.Close()
		<-wrote
		return 0, err
	}
	if err := <-wrote; err != nil {
		return 0, err
	}
	var res struct {
		BytesWritten int64 `json:"bytes_written"`
	}
	if err := json.Unmarshal(raw, &res); err != nil {
		return 0, err
	}
	if res.BytesWritten != int64(len(data)) {
		return 0, fmt.Errorf("wrote %d bytes, want %d", res.BytesWritten, len(data))
	}
	return d, nil
}

// fsRead reads the file back through sandbox::fs::read's channel and
// checks it.
func fsRead(ctx context.Context, c *client.Client, id string, size int64, want [32]byte) (time.Duration, error) {
	start := time.Now()
	raw, err := c.Call(ctx, "sandbox::fs::read", map[string]any{"sandbox_id": id, "path": fsPath}, client.WithTimeout(callTimeout))
	if err != nil {
		return 0, err
	}
	var res struct {
		Content protocol.StreamChannelRef `json:"content"`
	}
	if err := json.Unmarshal(raw, &res); err != nil {
		return 0, err
	}
	r, err := c.OpenChannelReader(ctx, res.Content)
	if err != nil {
		return 0, err
	}
	defer r.Close()
	h := sha256.New()
	n, err := io.Copy(h, r)
	d := time.Since(start)
	if err != nil {
		return 0, err
	}
	if n != size || !bytes.Equal(h.Sum(nil), want[:]) {
		return 0, fmt.Errorf("read %d bytes with another digest, want %d bytes", n, size)
	}
	return d, nil
}

// startFloor serves the floor's two transfers on loopback: /sink reads
// binary frames until the client's text frame and answers with the count,
// /source sends the bytes it is asked for in 64 KiB frames and closes.
func startFloor() *httptest.Server {
	mux := http.NewServeMux()
	mux.HandleFunc("/sink", func(w http.ResponseWriter, r *http.Request) {
		conn, err := websocket.Accept(w, r, nil)
		if err != nil {
			return
		}
		defer conn.CloseNow()
		conn.SetReadLimit(1 << 20)
		h := sha256.New()
		var n int64
		for {
			typ, rd, err := conn.Reader(r.Context())
			if err != nil {
				return
			}
			if typ == websocket.MessageText {
				break
			}
			k, err := io.Copy(h, rd)
			if err != nil {
				return
			}
			n += k
		}
		_ = conn.Write(r.Context(), websocket.MessageText, fmt.Appendf(nil, "%d %x", n, h.Sum(nil)))
		_ = conn.Close(websocket.StatusNormalClosure, "")
	})
	mux.HandleFunc("/source", func(w http.ResponseWriter, r *http.Request) {
		conn, err := websocket.Accept(w, r, nil)
		if err != nil {
			return
		}
		defer conn.CloseNow()
		var size int
		if _, err := fmt.Sscan(r.URL.Query().Get("size"), &size); err != nil || size < 0 {
			_ = conn.Close(websocket.StatusPolicyViolation, "size")
			return
		}
		buf := make([]byte, size)
		_, _ = rand.NewChaCha8([32]byte{'f', 's', 'i', 'o'}).Read(buf)
		// Wait for the client's go, so making the bytes is not timed.
		if _, _, err := conn.Read(r.Context()); err != nil {
			return
		}
		for p := buf; len(p) > 0; {
			k := min(len(p), client.ChannelChunkSize)
			if err := conn.Write(r.Context(), websocket.MessageBinary, p[:k]); err != nil {
				return
			}
			p = p[k:]
		}
		_ = conn.Close(websocket.StatusNormalClosure, "")
	})
	return httptest.NewServer(mux)
}

func wsURL(base, path string) string { return "ws" + strings.TrimPrefix(base, "http") + path }

// floorWrite sends data to /sink in the frames a ChannelWriter uses and
// waits for the server's count.
func floorWrite(ctx context.Context, base string, data []byte, want [32]byte) (time.Duration, error) {
	start := time.Now()
	conn, _, err := websocket.Dial(ctx, wsURL(base, "/sink"), nil)
	if err != nil {
		return 0, err
	}
	defer conn.CloseNow()
	for p := data; len(p) > 0; {
		k := min(len(p), client.ChannelChunkSize)
		if err := conn.Write(ctx, websocket.MessageBinary, p[:k]); err != nil {
			return 0, err
		}
		p = p[k:]
	}
	if err := conn.Write(ctx, websocket.MessageText, []byte("end")); err != nil {
		return 0, err
	}
	_, ack, err := conn.Read(ctx)
	d := time.Since(start)
	if err != nil {
		return 0, err
	}
	if string(ack) != fmt.Sprintf("%d %x", len(data), want) {
		return 0, fmt.Errorf("the sink got %s", ack)
	}
	return d, nil
}

// floorRead receives size bytes from /source and checks them.
func floorRead(ctx context.Context, base string, size int64, want [32]byte) (time.Duration, error) {
	conn, _, err := websocket.Dial(ctx, wsURL(base, fmt.Sprintf("/source?size=%d", size)), nil)
	if err != nil {
		return 0, err
	}
	defer conn.CloseNow()
	conn.SetReadLimit(1 << 20)
	start := time.Now()
	if err := conn.Write(ctx, websocket.MessageText, []byte("go")); err != nil {
		return 0, err
	}
	h := sha256.New()
	var n int64
	for {
		_, rd, err := conn.Reader(ctx)
		if websocket.CloseStatus(err) == websocket.StatusNormalClosure {
			break
		}
		if err != nil {
			return 0, err
		}
		k, err := io.Copy(h, rd)
		if err != nil {
			return 0, err
		}
		n += k
	}
	d := time.Since(start)
	if n != size || !bytes.Equal(h.Sum(nil), want[:]) {
		return 0, fmt.Errorf("read %d bytes with another digest, want %d", n, size)
	}
	return d, nil
}

// bootDirect boots a QEMU VM the way a runner does (same kernel,
// initramfs, root image, accelerator and size as the adapter's sandboxes)
// but from this process, and connects to its guest agent.
func bootDirect(ctx context.Context, work, kernel, initrd, img, accel string) (*qemu.VM, *agentclient.Client, error) {
	dir, err := os.MkdirTemp(work, "raw")
	if err != nil {
		return nil, nil, err
	}
	cfg := qemu.ConfigFor(backend.Spec{ID: "fsio-direct", CPUs: 1, MemoryMiB: 512, Kernel: kernel, Initrd: initrd,
		RootDisk: img, RootFSType: "erofs", StateDir: dir, Accel: accel})
	vm, err := qemu.Launch(ctx, cfg)
	if err != nil {
		return nil, nil, err
	}
	cctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	c, err := vm.Connect(cctx, agentclient.Options{})
	if err != nil {
		_ = vm.Kill()
		return nil, nil, err
	}
	return vm, c, nil
}

// direct writes data into the VM and reads it back through the agent.
func direct(ctx context.Context, c *agentclient.Client, data []byte, want [32]byte, cpuW, cpuR cpuSample) (w, r time.Duration, err error) {
	before := cpuTimes()
	start := time.Now()
	res, err := c.WriteFile(ctx, &agentproto.FSRequest{Path: fsPath}, bytes.NewReader(data))
	if err != nil {
		return 0, 0, err
	}
	w = time.Since(start)
	mid := cpuTimes()
	cpuW.add(mid.sub(before))
	if res.BytesWritten != int64(len(data)) {
		return 0, 0, fmt.Errorf("wrote %d bytes, want %d", res.BytesWritten, len(data))
	}
	start = time.Now()
	h := sha256.New()
	_, n, err := c.ReadFileTo(ctx, fsPath, h)
	if err != nil {
		return 0, 0, err
	}
	r = time.Since(start)
	cpuR.add(cpuTimes().sub(mid))
	if n != int64(len(data)) || !bytes.Equal(h.Sum(nil), want[:]) {
		return 0, 0, fmt.Errorf("read %d bytes with another digest, want %d", n, len(data))
	}
	return w, r, nil
}

// engine is an engine assembled from a config.yaml whose sandbox: section
// binds sandbox-libkrun, and a client connected to it.
type engine struct {
	cl     *client.Client
	cancel context.CancelFunc
	served chan error
}

func startEngine(ctx context.Context, dir string) (*engine, error) {
	path := filepath.Join(dir, "config.yaml")
	cfg := "workers:\n  - name: iii-worker-manager\n    config: { host: 127.0.0.1, port: 0 }\n" +
		"  - name: configuration\n    config: { adapter: { name: fs, config: { directory: " + filepath.Join(dir, "config") + " } } }\n" +
		"sandbox:\n  adapter: sandbox-libkrun\n  namespace: default\n"
	if err := os.WriteFile(path, []byte(cfg), 0o644); err != nil {
		return nil, err
	}
	sctx, cancel := context.WithCancel(ctx)
	srv, err := server.Start(sctx, server.Options{ConfigPath: path, Logger: hclog.New(&hclog.LoggerOptions{Output: os.Stderr, Level: hclog.Warn})})
	if err != nil {
		cancel()
		return nil, err
	}
	e := &engine{cancel: cancel, served: make(chan error, 1)}
	go func() { e.served <- srv.Serve(sctx) }()
	url := "ws://" + srv.Addrs()["iii-worker-manager"]
	// The same user's engine token: the bench starts the adapter
	// (engine::adapters::start is privileged).
	token, err := client.DiscoverToken(url)
	if err != nil {
		e.close()
		return nil, err
	}
	e.cl, err = client.Dial(ctx, url, client.Options{Name: "fsio-bench", IgnoreEnv: true, Token: token,
		Reconnect: client.ReconnectPolicy{Disable: true}})
	if err != nil {
		e.close()
		return nil, err
	}
	return e, nil
}

func (e *engine) close() {
	if e.cl != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_ = e.cl.Close(ctx)
		cancel()
	}
	e.cancel()
	if err := <-e.served; err != nil {
		fmt.Fprintln(os.Stderr, "engine:", err)
	}
}
