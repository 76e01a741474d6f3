package configuration

import (
	"context"
	"encoding/json"
)

// Store persists configuration values. The schema is never stored: it
// comes back when the owning worker registers again after a restart.
type Store interface {
	// Load reads every stored entry. Problems with single entries come
	// back as warnings (the entry is skipped); err means the store itself
	// is unusable.
	Load(ctx context.Context) (entries []StoredEntry, warnings []error, err error)
	// Put writes one entry atomically.
	Put(ctx context.Context, e StoredEntry) error
	// Delete removes one entry; a missing entry is not an error. Like
	// Put, it is not reported by Watch.
	Delete(ctx context.Context, id string) error
	// Watch reports changes made behind the worker's back (hand edits)
	// until ctx ends. Writes made through Put are not reported.
	Watch(ctx context.Context, fn func(Change))
	// Describe names the store in logs and errors ("fs:/srv/config").
	Describe() string
}

// StoredEntry is what a store keeps per id.
type StoredEntry struct {
	ID          string
	Name        string
	Description string
	Value       json.RawMessage // JSON; never nil ("null" for no value)
}

// Change is one entry edited, created or deleted outside the worker.
type Change struct {
	ID      string
	Entry   *StoredEntry // nil when Deleted or Err is set
	Deleted bool
	Err     error // the new content could not be read; the old value stays
	Source  string
}
