package workervm

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/iii-sandbox/iii/plugins/sandbox-libkrun/boot"
)

// The install cache: a worker's disk as it was right after its install
// step succeeded, kept so that a new worker of the same name in the same
// namespace (its state directory deleted, or its vm_id changed) whose
// install has the same inputs starts from a copy of it instead of an
// empty disk and the install step (seconds to minutes under TCG).
//
// Layout: <state_dir>/worker-disks/<entry>/disk-<key>.ext4, where <entry>
// is a hash of the namespace and the worker's name, so one project never
// finds another's disk, and <key> a hash of the install's inputs (the
// record the disk holds in installMarker) and the disk's size. An entry
// holds one disk: the capture of a new key replaces it, and worker::remove
// deletes it.

// diskCacheDirName is the cache's directory in state_dir, beside workers/.
const diskCacheDirName = "worker-disks"

// diskCache is the install cache under dir; dir "" disables it.
type diskCache struct{ dir string }

// entryDir is the directory of the entry of worker name in namespace ns.
func (c diskCache) entryDir(ns, name string) string {
	return filepath.Join(c.dir, hexSum("iii-worker-disk", ns, name)[:32])
}

// diskFile is the name of the cached disk of an install whose record is
// record, on a disk of sizeMB.
func diskFile(record string, sizeMB uint64) string {
	return "disk-" + hexSum(record, fmt.Sprint(sizeMB))[:32] + ".ext4"
}

// ownerFile names, for people, whose entry a directory is.
const ownerFile = "owner.txt"

// ext4 superblock magic: 0xEF53, little endian, 56 bytes into the
// superblock, which starts 1024 bytes into the disk.
const (
	ext4MagicOffset = 1024 + 56
	ext4Magic       = 0xEF53
)

// lookup returns the cached disk for an install whose record is record, on
// a disk of sizeMB, of worker name in namespace ns: "" and why not when
// there is none. An entry that is there but unusable (wrong size, not an
// ext4 image) is deleted, so the install that follows replaces it.
func (c diskCache) lookup(ns, name, record string, sizeMB uint64) (path, why string) {
	if c.dir == "" {
		return "", "the install cache is off"
	}
	p := filepath.Join(c.entryDir(ns, name), diskFile(record, sizeMB))
	fi, err := os.Stat(p)
	if errors.Is(err, fs.ErrNotExist) {
		return "", "no cached disk for these install inputs"
	}
	if err == nil && fi.Size() != int64(sizeMB)<<20 {
		err = fmt.Errorf("%d bytes, not %d", fi.Size(), int64(sizeMB)<<20)
	}
	if err == nil {
		err = checkExt4(p)
	}
	if err != nil {
		_ = os.Remove(p)
		return "", fmt.Sprintf("the cached disk %s was unusable (%v) and is deleted", p, err)
	}
	return p, ""
}

// checkExt4 reads the superblock magic of the image at p.
func checkExt4(p string) error {
	f, err := os.Open(p)
	if err != nil {
		return err
	}
	defer f.Close()
	var b [2]byte
	if _, err := f.ReadAt(b[:], ext4MagicOffset); err != nil {
		return fmt.Errorf("read its superblock: %w", err)
	}
	if m := binary.LittleEndian.Uint16(b[:]); m != ext4Magic {
		return fmt.Errorf("no ext4 superblock (magic %#04x)", m)
	}
	return nil
}

// pending is a disk copied into an entry but not yet made its disk
// (commit), so the guest's filesystem can be thawed before the copy is
// synced.
type pending struct {
	tmp, final, entry string
	method            string
	data              int64
}

// copyIn copies disk, the worker's, into a temporary file in the entry of
// worker name in namespace ns, as the cached disk of record on sizeMB.
func (c diskCache) copyIn(ns, name, record string, sizeMB uint64, disk string) (*pending, error) {
	if c.dir == "" {
		return nil, errors.New("the install cache is off")
	}
	entry := c.entryDir(ns, name)
	if err := os.MkdirAll(entry, 0o700); err != nil {
		return nil, err
	}
	f, err := os.CreateTemp(entry, ".tmp-*.ext4")
	if err != nil {
		return nil, err
	}
	tmp := f.Name()
	_ = f.Close()
	_ = os.Remove(tmp) // copyDisk creates it, exclusively
	method, data, err := copyDisk(disk, tmp)
	if err != nil {
		return nil, err
	}
	return &pending{tmp: tmp, final: filepath.Join(entry, diskFile(record, sizeMB)), entry: entry, method: method, data: data}, nil
}

// commit syncs the copy and makes it the entry's disk, deleting the disk
// of any other key (and what an interrupted copy left).
func (p *pending) commit(ns, name string) error {
	f, err := os.OpenFile(p.tmp, os.O_RDWR, 0)
	if err == nil {
		err = f.Sync()
		if cerr := f.Close(); err == nil {
			err = cerr
		}
	}
	if err == nil {
		err = os.Rename(p.tmp, p.final)
	}
	if err != nil {
		_ = os.Remove(p.tmp)
		return err
	}
	des, err := os.ReadDir(p.entry)
	if err != nil {
		return err
	}
	for _, de := range des {
		n := de.Name()
		if n != filepath.Base(p.final) && (strings.HasPrefix(n, "disk-") || strings.HasPrefix(n, ".tmp-")) {
			_ = os.Remove(filepath.Join(p.entry, n))
		}
	}
	return os.WriteFile(filepath.Join(p.entry, ownerFile),
		fmt.Appendf(nil, "namespace %q\nworker %q\n", ns, name), 0o600)
}

