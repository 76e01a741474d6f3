package state

import (
	"context"
	"encoding/json"
	"strconv"
	"sync"
	"time"

	"github.com/google/uuid"
)

// state::list_entries pages through a snapshot of a scope (upstream's
// bounds).
const (
	snapshotTTL       = 120 * time.Second
	maxSnapshots      = 16
	defaultPageLimit  = 100
	maxPageLimit      = 1000
	defaultPageBytes  = 1_000_000
	minPageBytes      = 256
	maxPageBytes      = 8_000_000
	maxEntriesScopeLn = 1024
)

type snapshot struct {
	scope   string
	rows    [][]byte // each row encoded: ["key",value]
	offset  int
	expires time.Time
}

type snapshots struct {
	mu  sync.Mutex
	m   map[string]*snapshot // cursor → snapshot
	now func() time.Time
}

func (s *snapshots) init() {
	s.m = map[string]*snapshot{}
	s.now = time.Now
}

// EntriesPage is state::list_entries' answer; entries are [key, value]
// pairs.
type EntriesPage struct {
	Entries    []json.RawMessage `json:"entries"`
	NextCursor *string           `json:"next_cursor"`
	Done       bool              `json:"done"`
	Offset     int               `json:"offset"`
	Total      int               `json:"total"`
}

// ListEntries is state::list_entries: {scope, cursor?, limit?, max_bytes?}.
// A first call captures the scope; each page hands out a single-use
// cursor to the next, valid for 120 s; at most 16 snapshots are open.
func (w *Worker) ListEntries(ctx context.Context, raw json.RawMessage) (*EntriesPage, error) {
	var r struct {
		Scope    *string `json:"scope"`
		Cursor   *string `json:"cursor"`
		Limit    *int    `json:"limit"`
		MaxBytes *int    `json:"max_bytes"`
	}
	if err := decodeObject(raw, &r); err != nil {
		return nil, err
	}
	if r.Scope == nil {
		return nil, errorf(CodeInvalidInput, "missing field `scope` (a string)")
	}
	if len(*r.Scope) > maxEntriesScopeLn {
		return nil, errorf(CodeInvalidInput, "scope is %d bytes; at most %d", len(*r.Scope), maxEntriesScopeLn)
	}
	limit, maxBytes := defaultPageLimit, defaultPageBytes
	if r.Limit != nil {
		if *r.Limit < 1 || *r.Limit > maxPageLimit {
			return nil, errorf(CodeInvalidInput, "limit %d is outside 1..%d", *r.Limit, maxPageLimit)
		}
		limit = *r.Limit
	}
	if r.MaxBytes != nil {
		if *r.MaxBytes < minPageBytes || *r.MaxBytes > maxPageBytes {
			return nil, errorf(CodeInvalidInput, "max_bytes %d is outside %d..%d", *r.MaxBytes, minPageBytes, maxPageBytes)
		}
		maxBytes = *r.MaxBytes
	}
	s := &w.snaps
	s.mu.Lock()
	now := s.now()
	for c, sn := range s.m {
		if now.After(sn.expires) {
			delete(s.m, c)
		}
	}
	var sn *snapshot
	fresh := r.Cursor == nil
	if !fresh {
		sn = s.m[*r.Cursor]
		if sn == nil || sn.scope != *r.Scope {
			s.mu.Unlock()
			return nil, errorf(CodeInvalidCursor, "cursor %q is unknown, expired (120 s), already used, or of another scope; start again without a cursor", *r.Cursor)
		}
		delete(s.m, *r.Cursor)
	} else {
		if len(s.m) >= maxSnapshots {
			s.mu.Unlock()
			return nil, errorf(CodeSnapshotCapacity, "%d snapshots are open; finish one or wait for one to expire (120 s)", maxSnapshots)
		}
		s.mu.Unlock()
		es, err := w.store.Entries(ctx, *r.Scope)
		if err != nil {
			return nil, wrap(CodeListError, "Failed to list entries", err)
		}
		sn = &snapshot{scope: *r.Scope, rows: make([][]byte, len(es))}
		for i, e := range es {
			k, _ := json.Marshal(e.Key)
			sn.rows[i] = append(append(append(append([]byte{'['}, k...), ','), e.Value...), ']')
		}
		s.mu.Lock()
	}
	// The page's envelope at its largest (a cursor, the counts' digits).
	envelope := len(`{"entries":[],"next_cursor":"`) + 36 + len(`","done":false,"offset":,"total":}`) + 2*len(strconv.Itoa(len(sn.rows)))
	page := &EntriesPage{Entries: []json.RawMessage{}, Offset: sn.offset, Total: len(sn.rows)}
	size := envelope
	i := sn.offset
	for ; i < len(sn.rows) && len(page.Entries) < limit; i++ {
		n := len(sn.rows[i]) + 1
		if size+n > maxBytes {
			if len(page.Entries) == 0 {
				s.mu.Unlock()
				return nil, errorf(CodeRowTooLarge, "the entry at offset %d takes %d bytes, more than max_bytes %d allows; raise max_bytes (at most %d)", i, len(sn.rows[i]), maxBytes, maxPageBytes)
			}
			break
		}
		size += n
		page.Entries = append(page.Entries, sn.rows[i])
	}
	sn.offset = i
	if i >= len(sn.rows) {
		page.Done = true
	} else {
		if fresh && len(s.m) >= maxSnapshots {
			// Others opened snapshots while this one was read.
			s.mu.Unlock()
			return nil, errorf(CodeSnapshotCapacity, "%d snapshots are open; finish one or wait for one to expire (120 s)", maxSnapshots)
		}
		c := uuid.NewString()
		sn.expires = now.Add(snapshotTTL)
		s.m[c] = sn
		page.NextCursor = &c
	}
	s.mu.Unlock()
	return page, nil
}
