// Package nfnetlink holds the small netfilter netlink clients the table
// needs beyond google/nftables, over mdlayher/netlink: ctnetlink (dump the
// IPv4 conntrack entries of a netns, delete one by its tuple:
// conntrack.go; subscribe to its NEW and DESTROY events with their
// accounting: ctevents.go), NFLOG (bind a group, read its packet messages: nflog.go),
// NFQUEUE (bind a queue, drain its waiting packets at each wake-up, send
// a batch of verdicts with marks in one datagram: the name check's,
// nfqueue.go) and single set-element reads by key (the counter of one element without
// dumping its set: elements.go), with Conn, a lazily dialed
// NETLINK_NETFILTER connection replaced after any error.
//
// It is a package because each is a kernel protocol client with parsers of
// kernel messages (parseFlow, parseTuple, parseFlowEvent, parseCounters, parseElemCounter, ParsePacket,
// ParseIPv4, ParseQueued, SplitMessages), and those are fuzzed (fuzz_test.go; make fuzz runs every
// target): each fuzz target also encodes what the kernel would send and
// checks that it reads back. It knows nothing of sessions or policies; the
// table (netpolicy/nft) gives the messages their meaning.
package nfnetlink
