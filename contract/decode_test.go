package contract

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp/cmpopts"
	"github.com/iii-sandbox/iii/protocol"
	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
)

const sid = "1b4e6709-f265-4142-9178-3a7d83b46aa5"

// decoders maps each operation to its decoder, as one signature.
func decoders() map[string]func(json.RawMessage) (any, error) {
	wrap := func(f any) func(json.RawMessage) (any, error) {
		return func(raw json.RawMessage) (any, error) {
			switch d := f.(type) {
			case func(json.RawMessage) (*CreateRequest, error):
				return unwrap(d(raw))
			case func(json.RawMessage) (*ExecRequest, error):
				return unwrap(d(raw))
			case func(json.RawMessage) (*RunRequest, error):
				return unwrap(d(raw))
			case func(json.RawMessage) (*ListRequest, error):
				return unwrap(d(raw))
			case func(json.RawMessage) (*StopRequest, error):
				return unwrap(d(raw))
			case func(json.RawMessage) (*CatalogListRequest, error):
				return unwrap(d(raw))
			case func(json.RawMessage) (*FsLsRequest, error):
				return unwrap(d(raw))
			case func(json.RawMessage) (*FsStatRequest, error):
				return unwrap(d(raw))
			case func(json.RawMessage) (*FsMkdirRequest, error):
				return unwrap(d(raw))
			case func(json.RawMessage) (*FsWriteRequest, error):
				return unwrap(d(raw))
			case func(json.RawMessage) (*FsReadRequest, error):
				return unwrap(d(raw))
			case func(json.RawMessage) (*FsRmRequest, error):
				return unwrap(d(raw))
			case func(json.RawMessage) (*FsChmodRequest, error):
				return unwrap(d(raw))
			case func(json.RawMessage) (*FsMvRequest, error):
				return unwrap(d(raw))
			case func(json.RawMessage) (*FsGrepRequest, error):
				return unwrap(d(raw))
			case func(json.RawMessage) (*FsSedRequest, error):
				return unwrap(d(raw))
			}
			panic("unknown decoder type")
		}
	}
	return map[string]func(json.RawMessage) (any, error){
		OpCreate: wrap(DecodeCreateRequest), OpExec: wrap(DecodeExecRequest), OpRun: wrap(DecodeRunRequest),
		OpList: wrap(DecodeListRequest), OpStop: wrap(DecodeStopRequest), OpCatalogList: wrap(DecodeCatalogListRequest),
		OpFsLs: wrap(DecodeFsLsRequest), OpFsStat: wrap(DecodeFsStatRequest), OpFsMkdir: wrap(DecodeFsMkdirRequest),
		OpFsWrite: wrap(DecodeFsWriteRequest), OpFsRead: wrap(DecodeFsReadRequest), OpFsRm: wrap(DecodeFsRmRequest),
		OpFsChmod: wrap(DecodeFsChmodRequest), OpFsMv: wrap(DecodeFsMvRequest), OpFsGrep: wrap(DecodeFsGrepRequest),
		OpFsSed: wrap(DecodeFsSedRequest),
	}
}

// unwrap keeps a nil request nil inside the any.
func unwrap[T any](v *T, err error) (any, error) {
	if err != nil {
		return nil, err
	}
	return v, nil
}

type decodeCase struct {
	op   string
	name string
	in   string
	want any    // on success
	code Code   // on failure
	msg  string // a substring of the failure's message
}

