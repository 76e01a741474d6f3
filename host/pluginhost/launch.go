package pluginhost

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/go-plugin"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health/grpc_health_v1"

	"github.com/iii-sandbox/iii/contract"
	"github.com/iii-sandbox/iii/contract/adapterrpc"
	"github.com/iii-sandbox/iii/internal/lazyre"
)

// EnvLifelineFD names the inherited descriptor an adapter watches: the
// read end of a pipe whose write end only the engine holds. It has the
// same value as the SDK's sdk.EnvLifelineFD (a test keeps them equal);
// the engine does not import the SDK for one name.
const EnvLifelineFD = "III_ADAPTER_LIFELINE_FD"

// lifelineFD is the lifeline's descriptor number in the adapter:
// ExtraFiles[0] becomes fd 3.
const lifelineFD = 3

// killGrace bounds go-plugin's Kill (which asks the adapter to shut down
// and waits two seconds before killing the process); past it the process
// group is killed without waiting further.
const killGrace = 5 * time.Second

// failure classifies a launch that did not produce a running adapter.
type failure int

const (
	// failStart: the process did not start, did not complete the
	// handshake, or broke a call; another try may work.
	failStart failure = iota
	// failRejected: the adapter refused its configuration and exits; it
	// would refuse it again.
	failRejected
	// failIncompatible: the adapter speaks another contract major.
	failIncompatible
)

// launchError is why a launch failed.
type launchError struct {
	kind   failure
	reason string          // for last_error and S301 messages
	serr   *contract.Error // S302 for failIncompatible
}

func (e *launchError) Error() string { return e.reason }

func (e *launchError) permanent() bool { return e.kind != failStart }

// instance is one adapter process and the gRPC connection to it.
type instance struct {
	m        *managed
	client   *plugin.Client
	adapter  *adapterrpc.Client
	conn     *grpc.ClientConn
	pid      int
	info     *contract.AdapterInfo
	lifeline *os.File // write end; closing it tells the adapter the engine is gone
	tail     *stderrTail
	cmd      *exec.Cmd
	started  time.Time

	// ctx ends when the instance is stopped or found dead; calls in flight
	// end with it, and its cause says why.
	ctx    context.Context
	cancel context.CancelCauseFunc
	// suspect is poked by a call that saw a transport failure, so the
	// health check runs now rather than at the next tick.
	suspect  chan struct{}
	stopOnce sync.Once
	// calls are the engine calls it serves (handover.go).
	calls callCount
}

// EnvEngineToken is the environment variable that sets the engine token
// (it wins over config.yaml's engine_token).
const EnvEngineToken = "III_ENGINE_TOKEN"

// adapterEnv is the adapter's environment: the engine's, without anything
// that would confuse the adapter about its lifeline or that it must not
// hold (the engine token), plus the lifeline.
func adapterEnv(base []string) []string {
	env := make([]string, 0, len(base)+1)
	for _, kv := range base {
		// The engine token authenticates Compose to the engine; an
		// adapter never needs it, and what it does not have its VMs
		// cannot read.
		if strings.HasPrefix(kv, EnvLifelineFD+"=") || strings.HasPrefix(kv, EnvEngineToken+"=") {
			continue
		}
		env = append(env, kv)
	}
	return append(env, EnvLifelineFD+"="+strconv.Itoa(lifelineFD))
}

// incompatibleRE reads go-plugin's refusal of a plugin whose protocol
// version (our contract major) is not one we offered. go-plugin reports it
// only as text; TestIncompatibleMajorPlugin pins the wording.
var incompatibleRE = lazyre.New(`(?i)incompatible API version with plugin\. Plugin version: (\d+)`)

// launch starts the adapter binary at path, checks its contract major,
// configures it and returns it running. The handshake, and separately
// Info and Configure, are bounded by Options.StartTimeout; ctx can end
// Info and Configure sooner.

// The engine streams fs::write chunks to its adapters and reads their
// fs::read chunks: size gRPC's buffers for them.
func init() { contract.UseChunkBufferPool() }

