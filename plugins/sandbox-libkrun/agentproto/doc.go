// Package agentproto is the protocol between the host (the VM runner's
// agentclient) and the guest agent that runs as PID 1 inside a sandbox VM.
//
// The channel is one byte stream (a named virtio-console port, "iii.exec",
// seen by the host as a unix socket). Over it, both sides exchange frames:
//
//	u32 payload length (big endian) | u8 kind | u32 stream id | payload
//
// A payload is at most MaxPayload bytes. Control messages are JSON objects
// tagged by "type"; a control message larger than one frame travels as
// KindControlPart frames closed by a KindControl frame. Standard input,
// output, error and file contents travel as raw bytes in data frames of
// their own kinds (never base64); an empty data frame ends its channel.
//
// Every connection starts with the host sending Magic and a KindHello frame,
// and the guest answering with Magic and its own KindHello (protocol version,
// agent version, capabilities). The magic lets the reader of a fresh
// connection skip a partial frame left over from a previous connection.
// The host refuses a guest whose protocol major differs from ProtocolMajor
// and refuses only the operations whose capability the guest lacks.
//
// Streams multiplex many concurrent operations over the one port. The host
// opens a stream by sending the request (a control message) on a stream id
// it has not used before on this connection; the stream ends with one
// terminal message from the guest (exit, result or error). Data frames are
// flow controlled per stream and direction: a sender may have at most
// InitialWindow unacknowledged bytes in flight, and the receiver returns
// credit with KindWindow frames once it has consumed the bytes. This keeps
// one slow reader from stalling the whole port and bounds both sides'
// buffers.
//
// docs/guest-agent.md describes the protocol for people.
package agentproto
