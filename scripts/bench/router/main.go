// Command router measures P2: what the iii-sandbox router and the plugin
// hop add to a sandbox call, beside the floor of a raw gRPC unary call over
// a unix socket, all in the same run on the same machine.
//
//	A  caller → engine → router (sandbox::catalog::list) → plugin host → gRPC (AutoMTLS) → adapter
//	B  caller → engine → plugin host (<adapter>::catalog::list) → gRPC → adapter
//	E  caller → engine → an in-process function answering the same JSON (the engine's own cost)
//	F  the same CatalogList as a raw gRPC unary call over a unix socket to
//	   another process serving the same adapter code, no TLS (the floor)
//	G  the adapter's CatalogList through a go-plugin client in this process,
//	   launched as the host launches it (AutoMTLS), without the engine
//	T  F over TLS (ECDSA P-521, as go-plugin's AutoMTLS), to see what TLS costs
//	H  a gRPC health check over F's socket (the barest unary call)
//	R  caller → engine → an in-process function that invokes E's function
//	   (an in-process hop with nothing behind it)
//	X  caller → engine → an in-process function that invokes B's function
//	   (the hop A takes, without the router's own code)
//	I  B's function through Engine.Invoke from this process: the plugin host
//	   and go-plugin without the WebSocket and the engine's handler goroutine
//
// The WebSocket caller is another process (this binary re-executed), as
// SDK workers and `iii call` are.
//
// What the router and the plugin hop add to a sandbox call is A − G: the
// call through the engine, the router and the plugin host, against the same
// call made straight to the adapter the way the plugin host makes it (it
// also counts the engine's own WebSocket hop, E). The goal is A − G ≤ 1.5 × F.
// A − E, also printed, is stricter still: it counts a second adapter call
// (A makes one, E none). A − B is the router alone. The adapter is the hostdir example (built with go build
// unless -adapter names a binary); its catalog needs no sandbox. Paths run
// in interleaved blocks of consecutive calls so machine load moves a figure
// and its floor alike and every path is measured warm.
//
//	go run ./scripts/bench/router [-n 2000] [-rounds 5] [-warmup 300] [-block 50]
package main

import (
	"bufio"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/big"
	mrand "math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/go-plugin"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	"google.golang.org/grpc/health/grpc_health_v1"

	"github.com/iii-sandbox/iii/client"
	"github.com/iii-sandbox/iii/contract"
	"github.com/iii-sandbox/iii/contract/adapterrpc"
	"github.com/iii-sandbox/iii/host/engine"
	"github.com/iii-sandbox/iii/host/pluginhost"
	"github.com/iii-sandbox/iii/host/router"
	"github.com/iii-sandbox/iii/internal/testkit/benchstat"
	"github.com/iii-sandbox/iii/plugins/sdk/examples/hostdir"
)

const adapterName = "sandbox-hostdir"

// Environment of the floor server: this binary re-executed.
const (
	floorEnv      = "ROUTER_BENCH_FLOOR_SOCKET"
	floorStateEnv = "ROUTER_BENCH_FLOOR_STATE"
	callerEnv     = "ROUTER_BENCH_CALLER_URL"
)

func main() {
	if url := os.Getenv(callerEnv); url != "" {
		if err := serveCaller(url); err != nil {
			fmt.Fprintln(os.Stderr, "router bench caller:", err)
			os.Exit(1)
		}
		return
	}
	if sock := os.Getenv(floorEnv); sock != "" {
		if err := serveFloor(sock, os.Getenv(floorStateEnv)); err != nil {
			fmt.Fprintln(os.Stderr, "router bench floor server:", err)
			os.Exit(1)
		}
		return
	}
	n := flag.Int("n", 2000, "calls per path per round")
	rounds := flag.Int("rounds", 5, "rounds (each starts the rotation elsewhere)")
	warmup := flag.Int("warmup", 300, "calls per path before measuring")
	block := flag.Int("block", 50, "consecutive calls per path in each interleaved block")
	adapter := flag.String("adapter", "", "sandbox-hostdir binary (default: go build it)")
	cpuprofile := flag.String("cpuprofile", "", "write a CPU profile of the measured rounds here")
	flag.Parse()
	if *cpuprofile != "" {
		f, err := os.Create(*cpuprofile)
		if err != nil {
			fmt.Fprintln(os.Stderr, "router bench:", err)
			os.Exit(1)
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			fmt.Fprintln(os.Stderr, "router bench:", err)
			os.Exit(1)
		}
		defer pprof.StopCPUProfile()
	}
	if err := run(*n, *rounds, *warmup, *block, *adapter); err != nil {
		fmt.Fprintln(os.Stderr, "router bench:", err)
		pprof.StopCPUProfile()
		os.Exit(1)
	}
}