func (h *Host) launch(ctx context.Context, m *managed, path string, config []byte) (*instance, *launchError) {
	// The handshake has its own StartTimeout; this bounds the calls after
	// it, so an adapter that hangs in Configure cannot hang a relaunch.
	ctx, cancel := context.WithTimeout(ctx, h.opts.StartTimeout)
	defer cancel()
	r, w, err := os.Pipe()
	if err != nil {
		return nil, &launchError{kind: failStart, reason: fmt.Sprintf("create the lifeline pipe: %v", err)}
	}
	cmd := exec.Command(path)
	cmd.Env = adapterEnv(os.Environ())
	cmd.ExtraFiles = []*os.File{r}
	ownProcessGroup(cmd)
	tail := &stderrTail{}
	client := plugin.NewClient(&plugin.ClientConfig{
		HandshakeConfig:  contract.Handshake(),
		VersionedPlugins: adapterrpc.VersionedPlugins(&adapterrpc.Plugin{Channels: engineChannels{eng: h.eng, h: h, owner: m.channelOwner()}}),
		Cmd:              cmd,
		AllowedProtocols: []plugin.Protocol{plugin.ProtocolGRPC},
		AutoMTLS:         true,
		// The environment is built above so the engine's own copy of
		// the lifeline variable cannot override the adapter's.
		SkipHostEnv:  true,
		Logger:       m.log,
		Stderr:       tail,
		StartTimeout: h.opts.StartTimeout,
		// Fixed flow-control windows turn gRPC's bandwidth-delay probing
		// off: on a local socket it only adds a ping and its ack to
		// every call. The windows are large enough for the contract's
		// 64 KiB stream chunks in flight.
		GRPCDialOptions: []grpc.DialOption{
			grpc.WithInitialWindowSize(contract.StreamWindow),
			grpc.WithInitialConnWindowSize(contract.StreamWindow),
		},
	})
	_, err = client.Start()
	// The adapter has its copy of the read end; ours would keep the pipe
	// open after the adapter died.
	_ = r.Close()
	inst := &instance{m: m, client: client, lifeline: w, tail: tail, cmd: cmd, started: time.Now(), suspect: make(chan struct{}, 1)}
	inst.ctx, inst.cancel = context.WithCancelCause(context.Background())
	if cmd.Process != nil {
		inst.pid = cmd.Process.Pid
	}
	if err != nil {
		reason := err.Error()
		if sm := incompatibleRE.FindStringSubmatch(reason); sm != nil {
			got, _ := strconv.Atoi(sm[1])
			inst.stop(errors.New("incompatible"))
			serr := contract.NewError(contract.S302,
				"sandbox adapter %q (%s) speaks sandbox contract major %d, but this engine speaks contract %d.%d; install an adapter release for contract major %d",
				m.key.adapter, path, got, contract.Major, contract.Minor, contract.Major)
			return nil, &launchError{kind: failIncompatible, reason: serr.Message, serr: serr}
		}
		// Kill waits for go-plugin's stderr reader, so the tail is
		// complete once the instance is stopped.
		inst.stop(errors.New("start failed"))
		reason = condense(reason)
		if last := tail.lastError(); last != "" {
			reason += "; the adapter said: " + last
		}
		return nil, &launchError{kind: failStart, reason: "the adapter did not start: " + reason}
	}
	fail := func(kind failure, format string, args ...any) *launchError {
		reason := fmt.Sprintf(format, args...)
		inst.stop(errors.New(reason))
		return &launchError{kind: kind, reason: reason}
	}
	rpc, err := client.Client()
	if err != nil {
		return nil, fail(failStart, "connect to the adapter: %v", err)
	}
	raw, err := rpc.Dispense(contract.PluginName)
	if err != nil {
		return nil, fail(failStart, "the adapter does not serve the %q plugin: %v", contract.PluginName, err)
	}
	adapter, ok := raw.(*adapterrpc.Client)
	gc, ok2 := rpc.(*plugin.GRPCClient)
	if !ok || !ok2 {
		return nil, fail(failStart, "the adapter's plugin is not a gRPC sandbox adapter (%T)", raw)
	}
	inst.adapter, inst.conn = adapter, gc.Conn
	if v := client.NegotiatedVersion(); v != contract.Major {
		// go-plugin only dispenses versions we offered, so this means a
		// change in go-plugin itself; refuse rather than guess.
		return nil, fail(failStart, "go-plugin negotiated protocol version %d, not contract major %d", v, contract.Major)
	}

	info, err := adapter.Info(ctx)
	if err != nil {
		return nil, fail(failStart, "adapter::info failed: %v", err)
	}
	inst.info = info
	if serr := contract.CheckContract(m.key.adapter, info.Contract); serr != nil {
		inst.stop(errors.New("incompatible"))
		return nil, &launchError{kind: failIncompatible, reason: serr.Message, serr: serr}
	}
	if len(config) == 0 {
		config = []byte("{}")
	}
	if err := adapter.Configure(ctx, config); err != nil {
		var rej *contract.ConfigRejectedError
		if errors.As(err, &rej) {
			// The adapter exits on its own after this reply; stop makes
			// sure, and cleans up what go-plugin holds.
			return nil, fail(failRejected, "the adapter rejected its configuration: %s", rej.Reason)
		}
		return nil, fail(failStart, "configure the adapter: %v", err)
	}
	return inst, nil
}

