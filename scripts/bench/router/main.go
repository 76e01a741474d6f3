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
//
// The router and plugin hop add A − E; the goal is A − E ≤ 1.5 × F. A − B is
// the router alone. The adapter is the hostdir example (built with go build
// unless -adapter names a binary); its catalog needs no sandbox. Calls to
// the paths are interleaved one by one so machine load moves a figure and
// its floor alike.
//
//	go run ./scripts/bench/router [-n 2000] [-rounds 5] [-warmup 300]
package main

import (
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
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"slices"
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
	pb "github.com/iii-sandbox/iii/contract/proto"
	"github.com/iii-sandbox/iii/host/engine"
	"github.com/iii-sandbox/iii/host/pluginhost"
	"github.com/iii-sandbox/iii/host/router"
	"github.com/iii-sandbox/iii/plugins/sdk/examples/hostdir"
)

const adapterName = "sandbox-hostdir"

// Environment of the floor server: this binary re-executed.
const (
	floorEnv      = "ROUTER_BENCH_FLOOR_SOCKET"
	floorStateEnv = "ROUTER_BENCH_FLOOR_STATE"
)

func main() {
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
	if err := run(*n, *rounds, *warmup, *adapter); err != nil {
		fmt.Fprintln(os.Stderr, "router bench:", err)
		pprof.StopCPUProfile()
		os.Exit(1)
	}
}

type path struct {
	name string
	call func(context.Context) error
	lat  []time.Duration
}

func run(n, rounds, warmup int, adapterBin string) error {
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
	// R: an in-process hop with nothing behind it, to tell the cost of the
	// hop itself from what the plugin call adds.
	if err := local.RegisterFunction(engine.FunctionDef{ID: "bench::forward"}, func(ctx context.Context, call *engine.Call) (json.RawMessage, error) {
		return eng.Invoke(ctx, "", "bench::catalog::list", call.Data)
	}); err != nil {
		return err
	}
	cl, err := client.Dial(ctx, "ws://"+ln.Addr().String(), client.Options{Name: "bench-caller", IgnoreEnv: true})
	if err != nil {
		return err
	}
	defer cl.Close(context.Background())

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
	floor := contract.NewGRPCClient(conn)
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
	floorTLS := contract.NewGRPCClient(tconn)

	// The same adapter binary launched by go-plugin directly, as the host
	// launches it (AutoMTLS, gRPC): its CatalogList without the engine.
	gp := plugin.NewClient(&plugin.ClientConfig{
		HandshakeConfig:  contract.Handshake(),
		VersionedPlugins: contract.VersionedPlugins(nil),
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

	wsCall := func(fn string) func(context.Context) error {
		return func(ctx context.Context) error {
			_, err := cl.Call(ctx, fn, json.RawMessage(`{}`))
			return err
		}
	}
	paths := []*path{
		{name: "A sandbox::catalog::list (router+plugin)", call: wsCall("sandbox::catalog::list")},
		{name: "B " + adapterName + "::catalog::list (plugin)", call: wsCall(contract.AdapterFunctionID(adapterName, contract.OpCatalogList))},
		{name: "E engine → in-process function", call: wsCall("bench::catalog::list")},
		{name: "R engine → in-process hop → E's function", call: wsCall("bench::forward")},
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
		for range warmup {
			if err := p.call(ctx); err != nil {
				return fmt.Errorf("%s: %w", p.name, err)
			}
		}
	}
	// Calls are interleaved one by one (in a rotating order), so a change
	// in machine load hits every path alike.
	for r := range rounds {
		for i := range n {
			for j := range paths {
				p := paths[(i+j+r)%len(paths)]
				t0 := time.Now()
				if err := p.call(ctx); err != nil {
					return fmt.Errorf("%s: %w", p.name, err)
				}
				p.lat = append(p.lat, time.Since(t0))
			}
		}
	}

	fmt.Printf("P2 router + plugin hop, %d calls per path (%d rounds × %d), %s/%s, GOMAXPROCS=%d\n\n",
		rounds*n, rounds, n, runtime.GOOS, runtime.GOARCH, runtime.GOMAXPROCS(0))
	fmt.Printf("%-46s %10s %10s\n", "path", "p50", "p99")
	q := map[string][2]time.Duration{}
	for _, p := range paths {
		p50, p99 := pct(p.lat, 50), pct(p.lat, 99)
		q[p.name[:1]] = [2]time.Duration{p50, p99}
		fmt.Printf("%-46s %10s %10s\n", p.name, us(p50), us(p99))
	}
	fmt.Println()
	for i, label := range []string{"p50", "p99"} {
		added := q["A"][i] - q["E"][i]
		ratio := float64(added) / float64(q["F"][i])
		verdict := "meets"
		if ratio > 1.5 {
			verdict = "MISSES"
		}
		fmt.Printf("%s: router+plugin hop adds A−E = %s; floor F = %s; ratio %.2f× (goal ≤ 1.5×: %s)\n", label, us(added), us(q["F"][i]), ratio, verdict)
		fmt.Printf("     router alone A−B = %s; plugin hop B−E = %s; TLS on the raw call T−F = %s; go-plugin's own call G = %.2f× F; host's share (B−E)−G = %s\n",
			us(q["A"][i]-q["B"][i]), us(q["B"][i]-q["E"][i]), us(q["T"][i]-q["F"][i]), float64(q["G"][i])/float64(q["F"][i]), us(q["B"][i]-q["E"][i]-q["G"][i]))
		fmt.Printf("     an in-process hop alone R−E = %s\n", us(q["R"][i]-q["E"][i]))
	}
	return nil
}

func pct(d []time.Duration, p int) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := slices.Clone(d)
	slices.Sort(s)
	i := (len(s)*p + 99) / 100
	return s[min(max(i-1, 0), len(s)-1)]
}

func us(d time.Duration) string { return fmt.Sprintf("%.1fµs", float64(d)/float64(time.Microsecond)) }

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
		pb.RegisterSandboxAdapterServer(gs, contract.NewGRPCServer(a))
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
