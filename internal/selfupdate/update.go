package selfupdate

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"

	"github.com/iii-sandbox/iii/compose/packages"
	"github.com/iii-sandbox/iii/compose/registry"
)

// Options is one `iii update` run.
type Options struct {
	// Executable is the running iii, symlinks resolved (Executable()).
	Executable string
	// CurrentVersion is what the running iii reports as its version.
	CurrentVersion string
	Source         Source
	// Target is the Rust target triple to install; "" means
	// $III_RELEASE_TARGET (read through Getenv), else this host's.
	Target string
	// Version installs this release (a rollback, or a pin) instead of the
	// latest; "" means the latest.
	Version string
	// Only limits the run to one product (ProductIII, ProductCloud); ""
	// updates everything installed.
	Only string
	// Check reports what would change and changes nothing.
	Check bool
	// HTTP fetches from HTTP(S) sources; nil means a client of its own
	// whose idle connections are closed when the run ends.
	HTTP *http.Client
	// Progress is told about downloads; nil tells nobody.
	Progress packages.Progress
	// Getenv reads $III_RELEASE_TARGET, $HOME and $PATH; nil reads none.
	Getenv func(string) string
}

// Status is what happened to one product.
type Status string

// The statuses of a product.
const (
	StatusUpdated      Status = "updated"        // replaced by the release's binary
	StatusUpToDate     Status = "up-to-date"     // it already is the release's version
	StatusAvailable    Status = "available"      // --check: it would be updated
	StatusNewer        Status = "newer"          // it is newer than the latest release; left alone
	StatusNotInRelease Status = "not-in-release" // iii-cloud: the release has no archive for it
)

// ProductResult is one product of a run.
type ProductResult struct {
	Product string
	Path    string
	// From is the version installed before ("" when it did not say).
	From   string
	To     string
	Status Status
	Asset  string
	URL    string
	Size   int64
}

// Result is what a run found and did.
type Result struct {
	Source  Source
	Target  string
	Release string
	// Latest: Release is the source's latest (no --version was given).
	Latest   bool
	Products []ProductResult
	// Leftovers and Path are filled in when the run succeeded.
	Leftovers Leftovers
	Path      PathCheck
	// Home is the home directory the leftovers were looked for in.
	Home string
}

// Executable is the running binary with symlinks resolved, the file an
// update replaces.
func Executable() (string, error) {
	exe, err := os.Executable()
	if err != nil {
		return "", newError(CodeExecutableUnknown, fmt.Sprintf("cannot find the running iii binary (%v); reinstall iii with the install script", err))
	}
	if real, err := filepath.EvalSymlinks(exe); err == nil {
		exe = real
	}
	return exe, nil
}

// HostTarget is $III_RELEASE_TARGET when set, else the host's Rust
// target triple (registry.HostPlatform, as Compose picks packages).
func HostTarget(getenv func(string) string) string {
	if getenv != nil {
		if t := strings.TrimSpace(getenv(EnvTarget)); t != "" {
			return t
		}
	}
	return registry.HostPlatform().Target()
}

