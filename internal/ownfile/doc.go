// Package ownfile opens secret files the way the engine reads them (the
// engine token, the persisted credentials): without following a final
// symbolic link, and with the owner's uid at hand so a file another user
// could have written is refused.
package ownfile