func TestDecodeValid(t *testing.T) {
	cases := []decodeCase{
		{op: OpCreate, name: "minimal", in: `{"image":"python"}`, want: &CreateRequest{Image: "python"}},
		{op: OpCreate, name: "full, unknown fields ignored, env map sorted",
			in:   `{"image":"node","cpus":2,"memory_mb":1024,"name":"w","network":true,"idle_timeout_secs":60,"env":{"Z":"1","a_1":"x=y","B":""},"extra":[1]}`,
			want: &CreateRequest{Image: "node", CPUs: ptr(uint32(2)), MemoryMB: ptr(uint32(1024)), Name: "w", Network: true, IdleTimeoutSecs: ptr(uint64(60)), Env: []string{"B=", "Z=1", "a_1=x=y"}}},
		{op: OpCreate, name: "nulls are absent", in: `{"image":"python","cpus":null,"env":null,"network":null}`, want: &CreateRequest{Image: "python"}},
		{op: OpCreate, name: "env list", in: `{"image":"python","env":["A=1","PATH=/bin:/usr/bin","E="]}`,
			want: &CreateRequest{Image: "python", Env: []string{"A=1", "PATH=/bin:/usr/bin", "E="}}},

		{op: OpExec, name: "cmd + args", in: `{"sandbox_id":"` + sid + `","cmd":"python3","args":["-c","print(1)"]}`,
			want: &ExecRequest{SandboxID: sid, Argv: []string{"python3", "-c", "print(1)"}, TimeoutMS: DefaultExecTimeoutMS}},
		{op: OpExec, name: "plain cmd", in: `{"sandbox_id":"` + sid + `","cmd":"ls"}`,
			want: &ExecRequest{SandboxID: sid, Argv: []string{"ls"}, TimeoutMS: DefaultExecTimeoutMS}},
		{op: OpExec, name: "argv", in: `{"sandbox_id":"` + sid + `","argv":["node","/app/index.js"],"timeout_ms":5000,"workdir":"/app"}`,
			want: &ExecRequest{SandboxID: sid, Argv: []string{"node", "/app/index.js"}, TimeoutMS: 5000, Workdir: "/app"}},
		{op: OpExec, name: "argv with empty cmd and args", in: `{"sandbox_id":"` + sid + `","argv":["a b"],"cmd":"","args":[]}`,
			want: &ExecRequest{SandboxID: sid, Argv: []string{"a b"}, TimeoutMS: DefaultExecTimeoutMS}},
		{op: OpExec, name: "command line is split into words", in: `{"sandbox_id":"` + sid + `","cmd":"python -c 'print(\"a b\")' && x"}`,
			want: &ExecRequest{SandboxID: sid, Argv: []string{"python", "-c", `print("a b")`, "&&", "x"}, TimeoutMS: DefaultExecTimeoutMS}},
		{op: OpExec, name: "upper-case and braced uuid are canonicalised", in: `{"sandbox_id":"{1B4E6709-F265-4142-9178-3A7D83B46AA5}","cmd":"ls"}`,
			want: &ExecRequest{SandboxID: sid, Argv: []string{"ls"}, TimeoutMS: DefaultExecTimeoutMS}},
		{op: OpExec, name: "stdin and env", in: `{"sandbox_id":"` + sid + `","cmd":"cat","stdin":"aGk=","env":{"B":"2","A":"1"}}`,
			want: &ExecRequest{SandboxID: sid, Argv: []string{"cat"}, Stdin: []byte("hi"), Env: []string{"A=1", "B=2"}, TimeoutMS: DefaultExecTimeoutMS}},
		{op: OpExec, name: "unpadded base64", in: `{"sandbox_id":"` + sid + `","cmd":"cat","stdin":"aGk"}`,
			want: &ExecRequest{SandboxID: sid, Argv: []string{"cat"}, Stdin: []byte("hi"), TimeoutMS: DefaultExecTimeoutMS}},

		{op: OpRun, name: "minimal", in: `{"image":"python","code":"print(2+2)","lang":"python"}`,
			want: &RunRequest{Image: "python", Code: "print(2+2)", Lang: "python", TimeoutMS: DefaultExecTimeoutMS}},
		{op: OpRun, name: "full", in: `{"image":"node","code":"","lang":"js","files":[{"path":"/a.js","content":"x"}],"env":["A=1"],"stdin":"eA==","timeout_ms":9,"keep_sandbox":true}`,
			want: &RunRequest{Image: "node", Lang: "js", Files: []RunFile{{Path: "/a.js", Content: "x"}}, Env: []string{"A=1"}, Stdin: []byte("x"), TimeoutMS: 9, KeepSandbox: true}},

		{op: OpList, name: "empty object", in: `{}`, want: &ListRequest{}},
		{op: OpList, name: "null", in: `null`, want: &ListRequest{}},
		{op: OpList, name: "nothing", in: ``, want: &ListRequest{}},
		{op: OpList, name: "unknown fields", in: `{"all":true}`, want: &ListRequest{}},
		{op: OpCatalogList, name: "empty", in: `{}`, want: &CatalogListRequest{}},

		{op: OpStop, name: "defaults", in: `{"sandbox_id":"` + sid + `"}`, want: &StopRequest{SandboxID: sid}},
		{op: OpStop, name: "wait", in: `{"sandbox_id":"` + sid + `","wait":true}`, want: &StopRequest{SandboxID: sid, Wait: true}},

		{op: OpFsLs, name: "ls", in: `{"sandbox_id":"` + sid + `","path":"/"}`, want: &FsLsRequest{SandboxID: sid, Path: "/"}},
		{op: OpFsStat, name: "stat", in: `{"sandbox_id":"` + sid + `","path":"/etc"}`, want: &FsStatRequest{SandboxID: sid, Path: "/etc"}},
		{op: OpFsRead, name: "read", in: `{"sandbox_id":"` + sid + `","path":"/a"}`, want: &FsReadRequest{SandboxID: sid, Path: "/a"}},
		{op: OpFsMkdir, name: "defaults", in: `{"sandbox_id":"` + sid + `","path":"/w"}`, want: &FsMkdirRequest{SandboxID: sid, Path: "/w", Mode: 0o755}},
		{op: OpFsMkdir, name: "mode and parents", in: `{"sandbox_id":"` + sid + `","path":"/w/x","mode":"0o700","parents":true}`,
			want: &FsMkdirRequest{SandboxID: sid, Path: "/w/x", Mode: 0o700, Parents: true}},
		{op: OpFsWrite, name: "text", in: `{"sandbox_id":"` + sid + `","path":"/w/m.py","content":"print(1)"}`,
			want: &FsWriteRequest{SandboxID: sid, Path: "/w/m.py", Mode: 0o644, Content: WriteContent{Inline: []byte("print(1)")}}},
		{op: OpFsWrite, name: "empty text", in: `{"sandbox_id":"` + sid + `","path":"/e","content":""}`,
			want: &FsWriteRequest{SandboxID: sid, Path: "/e", Mode: 0o644, Content: WriteContent{Inline: []byte{}}}},
		{op: OpFsWrite, name: "base64", in: `{"sandbox_id":"` + sid + `","path":"/b","content_b64":"/wA=","mode":"0600","parents":true}`,
			want: &FsWriteRequest{SandboxID: sid, Path: "/b", Mode: 0o600, Parents: true, Content: WriteContent{Inline: []byte{0xff, 0}}}},
		{op: OpFsWrite, name: "channel", in: `{"sandbox_id":"` + sid + `","path":"/s","content":{"channel_id":"c1","access_key":"k1","direction":"read"},"content_b64":null}`,
			want: &FsWriteRequest{SandboxID: sid, Path: "/s", Mode: 0o644, Content: WriteContent{Channel: &protocol.StreamChannelRef{ChannelID: "c1", AccessKey: "k1", Direction: "read"}}}},
		{op: OpFsRm, name: "rm", in: `{"sandbox_id":"` + sid + `","path":"/d","recursive":true}`, want: &FsRmRequest{SandboxID: sid, Path: "/d", Recursive: true}},
		{op: OpFsChmod, name: "chmod", in: `{"sandbox_id":"` + sid + `","path":"/d","mode":"755"}`, want: &FsChmodRequest{SandboxID: sid, Path: "/d", Mode: 0o755}},
		{op: OpFsChmod, name: "chmod to root", in: `{"sandbox_id":"` + sid + `","path":"/d","mode":"4755","uid":0,"gid":0,"recursive":true}`,
			want: &FsChmodRequest{SandboxID: sid, Path: "/d", Mode: 0o4755, UID: ptr(uint32(0)), GID: ptr(uint32(0)), Recursive: true}},
		{op: OpFsMv, name: "mv", in: `{"sandbox_id":"` + sid + `","src":"/a","dst":"/b","overwrite":true}`, want: &FsMvRequest{SandboxID: sid, Src: "/a", Dst: "/b", Overwrite: true}},
		{op: OpFsGrep, name: "defaults", in: `{"sandbox_id":"` + sid + `","path":"/w","pattern":"def \\w+"}`,
			want: &FsGrepRequest{SandboxID: sid, Path: "/w", Pattern: `def \w+`, Recursive: true, MaxMatches: 10000, MaxLineBytes: 4096}},
		{op: OpFsGrep, name: "everything", in: `{"sandbox_id":"` + sid + `","path":"/w","pattern":"","recursive":false,"ignore_case":true,"include_glob":["*.py"],"exclude_glob":["venv/"],"max_matches":5,"max_line_bytes":80}`,
			want: &FsGrepRequest{SandboxID: sid, Path: "/w", Recursive: false, IgnoreCase: true, IncludeGlob: []string{"*.py"}, ExcludeGlob: []string{"venv/"}, MaxMatches: 5, MaxLineBytes: 80}},
		{op: OpFsSed, name: "files", in: `{"sandbox_id":"` + sid + `","files":["/a","/b"],"pattern":"x+","replacement":""}`,
			want: &FsSedRequest{SandboxID: sid, Files: []string{"/a", "/b"}, Recursive: true, Pattern: "x+", Regex: true}},
		{op: OpFsSed, name: "path with empty files", in: `{"sandbox_id":"` + sid + `","files":[],"path":"/w","include_glob":["*.go"],"pattern":"(","replacement":"[","regex":false,"first_only":true,"ignore_case":true,"recursive":false}`,
			want: &FsSedRequest{SandboxID: sid, Path: "/w", IncludeGlob: []string{"*.go"}, Pattern: "(", Replacement: "[", FirstOnly: true, IgnoreCase: true}},
	}
	dec := decoders()
	for _, tc := range cases {
		t.Run(tc.op+"/"+tc.name, func(t *testing.T) {
			got, err := dec[tc.op](json.RawMessage(tc.in))
			assert.NilError(t, err)
			assert.DeepEqual(t, got, tc.want)
		})
	}
}

