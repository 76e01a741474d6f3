package engine

import (
	"io"
	"strings"
	"testing"

	"gotest.tools/v3/assert"
	is "gotest.tools/v3/assert/cmp"
	"gotest.tools/v3/poll"
)

// TestCreateOwnedChannelBound: an owner gets limit channels and then a
// LIMIT_EXCEEDED error; finishing one gives its slot back; another owner
// is not held up by the first one's count.
func TestCreateOwnedChannelBound(t *testing.T) {
	te := startEngine(t, Options{})
	const limit = 3
	var refs [][2]string
	for range limit {
		w, r, err := te.CreateOwnedChannel("adapter:default/a", limit)
		assert.NilError(t, err)
		assert.Equal(t, w.ChannelID, r.ChannelID)
		refs = append(refs, [2]string{w.ChannelID, w.AccessKey})
	}
	w0, r0 := te.channels.get(refs[0][0]).refs()

	_, _, err := te.CreateOwnedChannel("adapter:default/a", limit)
	assert.ErrorContains(t, err, CodeLimitExceeded)
	assert.Check(t, is.Contains(err.Error(), "adapter:default/a holds 3 channels"))

	_, _, err = te.CreateOwnedChannel("adapter:default/b", limit)
	assert.NilError(t, err, "another owner has its own count")

	// Finish the first channel: written, closed, read to its end.
	wr, err := te.OpenChannelWriter(w0)
	assert.NilError(t, err)
	_, err = wr.Write([]byte("done"))
	assert.NilError(t, err)
	assert.NilError(t, wr.Close())
	rd, err := te.OpenChannelReader(r0)
	assert.NilError(t, err)
	b, err := io.ReadAll(rd)
	assert.NilError(t, err)
	assert.Equal(t, string(b), "done")
	assert.NilError(t, rd.Close())
	poll.WaitOn(t, func(poll.LogT) poll.Result {
		if n := te.channels.owned("adapter:default/a"); n < limit {
			return poll.Success()
		}
		return poll.Continue("owner still holds its channels")
	})
	_, _, err = te.CreateOwnedChannel("adapter:default/a", limit)
	assert.NilError(t, err, "a finished channel gives its slot back")
}

// TestCreateOwnedChannelEngineBound: the engine-wide MaxChannels holds
// whatever an owner's own limit says.
func TestCreateOwnedChannelEngineBound(t *testing.T) {
	te := startEngine(t, Options{})
	for range MaxChannels {
		te.CreateChannel(0)
	}
	_, _, err := te.CreateOwnedChannel("adapter:default/a", MaxChannels*2)
	assert.ErrorContains(t, err, CodeLimitExceeded)
	assert.Check(t, strings.Contains(err.Error(), "the engine holds"))
}
