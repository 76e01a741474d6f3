// Package ownfile reads secret files the way iii reads them (the engine
// token, the persisted credentials, a sandbox host's credential): without
// following a final symbolic link, and refusing a file another user owns
// or that other users may read or change, since its content then is not
// the user's own.
package ownfile
