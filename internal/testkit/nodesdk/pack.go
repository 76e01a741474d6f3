package nodesdk

import (
	"compress/gzip"
	_ "embed"
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// unpackJS is a VM worker's install step, `node unpack.mjs`: it turns
// vendor.pack.gz into node_modules in the guest. The copy of a worker's
// directory into its VM leaves node_modules out at any depth (host builds
// may not run in the guest), so tests ship the SDK in this pack instead.
//
//go:embed unpack.mjs
var unpackJS []byte

// Unpacker and Pack are the file names WriteWorkerFiles writes.
const (
	Unpacker = "unpack.mjs"
	Pack     = "vendor.pack.gz"
)

// WriteWorkerFiles writes unpack.mjs and vendor.pack.gz (the SDK in
// modules, packed) into dir: the install step of a Node VM worker whose
// manifest says `install: node unpack.mjs`.
func WriteWorkerFiles(dir, modules string) error {
	if err := os.WriteFile(filepath.Join(dir, Unpacker), unpackJS, 0o644); err != nil {
		return err
	}
	return WritePack(modules, filepath.Join(dir, Pack))
}

// WritePack writes the regular files under modules to dst in the format
// unpack.mjs reads, gzip of records: u32 path length, path (slash
// separated, relative to modules), u32 mode, u32 size, bytes; big endian.
// It leaves out what Node never loads (types, source maps, docs), to keep
// the copy into the VM small.
func WritePack(modules, dst string) (err error) {
	f, err := os.Create(dst)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, f.Close()) }()
	zw := gzip.NewWriter(f)
	w := &recordWriter{w: zw}
	// Files Node never loads: types, source maps, docs.
	skippedSuffixes := []string{".map", ".d.ts", ".md", ".ts", ".d.mts", ".d.cts"}
	err = filepath.WalkDir(modules, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(modules, p)
		if err != nil {
			return err
		}
		if d.IsDir() {
			if rel == "@types" || rel == "undici-types" {
				return filepath.SkipDir
			}
			return nil
		}
		for _, suf := range skippedSuffixes {
			if strings.HasSuffix(p, suf) {
				return nil
			}
		}
		if !d.Type().IsRegular() {
			return nil
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		return w.record(filepath.ToSlash(rel), uint32(fi.Mode().Perm()), b)
	})
	if err != nil {
		return fmt.Errorf("pack %s: %w", modules, err)
	}
	return zw.Close()
}

// recordWriter writes pack records, keeping the first write error.
type recordWriter struct {
	w   *gzip.Writer
	hdr [4]byte
}

func (r *recordWriter) u32(v uint32) error {
	binary.BigEndian.PutUint32(r.hdr[:], v)
	_, err := r.w.Write(r.hdr[:])
	return err
}

func (r *recordWriter) record(name string, mode uint32, data []byte) error {
	if err := r.u32(uint32(len(name))); err != nil {
		return err
	}
	if _, err := r.w.Write([]byte(name)); err != nil {
		return err
	}
	if err := r.u32(mode); err != nil {
		return err
	}
	if err := r.u32(uint32(len(data))); err != nil {
		return err
	}
	_, err := r.w.Write(data)
	return err
}
