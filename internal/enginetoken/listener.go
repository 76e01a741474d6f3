package enginetoken

import (
	"bufio"
	"net"
	"os"
	"strconv"
	"strings"
)

// procNetFiles list the kernel's TCP sockets with their owners (Linux).
var procNetFiles = []string{"/proc/net/tcp", "/proc/net/tcp6"}

// MayReceive reports whether a token found on disk may be sent, without
// being asked to, to the engine at hostport ("host:port"): the host is a
// loopback address (127.0.0.0/8, ::1, or localhost), and no other user
// listens on that port where the system shows who does (Linux:
// /proc/net/tcp and tcp6). So a discovered token never leaves the host,
// and never goes to a port another local user took before the engine
// (which would otherwise collect it). A token given explicitly (a flag,
// III_ENGINE_TOKEN) is the user's choice and is not checked here.
func MayReceive(hostport string) bool {
	host, portStr, err := net.SplitHostPort(hostport)
	if err != nil {
		return false
	}
	if !loopback(host) {
		return false
	}
	port, err := strconv.ParseUint(portStr, 10, 16)
	if err != nil {
		return false
	}
	return !otherUserListens(uint16(port), os.Getuid())
}

func loopback(host string) bool {
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(strings.TrimSuffix(strings.TrimPrefix(host, "["), "]"))
	return ip != nil && ip.IsLoopback()
}

// otherUserListens reports whether a socket listening on port (any
// address) belongs to a uid other than uid. Where the kernel's tables
// cannot be read it reports false: the loopback rule alone applies.
func otherUserListens(port uint16, uid int) bool {
	for _, path := range procNetFiles {
		f, err := os.Open(path)
		if err != nil {
			continue
		}
		found := scanListeners(f, port, uid)
		f.Close()
		if found {
			return true
		}
	}
	return false
}

// scanListeners reads one /proc/net/tcp table: after a header line, one
// socket per line, "sl local_address rem_address st ... uid ...", where
// local_address is HEXIP:HEXPORT, st 0A is LISTEN and uid the 8th field.
func scanListeners(f *os.File, port uint16, uid int) bool {
	sc := bufio.NewScanner(f)
	first := true
	for sc.Scan() {
		if first {
			first = false
			continue
		}
		fields := strings.Fields(sc.Text())
		if len(fields) < 8 || fields[3] != "0A" {
			continue
		}
		i := strings.LastIndexByte(fields[1], ':')
		if i < 0 {
			continue
		}
		p, err := strconv.ParseUint(fields[1][i+1:], 16, 16)
		if err != nil || uint16(p) != port {
			continue
		}
		owner, err := strconv.Atoi(fields[7])
		if err == nil && owner != uid {
			return true
		}
	}
	return false
}
