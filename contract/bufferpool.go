package contract

import (
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/experimental"
	"google.golang.org/grpc/mem"
)

// chunkPoolExponents are gRPC's default buffer pool's size classes (256 B,
// 4 KiB, 16 KiB, 32 KiB, 1 MiB) plus 128 KiB. A ChunkSize stream chunk
// with its framing is just over 64 KiB, which the default pool serves from
// its 1 MiB class, zeroing the whole MiB each time: for every 64 KiB of an
// fs::write or fs::read, the sender's marshal buffer and the receiver's
// read buffer each cleared 1 MiB.
var chunkPoolExponents = []uint8{8, 12, 14, 15, 17, 20}

var chunkPool = sync.OnceValue(func() mem.BufferPool {
	p, err := mem.NewBinaryTieredBufferPool(chunkPoolExponents...)
	if err != nil {
		return mem.DefaultBufferPool() // constant exponents: cannot happen
	}
	return p
})

var chunkPoolOnce sync.Once

// UseChunkBufferPool makes gRPC's process-wide default buffer pool (the
// one its proto codec marshals into, which no option reaches, and the one
// clients dialled afterwards read into) gRPC's default pool with a 128 KiB
// class for the contract's stream chunks. gRPC allows this only while the
// process initialises: call it from an init function, as the plugin host
// and the adapter SDK do. Later calls do nothing.
func UseChunkBufferPool() {
	chunkPoolOnce.Do(func() { experimental.SetDefaultBufferPool(chunkPool()) })
}

// ChunkBufferPoolOption gives a gRPC server the same pool for the messages
// it reads (a server's default pool is fixed when gRPC initialises).
func ChunkBufferPoolOption() grpc.ServerOption { return experimental.BufferPool(chunkPool()) }