// restore copies the cached disk cached to disk, the new worker's, which
// must not exist yet; a failed copy leaves no disk behind.
func restore(cached, disk string) (method string, err error) {
	tmp := disk + ".tmp"
	_ = os.Remove(tmp)
	method, _, err = copyDisk(cached, tmp)
	if err == nil {
		err = os.Rename(tmp, disk)
	}
	if err != nil {
		_ = os.Remove(tmp)
		return "", err
	}
	return method, nil
}

// remove deletes the entry of worker name in namespace ns.
func (c diskCache) remove(ns, name string) error {
	if c.dir == "" {
		return nil
	}
	return os.RemoveAll(c.entryDir(ns, name))
}

// hostManifests hashes the install manifests at the top of the worker's
// directory root that the copy will send (rule), as the copy itself does
// (tarStats.Manifests): the install's key before the VM boots, to choose
// its disk.
func hostManifests(root string, rule copyRule) (map[string]string, error) {
	des, err := os.ReadDir(root)
	if err != nil {
		return nil, err
	}
	var out map[string]string
	for _, de := range des {
		n := de.Name()
		full := filepath.Join(root, n)
		if !isInstallManifest(n) || !de.Type().IsRegular() {
			continue
		}
		if _, skip := rule.skip(n, full); skip {
			continue
		}
		sum, err := fileSum(full)
		if err != nil {
			return nil, err
		}
		if out == nil {
			out = map[string]string{}
		}
		out[n] = sum
	}
	return out, nil
}

func fileSum(p string) (string, error) {
	f, err := os.Open(p)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// captureAutoThaw bounds how long the guest stays frozen for a capture
// if the host never thaws it: the copy of a disk takes well under a
// second, minutes under heavy load at worst.
const captureAutoThaw = 2 * time.Minute

// installEnv is the environment the install step runs with, as
// configure-guest makes it (b.Env), known before the VM boots.
func installEnv(b *boot.Boot) []string {
	return boot.MergeEnv([]string{"HOME=/root"}, b.Image.Config.Env, b.Spec.Env)
}

// restoreCachedDisk makes disk, the new worker's, a copy of the install
// cache's disk for this worker's install, when there is one; it reports
// whether it did. Anything amiss (no entry, an unusable one, a failed
// copy) leaves it to a fresh disk and the install step, with a note.
func (w *workerVM) restoreCachedDisk(b *boot.Boot, pl *workerPlan, disk string) bool {
	if pl.req.Install == "" {
		return false
	}
	rule := copyRule{include: pl.req.Include, exclude: pl.req.Exclude}
	manifests, err := hostManifests(pl.hostDir, rule)
	if err != nil {
		w.note("install cache: not used: read the manifests of %s: %v", pl.hostDir, err)
		return false
	}
	record := newInstallInputs(pl.req.Install, installEnv(b), b.Image.Digest, manifests).encode()
	cached, why := w.set.cache.lookup(pl.req.Namespace, pl.req.Name, record, w.set.diskMB)
	if cached == "" {
		w.note("install cache: %s: a fresh disk, and the install step runs", why)
		return false
	}
	t0 := time.Now()
	method, err := restore(cached, disk)
	if err != nil {
		w.note("install cache: the copy of the cached disk %s failed (%v): a fresh disk, and the install step runs", cached, err)
		return false
	}
	w.note("started from the cached disk of this install (%s, by %s in %s): the install step's result is on it", cached, method, roundDur(time.Since(t0)))
	return true
}

// captureDisk keeps the worker's disk, right after its install succeeded
// with the inputs record, in the install cache: the guest's filesystem is
// frozen (consistent, its journal clean) while the host copies the disk,
// then thawed. A capture that fails costs the next new worker an install,
// never this start: it is a note.
func (w *workerVM) captureDisk(ctx context.Context, b *boot.Boot, pl *workerPlan, record string) {
	c := w.set.cache
	if c.dir == "" || b.DataDisk == "" {
		return
	}
	fi, err := os.Stat(b.DataDisk)
	if err != nil {
		w.note("install cache: not kept: %v", err)
		return
	}
	sizeMB := uint64(fi.Size() >> 20)
	t0 := time.Now()
	if err := b.Agent.FreezeUpper(ctx, captureAutoThaw); err != nil {
		w.note("install cache: not kept: %v", err)
		return
	}
	p, cerr := c.copyIn(pl.req.Namespace, pl.req.Name, record, sizeMB, b.DataDisk)
	frozen := time.Since(t0)
	// Thawed whatever became of the copy, and of ctx: a stop that
	// cut this start short still powers the guest off cleanly.
	tctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	terr := b.Agent.ThawUpper(tctx)
	cancel()
	if terr != nil {
		w.note("install cache: thaw the guest's disk: %v (the guest thaws it by itself within %s)", terr, captureAutoThaw)
	}
	if cerr != nil {
		w.note("install cache: not kept: copy the disk: %v", cerr)
		return
	}
	if err := p.commit(pl.req.Namespace, pl.req.Name); err != nil {
		w.note("install cache: not kept: %v", err)
		return
	}
	w.note("install cache: kept this disk for a new worker %q in namespace %q with the same install (%s, %d MiB of data; the guest's disk frozen for %s)",
		pl.req.Name, pl.req.Namespace, p.method, p.data>>20, roundDur(frozen))
}
