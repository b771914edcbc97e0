package nsmgr

import (
	"encoding/binary"
	"fmt"

	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"
)

// newVethEcho creates a veth pair through sock (a rtnetlink socket in the
// host netns): host side hostName there, peer peerName created directly
// in the netns of nsFD, both with txqlen 0 (what the netlink library's
// LinkAdd of a netlink.Veth with zero attributes asks for). It asks the
// kernel to echo the new link (NLM_F_ECHO, honoured for a created link
// since Linux 6.3) and returns the host side's ifindex and its peer's
// (IFLA_LINK) from the echo, which spares the two lookups by name the
// library's LinkAdd and the guest's first step would make. Without an
// echo (an older kernel, or echo false) both are 0 and the caller looks
// them up.
func newVethEcho(sock *nl.SocketHandle, hostName, peerName string, nsFD int, echo bool) (index, peerIndex int, err error) {
	flags := unix.NLM_F_CREATE | unix.NLM_F_EXCL | unix.NLM_F_ACK
	if echo {
		flags |= unix.NLM_F_ECHO
	}
	req := nl.NewNetlinkRequest(unix.RTM_NEWLINK, flags)
	req.Sockets = map[int]*nl.SocketHandle{unix.NETLINK_ROUTE: sock}
	req.AddData(nl.NewIfInfomsg(unix.AF_UNSPEC))
	req.AddData(nl.NewRtAttr(unix.IFLA_IFNAME, nl.ZeroTerminated(hostName)))
	req.AddData(nl.NewRtAttr(unix.IFLA_TXQLEN, nl.Uint32Attr(0)))
	info := nl.NewRtAttr(unix.IFLA_LINKINFO, nil)
	info.AddRtAttr(nl.IFLA_INFO_KIND, nl.NonZeroTerminated("veth"))
	peer := info.AddRtAttr(nl.IFLA_INFO_DATA, nil).AddRtAttr(nl.VETH_INFO_PEER, nil)
	nl.NewIfInfomsgChild(peer, unix.AF_UNSPEC)
	peer.AddRtAttr(unix.IFLA_IFNAME, nl.ZeroTerminated(peerName))
	peer.AddRtAttr(unix.IFLA_TXQLEN, nl.Uint32Attr(0))
	peer.AddRtAttr(unix.IFLA_NET_NS_FD, nl.Uint32Attr(uint32(nsFD)))
	req.AddData(info)
	msgs, err := req.Execute(unix.NETLINK_ROUTE, unix.RTM_NEWLINK)
	if err != nil {
		return 0, 0, err
	}
	for _, m := range msgs {
		if len(m) < unix.SizeofIfInfomsg {
			continue
		}
		ifi := nl.DeserializeIfInfomsg(m)
		attrs, err := nl.ParseRouteAttr(m[unix.SizeofIfInfomsg:])
		if err != nil {
			return 0, 0, fmt.Errorf("parse the echo of veth %s: %w", hostName, err)
		}
		name, link := "", 0
		for _, a := range attrs {
			switch a.Attr.Type {
			case unix.IFLA_IFNAME:
				name = string(trimNUL(a.Value))
			case unix.IFLA_LINK:
				if len(a.Value) >= 4 {
					link = int(binary.NativeEndian.Uint32(a.Value))
				}
			}
		}
		if name == hostName && ifi.Index > 0 && link > 0 {
			return int(ifi.Index), link, nil
		}
	}
	return 0, 0, nil
}

func trimNUL(b []byte) []byte {
	for len(b) > 0 && b[len(b)-1] == 0 {
		b = b[:len(b)-1]
	}
	return b
}
