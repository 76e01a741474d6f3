package sdk

import (
	"testing"

	"google.golang.org/grpc/mem"
	"gotest.tools/v3/assert"

	"github.com/iii-sandbox/iii/contract"
)

// TestChunkBufferPool: an adapter built with the SDK marshals and reads
// the contract's stream chunks in 128 KiB buffers, not gRPC's 1 MiB class.
func TestChunkBufferPool(t *testing.T) {
	pool := mem.DefaultBufferPool()
	b := pool.Get(contract.ChunkSize + 16)
	defer pool.Put(b)
	assert.Equal(t, cap(*b), 128<<10)
}
