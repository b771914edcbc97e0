package nsmgr

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// Prepared netns: Create's most expensive steps are making the netns
// (unshare, ~0.7 ms) and configuring it (IPv6 off, lo up). With
// Config.Prepared > 0 and StartPrepared called, the Manager keeps that many
// netns made and configured ahead of demand, off the create path, and Create
// claims one instead: it bind-mounts the prepared netns at the session's
// name, and the pool name is unmounted in the background (an unmount waits
// for an RCU grace period, ~1 ms: as long as making a netns). A prepared netns is brand new (made for
// the pool, never given to a session before) and exactly what the fresh
// path makes: lo up with 127.0.0.1, IPv6 disabled in "all" and "default",
// nothing else. When none is ready, Create makes one itself (the fresh
// path), as with Config.Prepared 0.
//
// Each one is mounted at NetnsDir/<prefix>-pool_<pid>_<n>: the prefix
// marks it as ours (Reap removes it, like everything of the prefix), and
// '_' is not allowed in session names, so it is never taken for a session.
// A crash leaves at most Config.Prepared of them (ready or being made),
// which the next start's Reap (or `enforcerd reap`) removes; Close removes
// them.

// DefaultPrepared is the number of prepared netns the daemon keeps unless
// configured: none. Measured on a 2-core machine with the shared /proc
// lookup gone (sysctl.go), a pool of 8 gave no better create p50 and a
// worse create and delete p99 (the refill's netns work competes with the
// creates and deletes beside it: 12.7 ms against 7.1 ms create p99, 26 ms
// against 13.7 ms delete p99, figure 1 of docs/benchmarks.md); it is
// there for hosts where making a netns is slow.
const DefaultPrepared = 0

// preparedMark separates the prefix from the number in a pool entry's name.
const preparedMark = "-pool_"

// preparedSeq numbers the pool entries of every Manager of this process
// (several may share a prefix: doctor's, tests').
var preparedSeq atomic.Uint64

// preparedName is the netns name of a new pool entry:
// "<prefix>-pool_<pid>_<n>", unique while this process lives. (An entry a
// crashed process left under the same pid makes the file creation fail, and
// the next number is tried.)
func preparedName(prefix string) string {
	return prefix + preparedMark + strconv.Itoa(os.Getpid()) + "_" + strconv.FormatUint(preparedSeq.Add(1), 10)
}

// isPreparedName reports whether name is a pool entry of prefix: the mark,
// then digits and '_'.
func isPreparedName(prefix, name string) bool {
	rest, ok := strings.CutPrefix(name, prefix+preparedMark)
	if !ok || rest == "" {
		return false
	}
	for i := 0; i < len(rest); i++ {
		if !isDigit(rune(rest[i])) && rest[i] != '_' {
			return false
		}
	}
	return true
}

// preparedNetns is a netns made ahead of demand, with what Create needs of
// it kept open.
type preparedNetns struct {
	name  string // under NetnsDir
	path  string
	ns    netns.NsHandle
	guest *netlink.Handle // rtnetlink socket in it
}

func (p *preparedNetns) close() {
	p.guest.Close()
	p.ns.Close()
}

// discard closes p and removes its mount and file.
func (p *preparedNetns) discard() error {
	p.close()
	return removeNetns(p.path)
}

// preparedPool is the Manager's pool state, under Manager.mu.
type preparedPool struct {
	ready    []*preparedNetns // oldest first
	inFlight int
	names    map[string]bool // entries of this Manager, ready or being made: Reap leaves them
	started  bool
	wake     chan struct{}  // a claim happened (buffered 1)
	idle     chan struct{}  // the last Create in flight ended (buffered 1)
	stop     chan struct{}  // closed by Close
	done     chan struct{}  // closed when every worker has returned
	retiring sync.WaitGroup // pool names of claimed entries being removed
	lastErr  error          // of the last failed preparation (PreparedStats)
	failures int
}

