package selfupdate

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
)

const testSHA = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

func indexJSON(latest string, versions ...string) string {
	var rels []string
	for _, v := range versions {
		rels = append(rels, fmt.Sprintf(`%q:{"assets":{"iii-x86_64-unknown-linux-gnu.tar.gz":{"url":"%s/iii.tar.gz","sha256":%q,"size":10}},"published_at":"2026-01-01T00:00:00Z"}`, v, v, testSHA))
	}
	l := ""
	if latest != "" {
		l = fmt.Sprintf(`"latest":%q,`, latest)
	}
	return "{" + l + `"releases":{` + strings.Join(rels, ",") + "}}"
}

// TestDecodeIndex is the index decoder's table: what it accepts, and
// RELEASE_INDEX_INVALID naming the fault for everything else.
func TestDecodeIndex(t *testing.T) {
	asset := func(name, body string) string {
		return `{"releases":{"0.26.1":{"assets":{"` + name + `":` + body + `}}}}`
	}
	tests := []struct {
		name, data, wantErr string
	}{
		{name: "full", data: indexJSON("0.26.1", "0.26.0", "0.26.1")},
		{name: "no latest", data: indexJSON("", "0.26.0")},
		{name: "unknown fields ignored", data: `{"schema":2,"releases":{"0.26.1":{"notes":"x","assets":{}}}}`},
		{name: "release without assets", data: `{"releases":{"0.26.1":{}}}`},
		{name: "trailing space", data: indexJSON("", "0.26.0") + "\n \n"},
		{name: "prerelease", data: indexJSON("", "0.27.0-rc.1")},
		{name: "not JSON", data: `{`, wantErr: "not valid JSON"},
		{name: "two values", data: indexJSON("", "0.26.0") + "{}", wantErr: "something follows"},
		{name: "null", data: `null`, wantErr: "no releases"},
		{name: "array", data: `[]`, wantErr: "not valid JSON"},
		{name: "no releases", data: `{"latest":"0.26.1"}`, wantErr: "no releases"},
		{name: "v prefix", data: `{"releases":{"v0.26.1":{}}}`, wantErr: `release "v0.26.1" is not a version`},
		{name: "not semver", data: `{"releases":{"latest":{}}}`, wantErr: `release "latest" is not a version`},
		{name: "two parts", data: `{"releases":{"0.26":{}}}`, wantErr: "is not a version"},
		{name: "null release", data: `{"releases":{"0.26.1":null}}`, wantErr: "release 0.26.1 is null"},
		{name: "latest unlisted", data: indexJSON("0.27.0", "0.26.0"), wantErr: `latest is "0.27.0", which is not a listed release`},
		{name: "asset name with slash", data: asset("../iii.tar.gz", `{"url":"a","sha256":"`+testSHA+`"}`), wantErr: "asset name"},
		{name: "asset not tar.gz", data: asset("iii.zip", `{"url":"a","sha256":"`+testSHA+`"}`), wantErr: "asset name"},
		{name: "no url", data: asset("iii-x.tar.gz", `{"url":" ","sha256":"`+testSHA+`"}`), wantErr: "has no url"},
		{name: "short sha", data: asset("iii-x.tar.gz", `{"url":"a","sha256":"abc"}`), wantErr: "not 64 lower-case hex digits"},
		{name: "upper sha", data: asset("iii-x.tar.gz", `{"url":"a","sha256":"`+strings.ToUpper(testSHA)+`"}`), wantErr: "not 64 lower-case hex digits"},
		{name: "negative size", data: asset("iii-x.tar.gz", `{"url":"a","sha256":"`+testSHA+`","size":-1}`), wantErr: "negative size"},
		{name: "huge size", data: asset("iii-x.tar.gz", `{"url":"a","sha256":"`+testSHA+`","size":99999999999}`), wantErr: "more than the 512 MiB"},
		{name: "size not a number", data: asset("iii-x.tar.gz", `{"url":"a","sha256":"`+testSHA+`","size":"1"}`), wantErr: "not valid JSON"},
		{name: "too large", data: `{"releases":{}, "x":"` + strings.Repeat("a", MaxIndexBytes) + `"}`, wantErr: "larger than 4 MiB"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			idx, err := DecodeIndex([]byte(tc.data), "test-index")
			if tc.wantErr == "" {
				assert.NilError(t, err)
				assert.Check(t, len(idx.Releases) > 0)
				return
			}
			assert.Equal(t, CodeOf(err), CodeIndexInvalid, "%v", err)
			assert.Check(t, is.Contains(err.Error(), tc.wantErr))
			assert.Check(t, is.Contains(err.Error(), "test-index"), "the message names the index")
		})
	}
}

