package dhcpguest

import (
	"errors"
	"fmt"
	"net"
	"os"
	"sync"

	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"
)

// Responder answers one lease on an AF_PACKET socket bound to the tap in a
// session netns (see the package comment). It owns the socket and one
// goroutine; Close stops both.
type Responder struct {
	f       *os.File
	lease   Lease
	mac     net.HardwareAddr // the tap's: the answers' source MAC
	observe func(Outcome, error)
	done    chan struct{}
	once    sync.Once
}

// InNetns runs fn on a thread inside the session netns (nsmgr.Do bound to
// the netns); the socket is made there and stays in that netns.
type InNetns func(fn func() error) error

// Start opens the socket on the interface ifname (the tap) inside the
// netns enter switches to and serves l until Close. observe, when set, is
// called (from the responder's goroutine) with what each frame got.
func Start(enter InNetns, ifname string, l Lease, observe func(Outcome, error)) (*Responder, error) {
	if err := l.Validate(); err != nil {
		return nil, err
	}
	var (
		fd  = -1
		mac net.HardwareAddr
	)
	err := enter(func() error {
		ifi, err := net.InterfaceByName(ifname)
		if err != nil {
			return fmt.Errorf("find %s: %w", ifname, err)
		}
		mac = ifi.HardwareAddr
		fd, err = openSocket(ifi.Index)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("dhcp responder on %s: %w", ifname, err)
	}
	r := &Responder{
		f:       os.NewFile(uintptr(fd), "dhcp:"+ifname), // nonblocking: served by the poller, so Close ends a Read
		lease:   l,
		mac:     mac,
		observe: observe,
		done:    make(chan struct{}),
	}
	go r.serve()
	return r, nil
}

// Close stops the responder and closes its socket. It is idempotent.
func (r *Responder) Close() error {
	var err error
	r.once.Do(func() {
		err = r.f.Close()
		<-r.done
	})
	return err
}

func (r *Responder) serve() {
	defer close(r.done)
	buf := make([]byte, 2048)
	for {
		n, err := r.f.Read(buf)
		if errors.Is(err, os.ErrClosed) {
			return
		}
		if err != nil {
			r.note(Ignored, fmt.Errorf("read: %w", err))
			continue
		}
		reply, outcome, err := Answer(buf[:n], r.lease, r.mac)
		if reply != nil {
			if _, werr := r.f.Write(reply); werr != nil {
				err = errors.Join(err, fmt.Errorf("send %s: %w", outcome, werr))
			}
		}
		r.note(outcome, err)
	}
}

func (r *Responder) note(o Outcome, err error) {
	if r.observe != nil {
		r.observe(o, err)
	}
}

// serverFilter passes untagged IPv4 UDP datagrams to port 67 that are not
// fragments; everything else the guest sends never reaches the daemon.
var serverFilter = []bpf.Instruction{
	bpf.LoadAbsolute{Off: 12, Size: 2},
	bpf.JumpIf{Cond: bpf.JumpNotEqual, Val: 0x0800, SkipTrue: 8},
	bpf.LoadAbsolute{Off: 14 + 9, Size: 1},
	bpf.JumpIf{Cond: bpf.JumpNotEqual, Val: 17, SkipTrue: 6},
	bpf.LoadAbsolute{Off: 14 + 6, Size: 2},
	bpf.JumpIf{Cond: bpf.JumpBitsSet, Val: 0x1fff, SkipTrue: 4},
	bpf.LoadMemShift{Off: 14},
	bpf.LoadIndirect{Off: 14 + 2, Size: 2},
	bpf.JumpIf{Cond: bpf.JumpNotEqual, Val: serverPort, SkipTrue: 1},
	bpf.RetConstant{Val: 0xffff},
	bpf.RetConstant{Val: 0},
}

// openSocket opens a nonblocking AF_PACKET socket on ifindex, in the
// calling thread's netns, that sees only what serverFilter passes of what
// arrives from the interface (not what is sent to it).
func openSocket(ifindex int) (int, error) {
	prog, err := bpf.Assemble(serverFilter)
	if err != nil {
		return -1, fmt.Errorf("assemble filter: %w", err)
	}
	// Protocol 0 until bound: nothing is queued before the filter is on.
	fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK, 0)
	if err != nil {
		return -1, fmt.Errorf("packet socket: %w", err)
	}
	filter := make([]unix.SockFilter, len(prog))
	for i, ins := range prog {
		filter[i] = unix.SockFilter{Code: ins.Op, Jt: ins.Jt, Jf: ins.Jf, K: ins.K}
	}
	fprog := unix.SockFprog{Len: uint16(len(filter)), Filter: &filter[0]}
	if err := unix.SetsockoptSockFprog(fd, unix.SOL_SOCKET, unix.SO_ATTACH_FILTER, &fprog); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("attach filter: %w", err)
	}
	if err := unix.SetsockoptInt(fd, unix.SOL_PACKET, unix.PACKET_IGNORE_OUTGOING, 1); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("ignore outgoing: %w", err)
	}
	// ETH_P_ALL, not ETH_P_IP: the tap is a bridge port, and the bridge
	// consumes its frames before protocol handlers run; only "all" taps
	// see them first. The filter keeps the rest out.
	sa := &unix.SockaddrLinklayer{Protocol: htons(unix.ETH_P_ALL), Ifindex: ifindex}
	if err := unix.Bind(fd, sa); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("bind to ifindex %d: %w", ifindex, err)
	}
	return fd, nil
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }
