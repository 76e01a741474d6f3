package stream

import (
	"net"
	"net/http"
	"net/netip"
	"os"
	"strconv"
	"strings"

	"github.com/iii-sandbox/iii/internal/peeruid"
)

// otherUser is why a client of a socket without auth_function is refused,
// "" when it is let in: a loopback client whose socket belongs to another
// user than the engine's (as the kernel's socket tables show) is refused
// unless it presents the engine token. The engine user's own processes
// are the same trust as the engine token's file, which they can read;
// another local user's are not (docs/security.md, "Who sees what"). A
// client beyond loopback (a host widened on purpose) and a system where
// the tables cannot be read keep iii 0.26's rule: every client is let in.
func otherUser(r *http.Request, isAdmin func(string) bool, lookup func(server, peer netip.AddrPort) (int, bool), self int) string {
	if tok := bearerToken(r); tok != "" && isAdmin(tok) {
		return ""
	}
	local, ok := r.Context().Value(http.LocalAddrContextKey).(net.Addr)
	if !ok {
		return ""
	}
	server, err1 := netip.ParseAddrPort(local.String())
	peer, err2 := netip.ParseAddrPort(r.RemoteAddr)
	if err1 != nil || err2 != nil || !peer.Addr().Unmap().IsLoopback() {
		return ""
	}
	uid, ok := lookup(server, peer)
	if !ok || uid == self {
		return ""
	}
	return "uid " + strconv.Itoa(uid) + " is not the engine's user (uid " + strconv.Itoa(self) +
		"): present the engine token (Authorization: Bearer), or give iii-stream an auth_function"
}

func (w *Worker) refuseOtherUser(r *http.Request) string {
	return otherUser(r, w.eng.IsAdminToken, peeruid.Of, os.Getuid())
}

func bearerToken(r *http.Request) string {
	h := r.Header.Get("Authorization")
	if len(h) > 7 && strings.EqualFold(h[:7], "bearer ") {
		return strings.TrimSpace(h[7:])
	}
	return ""
}