func TestDecodeInvalid(t *testing.T) {
	ex := `"sandbox_id":"` + sid + `"`
	cases := []decodeCase{
		{op: OpCreate, name: "not an object", in: `[]`, code: S001, msg: "must be a JSON object, got an array"},
		{op: OpCreate, name: "broken json", in: `{"image":`, code: S001, msg: "not valid JSON"},
		{op: OpCreate, name: "image missing", in: `{}`, code: S001, msg: `field "image" is required`},
		{op: OpCreate, name: "image empty", in: `{"image":""}`, code: S001, msg: `field "image" must not be empty`},
		{op: OpCreate, name: "image wrong type", in: `{"image":7}`, code: S001, msg: `field "image" must be a string, got a number`},
		{op: OpCreate, name: "cpus string", in: `{"image":"p","cpus":"2"}`, code: S001, msg: `field "cpus" must be a whole number, got a string`},
		{op: OpCreate, name: "cpus negative", in: `{"image":"p","cpus":-1}`, code: S001, msg: `field "cpus" must be a whole number from 0 to 4294967295`},
		{op: OpCreate, name: "cpus fraction", in: `{"image":"p","cpus":1.5}`, code: S001, msg: `"cpus"`},
		{op: OpCreate, name: "cpus overflow", in: `{"image":"p","cpus":4294967296}`, code: S001, msg: `"cpus"`},
		{op: OpCreate, name: "cpus zero", in: `{"image":"p","cpus":0}`, code: S001, msg: `"cpus" must be at least 1`},
		{op: OpCreate, name: "memory zero", in: `{"image":"p","memory_mb":0}`, code: S001, msg: `"memory_mb" must be at least 1`},
		{op: OpCreate, name: "network string", in: `{"image":"p","network":"yes"}`, code: S001, msg: `field "network" must be a boolean`},
		{op: OpCreate, name: "env bad key", in: `{"image":"p","env":{"1A":"x","B-C":"y","OK":"z"}}`, code: S001, msg: `invalid variable names "1A", "B-C"`},
		{op: OpCreate, name: "env empty key", in: `{"image":"p","env":{"":"x"}}`, code: S001, msg: `invalid variable names ""`},
		{op: OpCreate, name: "env number value", in: `{"image":"p","env":{"PORT":8080}}`, code: S001, msg: `env.PORT must be a string, got a number`},
		{op: OpCreate, name: "env list without =", in: `{"image":"p","env":["A=1","B"]}`, code: S001, msg: `env item 1 ("B") must have the form NAME=value`},
		{op: OpCreate, name: "env list empty name", in: `{"image":"p","env":["=1"]}`, code: S001, msg: `env item 0`},
		{op: OpCreate, name: "env list NUL", in: `{"image":"p","env":["A=\u0000"]}`, code: S001, msg: `NUL`},
		{op: OpCreate, name: "env string", in: `{"image":"p","env":"A=1"}`, code: S001, msg: `field "env" must be an array of "K=V" strings or an object of strings`},
		{op: OpCreate, name: "env list of numbers", in: `{"image":"p","env":[1]}`, code: S001, msg: `item 0 is a number`},

		{op: OpExec, name: "no sandbox id", in: `{"cmd":"ls"}`, code: S001, msg: `"sandbox_id" is required`},
		{op: OpExec, name: "bad uuid", in: `{"sandbox_id":"abc","cmd":"ls"}`, code: S001, msg: `not a valid UUID: "abc"`},
		{op: OpExec, name: "uuid number", in: `{"sandbox_id":1,"cmd":"ls"}`, code: S001, msg: `"sandbox_id" must be a string`},
		{op: OpExec, name: "nothing to run", in: `{` + ex + `}`, code: S001, msg: "nothing to run"},
		{op: OpExec, name: "blank cmd", in: `{` + ex + `,"cmd":"   "}`, code: S001, msg: "cmd is blank"},
		{op: OpExec, name: "argv and cmd", in: `{` + ex + `,"argv":["ls"],"cmd":"ls"}`, code: S001, msg: "argv cannot be combined"},
		{op: OpExec, name: "argv and args", in: `{` + ex + `,"argv":["ls"],"args":["-l"]}`, code: S001, msg: "argv cannot be combined"},
		{op: OpExec, name: "whitespace cmd and args", in: `{` + ex + `,"cmd":"ls -l","args":["/"]}`, code: S001, msg: "ambiguous"},
		{op: OpExec, name: "unbalanced quote", in: `{` + ex + `,"cmd":"echo 'a"}`, code: S001, msg: "unterminated single quote"},
		{op: OpExec, name: "empty binary", in: `{` + ex + `,"argv":[""]}`, code: S001, msg: "argv[0]"},
		{op: OpExec, name: "quoted empty binary", in: `{` + ex + `,"cmd":"'' x"}`, code: S001, msg: "argv[0]"},
		{op: OpExec, name: "NUL in arg", in: `{` + ex + `,"cmd":"ls","args":["a\u0000b"]}`, code: S001, msg: "argument 1 must not contain NUL"},
		{op: OpExec, name: "args not strings", in: `{` + ex + `,"cmd":"ls","args":[1]}`, code: S001, msg: `field "args" must be an array of strings, but item 0 is a number`},
		{op: OpExec, name: "args object", in: `{` + ex + `,"cmd":"ls","args":{}}`, code: S001, msg: `field "args" must be an array of strings, got an object`},
		{op: OpExec, name: "stdin not base64", in: `{` + ex + `,"cmd":"cat","stdin":"%%%"}`, code: S001, msg: `field "stdin" must be standard base64`},
		{op: OpExec, name: "timeout zero", in: `{` + ex + `,"cmd":"ls","timeout_ms":0}`, code: S001, msg: `"timeout_ms" must be at least 1`},
		{op: OpExec, name: "timeout exponent", in: `{` + ex + `,"cmd":"ls","timeout_ms":1e3}`, code: S001, msg: `"timeout_ms" must be a whole number`},
		{op: OpExec, name: "workdir NUL", in: `{` + ex + `,"cmd":"ls","workdir":"/a\u0000"}`, code: S001, msg: `"workdir" must not contain NUL`},

		{op: OpRun, name: "no lang", in: `{"image":"python","code":"x"}`, code: S001, msg: `field "lang" is required`},
		{op: OpRun, name: "no code", in: `{"image":"python","lang":"py"}`, code: S001, msg: `field "code" is required`},
		{op: OpRun, name: "files not array", in: `{"image":"p","code":"x","lang":"py","files":{}}`, code: S001, msg: `field "files" must be an array`},
		{op: OpRun, name: "file without path", in: `{"image":"p","code":"x","lang":"py","files":[{"content":"x"}]}`, code: S001, msg: `files[0]: field "path" is required`},
		{op: OpRun, name: "file bad content", in: `{"image":"p","code":"x","lang":"py","files":[{"path":"/a","content":1}]}`, code: S001, msg: `files[0]: field "content" is required`},
		{op: OpRun, name: "file not object", in: `{"image":"p","code":"x","lang":"py","files":["a"]}`, code: S001, msg: `files[0] must be an object`},

		{op: OpList, name: "string", in: `"x"`, code: S001, msg: "must be a JSON object, got a string"},
		{op: OpStop, name: "wait string", in: `{` + ex + `,"wait":"true"}`, code: S001, msg: `"wait" must be a boolean`},

		{op: OpFsLs, name: "fs bad uuid stays S001", in: `{"sandbox_id":"x","path":"/"}`, code: S001, msg: "not a valid UUID"},
		{op: OpFsLs, name: "fs not object", in: `7`, code: S210, msg: "must be a JSON object, got a number"},
		{op: OpFsLs, name: "no path", in: `{` + ex + `}`, code: S210, msg: `field "path" is required`},
		{op: OpFsStat, name: "path number", in: `{` + ex + `,"path":1}`, code: S210, msg: `field "path" must be a string`},
		{op: OpFsRead, name: "empty path", in: `{` + ex + `,"path":""}`, code: S210, msg: `must not be empty`},
		{op: OpFsMkdir, name: "mode number", in: `{` + ex + `,"path":"/a","mode":755}`, code: S210, msg: `"mode" must be an octal string such as "0644", got a number`},
		{op: OpFsMkdir, name: "mode 8", in: `{` + ex + `,"path":"/a","mode":"0789"}`, code: S210, msg: `not an octal string`},
		{op: OpFsMkdir, name: "parents string", in: `{` + ex + `,"path":"/a","parents":"true"}`, code: S210, msg: `"parents" must be a boolean`},
		{op: OpFsWrite, name: "both contents", in: `{` + ex + `,"path":"/a","content":"x","content_b64":"eA=="}`, code: S210, msg: "not both"},
		{op: OpFsWrite, name: "no content", in: `{` + ex + `,"path":"/a"}`, code: S210, msg: "exactly one of content"},
		{op: OpFsWrite, name: "bad base64", in: `{` + ex + `,"path":"/a","content_b64":"!"}`, code: S210, msg: "standard base64"},
		{op: OpFsWrite, name: "content number", in: `{` + ex + `,"path":"/a","content":5}`, code: S210, msg: `"content" must be a string or a channel ref`},
		{op: OpFsWrite, name: "content partial ref", in: `{` + ex + `,"path":"/a","content":{"channel_id":"c","direction":"read"}}`, code: S210, msg: "content.access_key must be a non-empty string"},
		{op: OpFsWrite, name: "content writer ref", in: `{` + ex + `,"path":"/a","content":{"channel_id":"c","access_key":"k","direction":"write"}}`, code: S210, msg: `read end of a channel`},
		{op: OpFsRm, name: "recursive number", in: `{` + ex + `,"path":"/a","recursive":1}`, code: S210, msg: `"recursive" must be a boolean`},
		{op: OpFsChmod, name: "no mode", in: `{` + ex + `,"path":"/a"}`, code: S210, msg: `field "mode" is required`},
		{op: OpFsChmod, name: "mode too big", in: `{` + ex + `,"path":"/a","mode":"17777"}`, code: S210, msg: `above 07777`},
		{op: OpFsChmod, name: "uid negative", in: `{` + ex + `,"path":"/a","mode":"644","uid":-1}`, code: S210, msg: `"uid"`},
		{op: OpFsMv, name: "no dst", in: `{` + ex + `,"src":"/a"}`, code: S210, msg: `field "dst" is required`},
		{op: OpFsGrep, name: "no pattern", in: `{` + ex + `,"path":"/a"}`, code: S210, msg: `field "pattern" is required`},
		{op: OpFsGrep, name: "bad regex", in: `{` + ex + `,"path":"/a","pattern":"a(b"}`, code: S217, msg: `not a valid RE2 regular expression`},
		{op: OpFsGrep, name: "perl lookahead", in: `{` + ex + `,"path":"/a","pattern":"a(?=b)"}`, code: S217, msg: `RE2`},
		{op: OpFsGrep, name: "zero max matches", in: `{` + ex + `,"path":"/a","pattern":"x","max_matches":0}`, code: S210, msg: `"max_matches" must be at least 1`},
		{op: OpFsGrep, name: "globs not list", in: `{` + ex + `,"path":"/a","pattern":"x","include_glob":"*.py"}`, code: S210, msg: `"include_glob" must be an array of strings`},
		{op: OpFsSed, name: "both", in: `{` + ex + `,"files":["/a"],"path":"/b","pattern":"x","replacement":"y"}`, code: S210, msg: "not both"},
		{op: OpFsSed, name: "neither", in: `{` + ex + `,"pattern":"x","replacement":"y"}`, code: S210, msg: "exactly one of files"},
		{op: OpFsSed, name: "neither with empty files", in: `{` + ex + `,"files":[],"pattern":"x","replacement":"y"}`, code: S210, msg: "exactly one of files"},
		{op: OpFsSed, name: "empty file name", in: `{` + ex + `,"files":[""],"pattern":"x","replacement":"y"}`, code: S210, msg: "files[0]"},
		{op: OpFsSed, name: "globs with files", in: `{` + ex + `,"files":["/a"],"exclude_glob":["b"],"pattern":"x","replacement":"y"}`, code: S210, msg: "apply only with path"},
		{op: OpFsSed, name: "no replacement", in: `{` + ex + `,"path":"/a","pattern":"x"}`, code: S210, msg: `"replacement" is required`},
		{op: OpFsSed, name: "empty pattern", in: `{` + ex + `,"path":"/a","pattern":"","replacement":"y"}`, code: S210, msg: `"pattern" must not be empty`},
		{op: OpFsSed, name: "bad regex", in: `{` + ex + `,"path":"/a","pattern":"[","replacement":"y"}`, code: S217, msg: "RE2"},
		{op: OpFsSed, name: "sed paths bad uuid", in: `{"sandbox_id":"","path":"/a","pattern":"x","replacement":"y"}`, code: S001, msg: "UUID"},
	}
	dec := decoders()
	for _, tc := range cases {
		t.Run(tc.op+"/"+tc.name, func(t *testing.T) {
			got, err := dec[tc.op](json.RawMessage(tc.in))
			assert.Assert(t, got == nil, "a failed decode returns no request")
			var e *Error
			assert.Assert(t, errors.As(err, &e), "want %s, got %v", tc.code, err)
			assert.Equal(t, e.Code, tc.code, e.Message)
			assert.Assert(t, is.Contains(e.Message, tc.msg))
			assert.Assert(t, strings.HasPrefix(e.Message, "invalid sandbox::"+tc.op+" request: "), e.Message)
		})
	}
}