// Update runs `iii update`. The Result describes every product it looked
// at, also when it returns an error (what was updated before the error
// stays updated).
func Update(ctx context.Context, o Options) (*Result, error) {
	getenv := o.Getenv
	if getenv == nil {
		getenv = func(string) string { return "" }
	}
	if o.Executable == "" {
		return nil, newError(CodeExecutableUnknown, "the running iii binary is unknown; reinstall iii with the install script")
	}
	res := &Result{Source: o.Source, Target: o.Target, Home: getenv("HOME")}
	if res.Target == "" {
		res.Target = HostTarget(getenv)
	}
	if !registry.PathSafe(res.Target) {
		return nil, newError(CodeInvalidSource, fmt.Sprintf("target %q is not a target triple", clip(res.Target, 80)))
	}
	client := o.HTTP
	if client == nil {
		client = &http.Client{Transport: http.DefaultTransport.(*http.Transport).Clone()}
		defer client.CloseIdleConnections()
	}
	f := &fetcher{http: client, progress: o.Progress}
	idx, err := f.index(ctx, o.Source)
	if err != nil {
		return nil, err
	}
	if o.Version == "" {
		res.Release, res.Latest = idx.LatestVersion(), true
	} else {
		res.Release = NormalizeVersion(o.Version)
	}
	rel := idx.Releases[res.Release]
	if rel == nil {
		vs := idx.Versions()
		more := ""
		if len(vs) > 20 {
			vs, more = vs[:20], fmt.Sprintf(" and %d older", len(vs)-20)
		}
		return nil, newError(CodeReleaseNotFound, fmt.Sprintf("%s has no release %q; it has %s%s", o.Source.Describe(), clip(o.Version, 40), strings.Join(vs, ", "), more))
	}

	dir := filepath.Dir(o.Executable)
	cloud := filepath.Join(dir, ProductCloud)
	if o.Only == "" || o.Only == ProductIII {
		pr, err := updateOne(ctx, f, o, res, rel, ProductIII, o.Executable, o.CurrentVersion)
		res.Products = append(res.Products, pr)
		if err != nil {
			return res, err
		}
	}
	if o.Only == "" || o.Only == ProductCloud {
		if isExecutable(cloud) {
			// What iii-cloud reports is only used to skip an update; when
			// it reports nothing it is updated.
			cur, _ := runVersion(ctx, cloud)
			pr, err := updateOne(ctx, f, o, res, rel, ProductCloud, cloud, cur)
			res.Products = append(res.Products, pr)
			if err != nil {
				return res, err
			}
		} else if o.Only == ProductCloud {
			return res, newError(CodeTargetNotInstalled, fmt.Sprintf(
				"%s is not installed beside iii (no executable %s); nothing to update. `iii update` updates iii-cloud when it sits in the same directory as iii", ProductCloud, cloud))
		}
	}
	res.Leftovers = FindLeftovers(dir, res.Home)
	res.Path = CheckPath(o.Executable, getenv("PATH"))
	return res, nil
}

// updateOne brings one installed binary to the release.
func updateOne(ctx context.Context, f *fetcher, o Options, res *Result, rel *Release, product, path, current string) (ProductResult, error) {
	pr := ProductResult{Product: product, Path: path, From: current, To: res.Release, Asset: AssetName(product, res.Target)}
	if cmp, ok := compareVersions(current, res.Release); ok {
		switch {
		case cmp == 0:
			pr.Status = StatusUpToDate
			return pr, nil
		case cmp > 0 && res.Latest:
			// Never a downgrade unless asked for by --version.
			pr.Status = StatusNewer
			return pr, nil
		}
	}
	a, ok := rel.Assets[pr.Asset]
	if !ok {
		if product != ProductIII && o.Only != product {
			pr.Status = StatusNotInRelease
			return pr, nil
		}
		has := "no assets at all"
		if names := rel.AssetNames(); len(names) > 0 {
			has = strings.Join(names, ", ")
		}
		return pr, newError(CodeAssetNotFound, fmt.Sprintf(
			"release %s has no %s for this host's target %s (no asset %s; it has %s); nothing was changed",
			res.Release, product, res.Target, pr.Asset, has))
	}
	u, err := o.Source.AssetURL(a.URL)
	if err != nil {
		return pr, err
	}
	pr.URL, pr.Size = u, a.Size
	if o.Check {
		pr.Status = StatusAvailable
		return pr, nil
	}
	err = install(ctx, f, plan{product: product, path: path, version: res.Release, target: res.Target, url: u, asset: a, exact: product == ProductIII})
	if err != nil {
		return pr, err
	}
	pr.Status = StatusUpdated
	return pr, nil
}

func isExecutable(p string) bool {
	st, err := os.Stat(p)
	return err == nil && st.Mode().IsRegular() && st.Mode().Perm()&0o111 != 0
}