type path struct {
	name string
	call func(context.Context) error
	// remote, when set, is the function the caller process calls over
	// the engine's WebSocket instead of call.
	remote string
	lat    []time.Duration
}

func run(n, rounds, warmup, block int, adapterBin string) error {
	if n < 1 || rounds < 1 || block < 1 {
		return errors.New("-n, -rounds and -block must be at least 1")
	}
	ctx := context.Background()
	tmp, err := os.MkdirTemp("", "router-bench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	if adapterBin == "" {
		adapterBin = filepath.Join(tmp, adapterName)
		build := exec.Command("go", "build", "-o", adapterBin, "github.com/iii-sandbox/iii/plugins/sdk/examples/hostdir/cmd/sandbox-hostdir")
		build.Stderr = os.Stderr
		if err := build.Run(); err != nil {
			return fmt.Errorf("build the adapter: %w", err)
		}
	}
	config, err := json.Marshal(map[string]any{"image_allowlist": []string{"python", "node", "shell"}, "state_dir": filepath.Join(tmp, "state")})
	if err != nil {
		return err
	}

	// The engine, on loopback, with the plugin host and the router.
	eng := engine.New(engine.Options{})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: eng.Handler(), ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	defer func() {
		cctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = srv.Shutdown(cctx)
		_ = eng.Close(cctx)
	}()
	host, err := pluginhost.New(eng, pluginhost.Options{})
	if err != nil {
		return err
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = host.Close(cctx)
	}()
	if _, err := host.Start(ctx, pluginhost.StartRequest{Adapter: adapterName, Path: adapterBin, Config: config}); err != nil {
		return err
	}
	rt, err := router.New(eng, router.Options{Hosted: host.Hosted})
	if err != nil {
		return err
	}
	defer rt.Close()
	if err := rt.Bind(adapterName, ""); err != nil {
		return err
	}
	catalog, err := eng.Invoke(ctx, "", contract.AdapterFunctionID(adapterName, contract.OpCatalogList), json.RawMessage(`{}`))
	if err != nil {
		return err
	}
	local, err := eng.AttachLocalWorker(engine.LocalWorkerSpec{Name: "bench-local"})
	if err != nil {
		return err
	}
	defer local.Detach()
	if err := local.RegisterFunction(engine.FunctionDef{ID: "bench::catalog::list"}, func(context.Context, *engine.Call) (json.RawMessage, error) {
		return catalog, nil
	}); err != nil {
		return err
	}
	// X: the hop the router takes, without the router's own code.
	if err := local.RegisterFunction(engine.FunctionDef{ID: "bench::forward-plugin"}, func(ctx context.Context, call *engine.Call) (json.RawMessage, error) {
		return eng.Invoke(ctx, "", contract.AdapterFunctionID(adapterName, contract.OpCatalogList), call.Data)
	}); err != nil {
		return err
	}
	// R: an in-process hop with nothing behind it, to tell the cost of the
	// hop itself from what the plugin call adds.
	if err := local.RegisterFunction(engine.FunctionDef{ID: "bench::forward"}, func(ctx context.Context, call *engine.Call) (json.RawMessage, error) {
		return eng.Invoke(ctx, "", "bench::catalog::list", call.Data)
	}); err != nil {
		return err
	}

	// The floor: the same adapter code in another process (this binary
	// again) behind a plain gRPC server on a unix socket, so the floor
	// crosses processes like the plugin hop does.
	sock := filepath.Join(tmp, "floor.sock")
	self, err := os.Executable()
	if err != nil {
		return err
	}
	floorCmd := exec.Command(self)
	floorCmd.Env = append(os.Environ(), floorEnv+"="+sock, floorStateEnv+"="+filepath.Join(tmp, "floor-state"))
	floorCmd.Stderr = os.Stderr
	if err := floorCmd.Start(); err != nil {
		return err
	}
	defer func() {
		_ = floorCmd.Process.Kill()
		_ = floorCmd.Wait()
	}()
	for i := 0; ; i++ {
		if _, err := os.Stat(sock + ".tls"); err == nil {
			break
		}
		if i > 500 {
			return errors.New("the floor server did not start")
		}
		time.Sleep(10 * time.Millisecond)
	}
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer conn.Close()
	floor := adapterrpc.NewClient(conn)
	hc := grpc_health_v1.NewHealthClient(conn)
	certPEM, err := os.ReadFile(sock + ".crt")
	if err != nil {
		return err
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(certPEM)
	tconn, err := grpc.NewClient("unix://"+sock+".tls", grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{RootCAs: pool, ServerName: "localhost", MinVersion: tls.VersionTLS12})))
	if err != nil {
		return err
	}
	defer tconn.Close()
	floorTLS := adapterrpc.NewClient(tconn)

	// The same adapter binary launched by go-plugin directly, as the host
	// launches it (AutoMTLS, gRPC): its CatalogList without the engine.
	gp := plugin.NewClient(&plugin.ClientConfig{
		HandshakeConfig:  contract.Handshake(),
		VersionedPlugins: adapterrpc.VersionedPlugins(&adapterrpc.Plugin{}),
		Cmd:              exec.Command(adapterBin),
		AllowedProtocols: []plugin.Protocol{plugin.ProtocolGRPC},
		AutoMTLS:         true,
		Logger:           hclog.NewNullLogger(),
	})
	defer gp.Kill()
	rpc, err := gp.Client()
	if err != nil {
		return err
	}
	raw, err := rpc.Dispense(contract.PluginName)
	if err != nil {
		return err
	}
	direct := raw.(contract.Adapter)
	if err := direct.Configure(ctx, config); err != nil {
		return err
	}

	// Callers are other processes, as SDK workers and `iii call` are: a
	// WebSocket client inside the engine's process would compete with it
	// for the same two Ps and inflate every WebSocket path.
	caller, err := startCaller(ctx, "ws://"+ln.Addr().String())
	if err != nil {
		return err
	}
	defer caller.close()
	paths := []*path{
		{name: "A sandbox::catalog::list (router+plugin)", remote: "sandbox::catalog::list"},
		{name: "B " + adapterName + "::catalog::list (plugin)", remote: contract.AdapterFunctionID(adapterName, contract.OpCatalogList)},
		{name: "E engine → in-process function", remote: "bench::catalog::list"},
		{name: "R engine → in-process hop → E's function", remote: "bench::forward"},
		{name: "X engine → in-process hop → B's function", remote: "bench::forward-plugin"},
		{name: "I Engine.Invoke of B's function in process (no WebSocket)", call: func(ctx context.Context) error {
			_, err := eng.Invoke(ctx, "", contract.AdapterFunctionID(adapterName, contract.OpCatalogList), json.RawMessage(`{}`))
			return err
		}},
		{name: "F raw gRPC CatalogList, unix socket", call: func(ctx context.Context) error {
			_, err := floor.CatalogList(ctx, &contract.CatalogListRequest{})
			return err
		}},
		{name: "G go-plugin CatalogList (AutoMTLS), no engine", call: func(ctx context.Context) error {
			_, err := direct.CatalogList(ctx, &contract.CatalogListRequest{})
			return err
		}},
		{name: "T raw gRPC CatalogList, unix socket, TLS", call: func(ctx context.Context) error {
			_, err := floorTLS.CatalogList(ctx, &contract.CatalogListRequest{})
			return err
		}},
		{name: "H raw gRPC health check, unix socket", call: func(ctx context.Context) error {
			_, err := hc.Check(ctx, &grpc_health_v1.HealthCheckRequest{})
			return err
		}},
	}
	for _, p := range paths {
		if _, err := p.measure(ctx, caller, warmup); err != nil {
			return fmt.Errorf("%s: %w", p.name, err)
		}
	}
	// Each path runs in blocks of consecutive calls, and the blocks of all
	// paths are interleaved in a new random order each time: every path is
	// measured warm (a call right after calls to another process pays for
	// waking the target up, which under nested virtualisation costs tens
	// of microseconds and would otherwise land on whichever path follows
	// the floor in a fixed order), and a change in machine load hits every
	// path alike.
	rng := mrand.New(mrand.NewPCG(1, 2))
	for range rounds {
		for done := 0; done < n; done += block {
			order := slices.Clone(paths)
			rng.Shuffle(len(order), func(i, j int) { order[i], order[j] = order[j], order[i] })
			for _, p := range order {
				lat, err := p.measure(ctx, caller, min(block, n-done))
				if err != nil {
					return fmt.Errorf("%s: %w", p.name, err)
				}
				p.lat = append(p.lat, lat...)
			}
		}
	}

	fmt.Printf("P2 router + plugin hop, %d calls per path (%d rounds × %d), %s/%s, GOMAXPROCS=%d\n\n",
		rounds*n, rounds, n, runtime.GOOS, runtime.GOARCH, runtime.GOMAXPROCS(0))
	fmt.Printf("%-46s %10s %10s\n", "path", "p50", "p99")
	q := map[string][2]time.Duration{}
	for _, p := range paths {
		p50, p99 := benchstat.Percentile(p.lat, 50), benchstat.Percentile(p.lat, 99)
		q[p.name[:1]] = [2]time.Duration{p50, p99}
		fmt.Printf("%-46s %10s %10s\n", p.name, us(p50), us(p99))
	}
	fmt.Println()
	for i, label := range []string{"p50", "p99"} {
		added := q["A"][i] - q["G"][i]
		ratio := float64(added) / float64(q["F"][i])
		verdict := "meets"
		if ratio > 1.5 {
			verdict = "MISSES"
		}
		fmt.Printf("%s: the router and plugin hop add A−G = %s; floor F = %s; ratio %.2f× (goal ≤ 1.5×: %s)\n", label, us(added), us(q["F"][i]), ratio, verdict)
		fmt.Printf("     A−E = %s (%.2f× F); router alone A−B = %s; the router's own code A−X = %s; go-plugin's call G = %.2f× F; TLS T−F = %s\n",
			us(q["A"][i]-q["E"][i]), float64(q["A"][i]-q["E"][i])/float64(q["F"][i]), us(q["A"][i]-q["B"][i]), us(q["A"][i]-q["X"][i]),
			float64(q["G"][i])/float64(q["F"][i]), us(q["T"][i]-q["F"][i]))
		fmt.Printf("     in process: the plugin host's layer I−G = %s; an in-process hop R−E = %s; B over WebSocket minus B in process B−E−I = %s\n",
			us(q["I"][i]-q["G"][i]), us(q["R"][i]-q["E"][i]), us(q["B"][i]-q["E"][i]-q["I"][i]))
	}
	fmt.Println("load average:", benchstat.LoadAvg())
	return nil
}