// PreparedStats describes the pool of prepared netns.
type PreparedStats struct {
	Ready, Target int
	Claimed       int   // creates served from the pool since New
	Fresh         int   // creates that found it empty and made their own netns
	Failures      int   // preparations (or removals of a claimed one's pool name) that failed
	LastErr       error // of the last failed preparation
}

// StartPrepared starts filling the pool of prepared netns in the
// background (Config.Prepared of them, at most Config.PrepareConcurrency
// made at once). Call it after Recover and Reap; it does nothing when
// Config.Prepared is 0 or when called again. Close stops it and removes the
// pool.
func (m *Manager) StartPrepared() {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.cfg.Prepared <= 0 || m.prep.started || m.closed {
		return
	}
	m.prep.started = true
	workers := max(m.cfg.PrepareConcurrency, 1)
	left := workers
	for i := 0; i < workers; i++ {
		go func() {
			m.prepareLoop()
			m.mu.Lock()
			left--
			if left == 0 {
				close(m.prep.done)
			}
			m.mu.Unlock()
		}()
	}
}

// PreparedStats returns the pool's state.
func (m *Manager) PreparedStats() PreparedStats {
	m.mu.Lock()
	defer m.mu.Unlock()
	return PreparedStats{Ready: len(m.prep.ready), Target: m.cfg.Prepared, Claimed: m.claimed, Fresh: m.fresh,
		Failures: m.prep.failures, LastErr: m.prep.lastErr}
}

// prepareLoop is one refill worker: it makes netns while the pool (ready
// and in flight) is below its size and no Create is in flight, then waits
// for a claim, the end of the Creates or Close.
func (m *Manager) prepareLoop() {
	for {
		m.mu.Lock()
		if m.closed {
			m.mu.Unlock()
			return
		}
		need := len(m.prep.ready)+m.prep.inFlight < m.cfg.Prepared
		if need && len(m.creating) > 0 {
			// Not beside a Create: making a netns takes the CPU and the
			// rtnl lock that Create's own steps need. The refill runs
			// when no Create is in flight.
			m.mu.Unlock()
			select {
			case <-m.prep.idle:
				continue
			case <-m.prep.stop:
				return
			}
		}
		if need {
			// Before the first mount under NetnsDir, as Create does (see
			// PrepareNetnsDir).
			if err := m.prepareDirLocked(); err != nil {
				m.prep.failures++
				m.prep.lastErr = err
				need = false
			}
		}
		var name string
		if need {
			name = preparedName(m.cfg.Prefix)
			m.prep.names[name] = true
			m.prep.inFlight++
		}
		m.mu.Unlock()
		if !need {
			select {
			case <-m.prep.wake:
				continue
			case <-m.prep.stop:
				return
			}
		}
		p, err := m.prepare(name)
		m.mu.Lock()
		m.prep.inFlight--
		switch {
		case errors.Is(err, fs.ErrExist): // left by a crashed process with our pid: take the next name
			delete(m.prep.names, name)
			m.mu.Unlock()
			continue
		case err != nil:
			delete(m.prep.names, name)
			m.prep.failures++
			m.prep.lastErr = err
		case m.closed:
			delete(m.prep.names, name)
			p.discard() // Close waits for this worker and removes nothing it does not see
		default:
			m.prep.ready = append(m.prep.ready, p)
		}
		m.mu.Unlock()
		if err != nil {
			// Do not spin on a persistent failure (the fresh path still
			// works, and reports its own errors).
			select {
			case <-time.After(time.Second):
			case <-m.prep.stop:
				return
			}
		}
	}
}

