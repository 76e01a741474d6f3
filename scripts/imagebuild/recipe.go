package main

// Recipe describes one preset image.
type Recipe struct {
	Name string
	// Ref is the public reference the image is installed under.
	Ref string
	// Packages are the roots of the closure apt resolves.
	Packages []string
	// Links are extra symlinks (path -> target) users expect.
	Links map[string]string
	Env   []string
	Cmd   []string
	// Check runs in a chroot of the root; its output must equal Want.
	Check []string
	Want  string
}

// basePackages give every image a libc, a /bin/sh, the core utilities
// (env, ls, cat, …) and the CA bundle for outbound TLS.
func basePackages() []string {
	return []string{"libc6", "dash", "coreutils", "ca-certificates"}
}

const defaultPath = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

func recipes() []Recipe {
	return []Recipe{
		{
			Name:     "python",
			Ref:      "docker.io/iiidev/python:latest",
			Packages: append(basePackages(), "python3-minimal"),
			// `python` is what people type (the CLI guide's own example).
			Links: map[string]string{"usr/bin/python": "python3"},
			Env:   []string{defaultPath, "LANG=C.UTF-8", "PYTHONDONTWRITEBYTECODE=1"},
			Cmd:   []string{"python3"},
			Check: []string{"/usr/bin/env", "python3", "-c", "print(2+2)"},
			Want:  "4\n",
		},
		{
			Name:     "node",
			Ref:      "docker.io/iiidev/node:latest",
			Packages: append(basePackages(), "nodejs"),
			Links:    map[string]string{"usr/bin/nodejs": "node"},
			Env:      []string{defaultPath, "LANG=C.UTF-8"},
			Cmd:      []string{"node"},
			Check:    []string{"/usr/bin/env", "node", "-e", "console.log(2+2)"},
			Want:     "4\n",
		},
	}
}