func us(d time.Duration) string { return fmt.Sprintf("%.1fµs", float64(d)/float64(time.Microsecond)) }

// measure makes count consecutive calls on p and returns their latencies.
func (p *path) measure(ctx context.Context, c *callerProc, count int) ([]time.Duration, error) {
	if p.remote != "" {
		return c.run(p.remote, count)
	}
	lat := make([]time.Duration, 0, count)
	for range count {
		t0 := time.Now()
		if err := p.call(ctx); err != nil {
			return nil, err
		}
		lat = append(lat, time.Since(t0))
	}
	return lat, nil
}

// callerProc is this binary re-executed as a WebSocket caller of the
// engine: it reads "<function> <count>" lines and answers each with the
// latencies of count consecutive calls, in nanoseconds, on one line.
type callerProc struct {
	cmd *exec.Cmd
	in  io.WriteCloser
	out *bufio.Scanner
}

func startCaller(ctx context.Context, url string) (*callerProc, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cmd := exec.CommandContext(ctx, self)
	cmd.Env = append(os.Environ(), callerEnv+"="+url)
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	sc := bufio.NewScanner(out)
	sc.Buffer(make([]byte, 1<<20), 64<<20)
	return &callerProc{cmd: cmd, in: in, out: sc}, nil
}

func (c *callerProc) run(fn string, count int) ([]time.Duration, error) {
	if _, err := fmt.Fprintf(c.in, "%s %d\n", fn, count); err != nil {
		return nil, err
	}
	if !c.out.Scan() {
		return nil, fmt.Errorf("the caller process ended: %v", c.out.Err())
	}
	line := c.out.Text()
	if msg, ok := strings.CutPrefix(line, "error "); ok {
		return nil, errors.New(msg)
	}
	fields := strings.Fields(line)
	lat := make([]time.Duration, 0, len(fields))
	for _, f := range fields {
		ns, err := strconv.ParseInt(f, 10, 64)
		if err != nil {
			return nil, fmt.Errorf("caller answered %q", line)
		}
		lat = append(lat, time.Duration(ns))
	}
	return lat, nil
}