// TestDecodeEveryOpHasCases keeps the tables above honest as ops are added.
func TestDecodeEveryOpHasCases(t *testing.T) {
	dec := decoders()
	for _, op := range Ops() {
		_, ok := dec[op]
		assert.Assert(t, ok, "no decoder for %s", op)
	}
}

// TestDecodeRoundTrip: a decoded request marshalled back to JSON decodes to
// the same request, so Go callers can build requests with these types.
func TestDecodeRoundTrip(t *testing.T) {
	inputs := map[string]string{
		OpCreate:  `{"image":"node","cpus":2,"memory_mb":1,"name":"w","network":true,"idle_timeout_secs":0,"env":{"A":"1"}}`,
		OpExec:    `{"sandbox_id":"` + sid + `","cmd":"sh -c 'echo \"$A\"'","stdin":"AAEC/w==","env":["A=1"],"timeout_ms":7,"workdir":"/w"}`,
		OpRun:     `{"image":"p","code":"c","lang":"l","files":[{"path":"/a","content":"b"}],"stdin":"eA==","keep_sandbox":true}`,
		OpStop:    `{"sandbox_id":"` + sid + `","wait":true}`,
		OpFsMkdir: `{"sandbox_id":"` + sid + `","path":"/w","mode":"0700","parents":true}`,
		OpFsWrite: `{"sandbox_id":"` + sid + `","path":"/w","content_b64":"/w=="}`,
		OpFsRm:    `{"sandbox_id":"` + sid + `","path":"/w","recursive":true}`,
		OpFsChmod: `{"sandbox_id":"` + sid + `","path":"/w","mode":"1777","uid":5}`,
		OpFsMv:    `{"sandbox_id":"` + sid + `","src":"/a","dst":"/b"}`,
		OpFsGrep:  `{"sandbox_id":"` + sid + `","path":"/w","pattern":"x","exclude_glob":["a"],"max_line_bytes":3}`,
		OpFsSed:   `{"sandbox_id":"` + sid + `","path":"/w","pattern":"x","replacement":"y","regex":false}`,
	}
	dec := decoders()
	for op, in := range inputs {
		t.Run(op, func(t *testing.T) {
			first, err := dec[op](json.RawMessage(in))
			assert.NilError(t, err)
			b, err := json.Marshal(first)
			assert.NilError(t, err)
			second, err := dec[op](b)
			assert.NilError(t, err, string(b))
			assert.DeepEqual(t, second, first, cmpopts.EquateEmpty())
		})
	}
}
