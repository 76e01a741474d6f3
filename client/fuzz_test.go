package client

import (
	"context"
	"encoding/json"
	"errors"
	"testing"

	"github.com/iii-sandbox/iii/protocol"
)

// FuzzDispatch feeds arbitrary frames from "the engine" to a connected
// client: whatever arrives, the client must not panic.
func FuzzDispatch(f *testing.F) {
	for _, seed := range []string{
		`{"type":"invokefunction","invocation_id":"i","function_id":"f::echo","data":{"a":1}}`,
		`{"type":"invokefunction","function_id":"f::echo","action":{"type":"void"}}`,
		`{"type":"invokefunction","invocation_id":"i","function_id":"f::missing"}`,
		`{"type":"invokefunction","invocation_id":"i","function_id":7}`,
		`{"type":"invocationresult","invocation_id":"nobody","result":1}`,
		`{"type":"invocationresult","invocation_id":"x","error":{"code":"c","message":"m"}}`,
		`{"type":"registertrigger","id":"t","trigger_type":"tt","function_id":"f::echo","config":{}}`,
		`{"type":"registertrigger","id":"t","trigger_type":"nope","function_id":"f"}`,
		`{"type":"unregistertrigger","id":"t","trigger_type":"tt"}`,
		`{"type":"triggerregistrationresult","id":"t","error":{"code":"x","message":"y"}}`,
		`{"type":"registrationrejected","code":"FUNCTION_NAMESPACE_CONFLICT","function_id":"f::echo"}`,
		`{"type":"workerregistered","worker_id":"w"}`,
		`{"type":"ping"}`, `{"type":"pong"}`,
		`{"type":"error","error":{"code":"AUTH_ERROR","message":"no"}}`,
		`{"type":"error"}`, `{}`, `null`, `[]`, `"x"`, ``, `{"type":"invokefunction","data":`,
	} {
		f.Add([]byte(seed))
	}
	c, s := fuzzClient(f)
	f.Fuzz(func(_ *testing.T, frame []byte) {
		c.dispatch(s, frame)
	})
}

// fuzzClient connects a client to a scripted peer that swallows whatever
// the client sends back, for the whole fuzz run.
func fuzzClient(t *testing.F) (*Client, *session) {
	p := newPeer(t)
	ch := dialAsync(t, p.url(), testOptions())
	pc := p.accept(t)
	pc.greet(t, "w-1", "tok-1")
	expectRegister(t, pc)
	c, err := waitDial(t, ch)
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	go func() {
		for range pc.frames {
		}
	}()
	_, err = c.RegisterFunction(FunctionDef{ID: "f::echo"}, func(_ context.Context, inv *Invocation) (any, error) {
		return inv.Data, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.RegisterTriggerType(TriggerTypeDef{ID: "tt"}, nopTrigger{}); err != nil {
		t.Fatal(err)
	}
	c.mu.Lock()
	s := c.sess
	c.mu.Unlock()
	if s == nil {
		t.Fatal("not connected")
	}
	return c, s
}

// FuzzEngineURL: any address string yields a ws(s) URL with a host, or a
// coded error; never a panic.
func FuzzEngineURL(f *testing.F) {
	for _, seed := range []string{"ws://127.0.0.1:49134", "http://h", "wss://[::1]:1/p?q", "", "::", "ws://", "ftp://x", "ws://%zz"} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		u, err := engineURL(raw)
		if err != nil {
			var ce *Error
			if !errors.As(err, &ce) || ce.Code != CodeInvalidArgument {
				t.Fatalf("uncoded error %v", err)
			}
			return
		}
		if (u.Scheme != "ws" && u.Scheme != "wss") || u.Host == "" {
			t.Fatalf("%q gave %q", raw, u)
		}
	})
}

// FuzzMarshalValue: a raw payload is either sent as valid JSON or refused.
func FuzzMarshalValue(f *testing.F) {
	for _, seed := range []string{`{}`, `1`, `"s"`, `{`, ``, `null`, "\xff"} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		out, err := marshalValue(json.RawMessage(raw))
		if err == nil && len(out) > 0 && !json.Valid(out) {
			t.Fatalf("invalid JSON accepted: %q", out)
		}
		if _, err := protocol.Encode(&protocol.InvokeFunction{FunctionID: "f", Data: out}); err != nil && len(out) > 0 {
			t.Fatalf("accepted payload does not encode: %v", err)
		}
	})
}