func (c *callerProc) close() {
	_ = c.in.Close()
	_ = c.cmd.Wait()
}

// serveCaller is the caller process: one WebSocket client of the engine.
func serveCaller(url string) error {
	ctx := context.Background()
	cl, err := client.Dial(ctx, url, client.Options{Name: "bench-caller", IgnoreEnv: true})
	if err != nil {
		return err
	}
	defer cl.Close(context.Background())
	in := bufio.NewScanner(os.Stdin)
	out := bufio.NewWriter(os.Stdout)
	for in.Scan() {
		fn, countText, _ := strings.Cut(in.Text(), " ")
		count, err := strconv.Atoi(countText)
		if err != nil || count < 1 {
			return fmt.Errorf("bad command %q", in.Text())
		}
		lat := make([]string, 0, count)
		for range count {
			t0 := time.Now()
			if _, err := cl.Call(ctx, fn, json.RawMessage(`{}`)); err != nil {
				lat = nil
				fmt.Fprintf(out, "error %s: %v\n", fn, err)
				break
			}
			lat = append(lat, strconv.FormatInt(int64(time.Since(t0)), 10))
		}
		if lat != nil {
			fmt.Fprintln(out, strings.Join(lat, " "))
		}
		if err := out.Flush(); err != nil {
			return err
		}
	}
	return in.Err()
}

