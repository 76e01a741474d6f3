package main

import "runtime"

// Recipe describes one preset image.
type Recipe struct {
	Name string
	// Ref is the public reference the image is installed under.
	Ref string
	// Packages are the roots of the closure apt resolves.
	Packages []string
	// Exclude are packages kept out of the closure, with whatever only
	// they pulled in; each must be in the closure of Packages.
	Exclude []string `json:",omitempty"`
	// Links are extra symlinks (path -> target) users expect, and the
	// links maintainer scripts would have made (update-alternatives).
	Links map[string]string
	// Bytecode lists the directories whose Python modules are compiled
	// ahead of time, as Debian's maintainer scripts (py3compile) would.
	Bytecode []string
	Env      []string
	Cmd      []string
	// Check runs in a chroot of the root; its output must equal Want.
	Check []string
	Want  string
}

// basePackages give every image a libc, a /bin/sh, the core utilities
// (env, ls, cat, …), tar and gzip (an install step's `tar xzf` of a
// vendored archive) and the CA bundle for outbound TLS.
func basePackages() []string {
	return []string{"libc6", "dash", "coreutils", "tar", "gzip", "ca-certificates"}
}

// tarCheck packs a file with tar czf and unpacks it with tar xzf in the
// image's /tmp, then prints it: 4.
const tarCheck = "cd /tmp && rm -rf iii-t && mkdir -p iii-t/in/a && echo 4 > iii-t/in/a/f && tar czf iii-t/a.tgz -C iii-t/in a && gzip -t iii-t/a.tgz && mkdir iii-t/out && tar xzf iii-t/a.tgz -C iii-t/out && cat iii-t/out/a/f && rm -rf iii-t"

const defaultPath = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// multiarch is Debian's library directory name for this architecture.
func multiarch() string {
	if runtime.GOARCH == "arm64" {
		return "aarch64-linux-gnu"
	}
	return "x86_64-linux-gnu"
}

// pythonCheck imports what the preset promises, then prints 4.
const pythonCheck = "import json, sqlite3, asyncio, decimal, dataclasses, urllib.request, unittest, venv, pip, numpy, pandas, matplotlib.pyplot; print(2+2)"

func recipes() []Recipe {
	lib := "usr/lib/" + multiarch() + "/"
	return []Recipe{
		{
			Name: "python",
			Ref:  "docker.io/iiidev/python:latest",
			// The whole standard library, pip and venv, and the usual data
			// stack of a code interpreter.
			Packages: append(basePackages(), "python3", "python3-pip", "python3-venv",
				"python3-numpy", "python3-pandas", "python3-matplotlib"),
			// python3-fonttools (matplotlib) depends on python3-scipy, which
			// depends on python3-pythran, which depends on g++, libboost-dev,
			// OpenBLAS's development files and python3-dev: most of the
			// image. Nothing the preset promises imports scipy.
			Exclude: []string{"python3-scipy"},
			Links: map[string]string{
				// `python` is what people type (the CLI guide's own example).
				"usr/bin/python": "python3",
				"usr/bin/which":  "which.debianutils",
				// numpy links libblas.so.3 and liblapack.so.3, links
				// update-alternatives makes. They point at the reference BLAS
				// and LAPACK, not OpenBLAS (also in the closure): OpenBLAS
				// picks its kernels from CPUID, and under QEMU TCG the one it
				// picks dies with SIGILL in numpy.dot.
				lib + "libblas.so.3":   "blas/libblas.so.3",
				lib + "liblapack.so.3": "lapack/liblapack.so.3",
			},
			// Without .pyc files every import compiles from source, which
			// takes seconds per package under QEMU TCG.
			Bytecode: []string{"usr/lib/python3.11", "usr/lib/python3/dist-packages"},
			// MPLBACKEND=Agg: matplotlib draws without a display.
			Env:   []string{defaultPath, "LANG=C.UTF-8", "PYTHONDONTWRITEBYTECODE=1", "MPLBACKEND=Agg"},
			Cmd:   []string{"python3"},
			Check: []string{"/usr/bin/env", "python3", "-c", pythonCheck},
			Want:  "4\n",
		},
		{
			Name:     "node",
			Ref:      "docker.io/iiidev/node:latest",
			Packages: append(basePackages(), "nodejs", "npm"),
			Links:    map[string]string{"usr/bin/nodejs": "node", "usr/bin/which": "which.debianutils"},
			Env:      []string{defaultPath, "LANG=C.UTF-8"},
			Cmd:      []string{"node"},
			Check:    []string{"/bin/sh", "-c", "(" + tarCheck + ") >&2 && npm --version >&2 && node -e 'console.log(2+2)'"},
			Want:     "4\n",
		},
	}
}