// TestLatestVersion: latest when given, else the highest stable release,
// else the highest prerelease.
func TestLatestVersion(t *testing.T) {
	tests := []struct {
		data, want string
	}{
		{indexJSON("0.26.0", "0.26.0", "0.26.1"), "0.26.0"},
		{indexJSON("", "0.25.9", "0.26.1", "0.26.0", "0.27.0-rc.1"), "0.26.1"},
		{indexJSON("", "0.27.0-rc.1", "0.27.0-rc.2"), "0.27.0-rc.2"},
		{indexJSON("", "0.9.0", "0.10.0"), "0.10.0"},
	}
	for _, tc := range tests {
		idx, err := DecodeIndex([]byte(tc.data), "t")
		assert.NilError(t, err)
		assert.Equal(t, idx.LatestVersion(), tc.want)
	}
	idx, err := DecodeIndex([]byte(indexJSON("", "0.9.0", "0.10.0", "0.10.0-rc.1")), "t")
	assert.NilError(t, err)
	assert.DeepEqual(t, idx.Versions(), []string{"0.10.0", "0.10.0-rc.1", "0.9.0"})
}

func TestNormalizeVersion(t *testing.T) {
	for in, want := range map[string]string{"0.26.1": "0.26.1", "v0.26.1": "0.26.1", " V1.0.0 ": "1.0.0", "v": "v", "vx": "vx", "": ""} {
		assert.Equal(t, NormalizeVersion(in), want, in)
	}
}

func TestParseVersionOutput(t *testing.T) {
	for in, want := range map[string]string{
		"0.26.1\n":                    "0.26.1",
		"iii-cloud 0.26.1\n":          "0.26.1",
		"iii-cloud v0.26.1 (abc)\n":   "0.26.1",
		"tool (0.26.1-rc.1), built x": "0.26.1-rc.1",
		"development build":           "",
		"":                            "",
		"1.2 then 1.2.3":              "1.2.3",
	} {
		assert.Equal(t, ParseVersionOutput(in), want, in)
	}
}

// FuzzIndex: the decoder never panics, and what it accepts encodes and
// decodes to the same index, with a latest that is a listed release.
func FuzzIndex(f *testing.F) {
	f.Add([]byte(indexJSON("0.26.1", "0.26.0", "0.26.1")))
	f.Add([]byte(indexJSON("", "0.27.0-rc.1")))
	f.Add([]byte(`{"releases":{"0.26.1":{"assets":{"iii-a.tar.gz":{"url":"https://example.invalid/a","sha256":"` + testSHA + `","size":0}}}}}`))
	f.Add([]byte(`{"releases":{"0.26.1":null}}`))
	f.Add([]byte(`{"latest":"x","releases":{}}`))
	f.Add([]byte(`null`))
	f.Fuzz(func(t *testing.T, data []byte) {
		idx, err := DecodeIndex(data, "fuzz")
		if err != nil {
			if CodeOf(err) != CodeIndexInvalid {
				t.Fatalf("error without the index code: %v", err)
			}
			return
		}
		latest := idx.LatestVersion()
		if _, ok := idx.Releases[latest]; !ok {
			t.Fatalf("latest %q is not a release", latest)
		}
		enc, err := encodeIndex(idx)
		if err != nil {
			t.Fatal(err)
		}
		again, err := DecodeIndex(enc, "fuzz-again")
		if err != nil {
			t.Fatalf("re-encoded index refused: %v\n%s", err, enc)
		}
		a, _ := json.Marshal(idx)
		b, _ := json.Marshal(again)
		if string(a) != string(b) {
			t.Fatalf("round trip changed the index:\n%s\n%s", a, b)
		}
	})
}

// FuzzParseVersionOutput: whatever a binary prints, the parser returns a
// version that normalizes to itself, or nothing, and never panics.
func FuzzParseVersionOutput(f *testing.F) {
	for _, s := range []string{"0.26.1", "iii-cloud v0.26.1", "(1.2.3-rc.1+b)", "", "v", "1.2.3.4"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		v := ParseVersionOutput(s)
		if v != "" && ParseVersionOutput(v) != v {
			t.Fatalf("%q parsed to %q, which does not parse to itself", s, v)
		}
	})
}
