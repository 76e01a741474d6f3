// Package usernet is a VM's network: a user-mode network stack (gVisor's
// netstack) on the host end of the VM's NIC, run by the VM's runner.
//
// The NIC is a byte stream of length-prefixed Ethernet frames (QEMU's
// `-netdev socket`, libkrun's krun_add_net_unixstream). The guest sees the
// layout of QEMU's user network: it is 10.0.2.15/24, the gateway 10.0.2.2
// and the DNS server 10.0.2.3 are this stack's. The stack answers ARP for
// those two addresses and serves DNS on the second (asking the host's
// nameservers); every TCP connection and UDP flow the guest opens anywhere
// else is relayed through a socket this process dials, and only after the
// Policy allowed the destination:
//
//   - never loopback, unspecified, link-local (the cloud metadata address
//     among it), multicast, broadcast or reserved addresses, nor the
//     guest's own virtual network (the gateway above all: QEMU's and
//     passt's map it to the host's loopback, which is how a guest could
//     reach the engine), nor any address the host itself owns;
//   - private ranges (10/8, 172.16/12, 192.168/16, 100.64/10, fc00::/7)
//     only when the adapter's network_allow_cidrs names them;
//   - the rest of the internet.
//
// A refused TCP connection gets a RST, a refused UDP datagram is dropped.
// The one way to the host is an explicit Forward of a gateway port to a
// loopback address (VM workers reach the engine so), optionally carrying a
// bearer credential the guest never sees. Flows are capped per VM, buffers
// bounded, and Serve returns only once every goroutine it started ended.
package usernet
