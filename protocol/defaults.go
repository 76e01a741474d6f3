package protocol

// DefaultNamespace is where calls without a namespace resolve, and where
// engine::* and configuration::* always live.
const DefaultNamespace = "default"

// DefaultPort is the port the engine's WebSocket listener
// (iii-worker-manager) serves workers on when config.yaml does not say
// otherwise. Workers, Compose and the engine's config all agree on it, so it
// is part of the protocol rather than of host/config.
const DefaultPort = 49134