// serveFloor serves the hostdir adapter over plain gRPC on a unix socket
// until killed.
func serveFloor(sock, state string) error {
	cert, certPEM, err := selfSigned()
	if err != nil {
		return err
	}
	if err := os.WriteFile(sock+".crt", certPEM, 0o600); err != nil {
		return err
	}
	a := hostdir.NewAdapter(hclog.NewNullLogger())
	config, err := json.Marshal(map[string]any{"image_allowlist": []string{"python", "node", "shell"}, "state_dir": state})
	if err != nil {
		return err
	}
	if err := a.Configure(context.Background(), config); err != nil {
		return err
	}
	ln, err := net.Listen("unix", sock)
	if err != nil {
		return err
	}
	tln, err := net.Listen("unix", sock+".tls")
	if err != nil {
		return err
	}
	serve := func(l net.Listener, opts ...grpc.ServerOption) error {
		gs := grpc.NewServer(append(opts, contract.GRPCServerOptions()...)...)
		adapterrpc.RegisterServer(gs, a)
		grpc_health_v1.RegisterHealthServer(gs, health.NewServer())
		return gs.Serve(l)
	}
	errs := make(chan error, 2)
	go func() { errs <- serve(ln) }()
	go func() {
		errs <- serve(tln, grpc.Creds(credentials.NewTLS(&tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12})))
	}()
	return <-errs
}

// selfSigned makes the TLS floor's certificate: ECDSA P-521, as go-plugin's
// AutoMTLS makes its own.
func selfSigned() (tls.Certificate, []byte, error) {
	key, err := ecdsa.GenerateKey(elliptic.P521(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "localhost"}, DNSNames: []string{"localhost"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign, IsCA: true, BasicConstraintsValid: true,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return tls.Certificate{}, nil, err
	}
	certPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	kb, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return tls.Certificate{}, nil, err
	}
	cert, err := tls.X509KeyPair(certPEM, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb}))
	return cert, certPEM, err
}
