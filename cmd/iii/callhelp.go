package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"

	"github.com/iii-sandbox/iii/client"
	"github.com/iii-sandbox/iii/cmd/iii/internal/schemadoc"
	"github.com/iii-sandbox/iii/protocol"
)

// fnFunctionsInfo describes a registered function.
const fnFunctionsInfo = "engine::functions::info"

// functionDetail is the part of engine::functions::info that help shows.
type functionDetail struct {
	FunctionID     string          `json:"function_id"`
	Namespace      string          `json:"namespace"`
	WorkerName     string          `json:"worker_name"`
	Description    string          `json:"description"`
	RequestSchema  json.RawMessage `json:"request_schema"`
	ResponseSchema json.RawMessage `json:"response_schema"`
}

// functionHelp appends what the running engine knows about fn to the
// command's help. Help never fails: when the engine cannot tell, one line
// says why.
func functionHelp(cmd *cobra.Command, e env, f *callFlags, fn string) {
	w := cmd.OutOrStdout()
	note := func(format string, args ...any) {
		fmt.Fprintf(w, "\nNote: no details for %s: %s\n", fn, fmt.Sprintf(format, args...))
	}
	if err := f.validate(cmd); err != nil {
		note("%v", err)
		return
	}
	ctx := cmd.Context()
	if ctx == nil {
		ctx = context.Background()
	}
	ctx, cancel := context.WithTimeout(ctx, min(f.timeout(), client.DefaultDialTimeout))
	defer cancel()

	detail, err := fetchDetail(ctx, e, f, fn)
	if err != nil {
		note("%s", err.Error())
		return
	}
	if err := writeDetail(w, detail); err != nil {
		note("%v", err)
	}
}

func fetchDetail(ctx context.Context, e env, f *callFlags, fn string) (*functionDetail, error) {
	c, _, err := dial(ctx, e, f)
	if err != nil {
		return nil, err
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.Background(), closeGrace)
		defer cancel()
		_ = c.Close(cctx)
	}()
	req := map[string]string{"function_id": fn}
	if f.namespace != "" {
		req["namespace"] = f.namespace
	}
	res, err := c.Call(ctx, fnFunctionsInfo, req, client.WithTimeout(f.timeout()))
	if err != nil {
		var eb *protocol.ErrorBody
		if errors.As(err, &eb) {
			return nil, fmt.Errorf("%s", eb.Message)
		}
		return nil, err
	}
	var d functionDetail
	if err := json.Unmarshal(res, &d); err != nil || d.FunctionID == "" {
		return nil, fmt.Errorf("the engine's %s answer is not a function description", fnFunctionsInfo)
	}
	return &d, nil
}

func writeDetail(w io.Writer, d *functionDetail) error {
	var b strings.Builder
	fmt.Fprintf(&b, "\nFunction %s (namespace %s, worker %s)\n", d.FunctionID, orDash(d.Namespace), orDash(d.WorkerName))
	if desc := strings.Join(strings.Fields(d.Description), " "); desc != "" {
		fmt.Fprintf(&b, "  %s\n", desc)
	}
	for _, part := range []struct {
		title  string
		schema json.RawMessage
	}{{"Request", d.RequestSchema}, {"Response", d.ResponseSchema}} {
		fmt.Fprintf(&b, "\n%s:\n", part.title)
		if len(part.schema) == 0 || string(part.schema) == "null" {
			fmt.Fprintf(&b, "  no schema registered\n")
			continue
		}
		doc, err := schemadoc.Parse(part.schema)
		if err != nil {
			fmt.Fprintf(&b, "  unreadable schema: %v\n", err)
			continue
		}
		if err := doc.Render(&b, "  "); err != nil {
			return err
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