// ping is go-plugin's health check (the grpc health service named
// "plugin" every go-plugin server runs) with a deadline: go-plugin's own
// Ping has none, so a hung adapter would hang the watcher.
func (in *instance) ping(ctx context.Context, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	_, err := grpc_health_v1.NewHealthClient(in.conn).Check(ctx, &grpc_health_v1.HealthCheckRequest{Service: plugin.GRPCServiceName})
	return err
}

// exited reports whether the process has ended, and how.
func (in *instance) exited() (string, bool) {
	if !in.client.Exited() {
		return "", false
	}
	// go-plugin sets Exited after cmd.Wait returned, under the lock
	// Exited takes, so ProcessState is settled by now.
	if ps := in.cmd.ProcessState; ps != nil {
		return "the adapter process exited (" + ps.String() + ")", true
	}
	return "the adapter process exited", true
}

// poke asks the watcher to check the adapter's health now.
func (in *instance) poke() {
	select {
	case in.suspect <- struct{}{}:
	default:
	}
}

// stop ends the instance: calls in flight end with cause, go-plugin asks
// the adapter to shut down (and kills it after two seconds), then the
// whole process group is killed so nothing the adapter started in it
// survives, and the lifeline is closed. It is idempotent and returns once
// the process is gone.
func (in *instance) stop(cause error) {
	in.stopOnce.Do(func() {
		in.cancel(cause)
		done := make(chan struct{})
		go func() {
			defer close(done)
			in.client.Kill()
		}()
		t := time.NewTimer(killGrace)
		select {
		case <-done:
			t.Stop()
		case <-t.C:
			in.m.log.Warn("the adapter did not stop in time; killing its process group", "pid", in.pid)
			killProcessGroup(in.pid)
			<-done
		}
		killProcessGroup(in.pid)
		_ = in.lifeline.Close()
	})
}

// condense turns go-plugin's multi-line start errors into one line,
// dropping its generic advice (the adapter's own words follow instead).
func condense(msg string) string {
	var parts []string
	for _, line := range strings.Split(msg, "\n") {
		line = strings.TrimSpace(line)
		if strings.HasPrefix(line, "This usually means") || strings.HasPrefix(line, "Additional notes about plugin") {
			break
		}
		line = strings.TrimSuffix(line, ":")
		if line != "" {
			parts = append(parts, line)
		}
	}
	if len(parts) == 0 {
		return strings.TrimSpace(msg)
	}
	return strings.Join(parts, ": ")
}
