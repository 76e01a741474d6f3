package pluginhost

import (
	"testing"

	"google.golang.org/grpc/mem"
	"gotest.tools/v3/assert"

	"github.com/iii-sandbox/iii/contract"
)

// TestChunkBufferPool: importing the plugin host sizes gRPC's default pool
// for the contract's stream chunks: a chunk and its framing take a 128 KiB
// buffer, not gRPC's 1 MiB class.
func TestChunkBufferPool(t *testing.T) {
	pool := mem.DefaultBufferPool()
	b := pool.Get(contract.ChunkSize + 16)
	defer pool.Put(b)
	assert.Equal(t, len(*b), contract.ChunkSize+16)
	assert.Equal(t, cap(*b), 128<<10)
	small := pool.Get(100)
	defer pool.Put(small)
	assert.Equal(t, cap(*small), 256, "gRPC's own classes stay")
}