// prepare makes pool entry name: the netns file, a new netns mounted on it
// with IPv6 disabled and lo up, and its fd and netlink socket. On failure
// it leaves nothing.
func (m *Manager) prepare(name string) (_ *preparedNetns, err error) {
	path := filepath.Join(m.cfg.NetnsDir, name)
	if err := createNetnsFile(path); err != nil {
		return nil, fmt.Errorf("prepare netns: %w", err) // (exists: the next try takes the next name)
	}
	p := &preparedNetns{name: name, path: path, ns: netns.None()}
	defer func() {
		if err != nil {
			if p.guest != nil {
				p.guest.Close()
			}
			if p.ns.IsOpen() {
				p.ns.Close()
			}
			err = fmt.Errorf("prepare netns %s: %w", name, errors.Join(err, removeNetns(path)))
		}
	}()
	err = inNewNetns(path, func() error {
		var err error
		if p.ns, err = netns.Get(); err != nil {
			return fmt.Errorf("open netns: %w", err)
		}
		if p.guest, err = netlink.NewHandle(unix.NETLINK_ROUTE); err != nil {
			return fmt.Errorf("open netlink socket: %w", err)
		}
		if err := m.configureNewNetnsIPv6(); err != nil {
			return err
		}
		return setLoUp(p.guest, path)
	})
	if err != nil {
		return nil, err
	}
	return p, nil
}

// takePrepared hands out the oldest ready entry, or nil, and wakes the
// refill. The entry stays in names until the claim has removed its pool
// name (releasePrepared).
func (m *Manager) takePrepared() *preparedNetns {
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.prep.started {
		return nil
	}
	if len(m.prep.ready) == 0 {
		m.fresh++
		return nil
	}
	p := m.prep.ready[0]
	m.prep.ready[0] = nil
	m.prep.ready = m.prep.ready[1:]
	m.claimed++
	select {
	case m.prep.wake <- struct{}{}:
	default:
	}
	return p
}

// releasePrepared forgets pool entry name once its pool name is gone (or,
// on failure, left for Reap).
func (m *Manager) releasePrepared(name string) {
	m.mu.Lock()
	delete(m.prep.names, name)
	m.mu.Unlock()
}

// claim makes the prepared netns p the session's: the session's netns file
// and p bind-mounted on it; the fd and the netlink socket pass to c, and p's
// pool name is unmounted and removed in the background (retire). On failure
// the session's file is undone by c's undo and p is discarded (never
// returned to the pool: it may be mounted at the session's name when the
// failure happens).
func (c *creation) claim(p *preparedNetns) error {
	m := c.m
	path := m.NetnsPath(c.name)
	fail := func(err error) error {
		if derr := p.discard(); derr != nil {
			err = errors.Join(err, fmt.Errorf("discard prepared netns: %w", derr))
		}
		m.releasePrepared(p.name)
		return err
	}
	if err := createNetnsFile(path); err != nil {
		return fail(err)
	}
	c.undo.Push("netns "+path, func() error { return removeNetns(path) })
	if err := unix.Mount(p.path, path, "", unix.MS_BIND, ""); err != nil {
		return fail(fmt.Errorf("bind-mount prepared netns %s at %s: %w", p.path, path, err))
	}
	c.nsFD, c.guest = p.ns, p.guest
	p.ns, p.guest = netns.None(), nil
	m.retire(p)
	return nil
}

// retire removes the pool name of a claimed entry in the background. It
// stays in names until then, so Reap leaves it to us; Close waits for it. A
// failure is counted in PreparedStats, and the name left for the next Reap.
func (m *Manager) retire(p *preparedNetns) {
	m.prep.retiring.Add(1)
	go func() {
		defer m.prep.retiring.Done()
		err := removeNetns(p.path)
		m.mu.Lock()
		delete(m.prep.names, p.name)
		if err != nil {
			m.prep.failures++
			m.prep.lastErr = fmt.Errorf("remove the pool name of a claimed netns: %w", err)
		}
		m.mu.Unlock()
	}()
}

// closePrepared stops the refill workers, waits for them and for the
// retirements in flight, and removes every ready entry. Called by Close
// after it set closed.
func (m *Manager) closePrepared() error {
	m.mu.Lock()
	started := m.prep.started
	m.mu.Unlock()
	if !started {
		return nil
	}
	close(m.prep.stop)
	<-m.prep.done
	m.prep.retiring.Wait()
	m.mu.Lock()
	ready := m.prep.ready
	m.prep.ready = nil
	m.mu.Unlock()
	var errs []error
	for _, p := range ready {
		errs = append(errs, p.discard())
		m.releasePrepared(p.name)
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("remove prepared netns: %w", err)
	}
	return nil
}
