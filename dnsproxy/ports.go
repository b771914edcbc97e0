package dnsproxy

import "github.com/enforcerd/enforcerd/netpolicy"

// entryPorts is the port constraint of one allow entry; nil means any port.
func entryPorts(e netpolicy.Entry) []netpolicy.PortSpec {
	if e.Port == 0 {
		return nil
	}
	return []netpolicy.PortSpec{e.PortSpec}
}
