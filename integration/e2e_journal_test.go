package integration

// Under systemd the daemon's stderr is a journal stream, and journald reads
// a "<N>" at the start of a line as its priority (else 6, info). The test
// plays systemd's part: the daemon's stdout and stderr are one end of a
// unix stream socket pair, JOURNAL_STREAM names that end's device and
// inode, and the test reads the other end as journald does.

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// journalEntry is one line as journald stores it.
type journalEntry struct {
	priority int    // PRIORITY=
	message  string // MESSAGE= (the line without its prefix)
}

// journalRun is the daemon started on a fake journal stream.
type journalRun struct {
	cmd  *exec.Cmd
	mu   sync.Mutex
	got  []journalEntry
	done chan struct{} // closed when the stream ends
}

func (r *journalRun) entries() []journalEntry {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]journalEntry(nil), r.got...)
}

// startOnJournal starts `enforcerd serve` (with the daemon's usual options
// and extra) in the world's host, socket-activated with held when it is not
// nil, its output on a fake journal stream; otherStream names another
// inode in JOURNAL_STREAM (a child that inherited the variable).
func startOnJournal(t *testing.T, e *e2eEnv, held *heldSockets, otherStream bool, extra ...string) *journalRun {
	t.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	daemonEnd, journalEnd := os.NewFile(uintptr(fds[0]), "stream"), os.NewFile(uintptr(fds[1]), "journal")
	var st unix.Stat_t
	if err := unix.Fstat(fds[0], &st); err != nil {
		t.Fatal(err)
	}
	stream := fmt.Sprintf("%d:%d", st.Dev, st.Ino)
	if otherStream {
		stream = fmt.Sprintf("%d:%d", st.Dev, st.Ino+1)
	}
	args := append([]string{"--net=" + e.w.HostPath, "sh", "-c", `LISTEN_PID=$$ exec "$0" "$@"`, e.bin}, append(e.d.ServeArgs(), extra...)...)
	cmd := exec.Command("nsenter", args...)
	cmd.Env = append(os.Environ(), "JOURNAL_STREAM="+stream)
	if held != nil {
		cmd.Env = append(cmd.Env, "LISTEN_FDS="+strconv.Itoa(len(held.files)), "LISTEN_FDNAMES="+strings.Join(held.names, ":"))
		cmd.ExtraFiles = held.files
	}
	cmd.Stdout, cmd.Stderr = daemonEnd, daemonEnd
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start enforcerd: %v", err)
	}
	daemonEnd.Close() // the daemon holds the only write end: EOF when it exits
	r := &journalRun{cmd: cmd, done: make(chan struct{})}
	go func() {
		defer close(r.done)
		defer journalEnd.Close()
		sc := bufio.NewScanner(journalEnd)
		for sc.Scan() {
			line, ent := sc.Text(), journalEntry{priority: 6}
			if len(line) >= 3 && line[0] == '<' && line[2] == '>' && line[1] >= '0' && line[1] <= '7' {
				ent.priority, line = int(line[1]-'0'), line[3:]
			}
			ent.message = line
			r.mu.Lock()
			r.got = append(r.got, ent)
			r.mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			syscall.Kill(cmd.Process.Pid, syscall.SIGKILL)
			cmd.Wait()
		}
	})
	return r
}

// wait waits for the daemon to exit and its stream to end; it returns the
// exit status.
func (r *journalRun) wait(t *testing.T) int {
	t.Helper()
	waited := make(chan error, 1)
	go func() { waited <- r.cmd.Wait() }()
	select {
	case <-waited:
	case <-time.After(30 * time.Second):
		t.Fatalf("enforcerd did not exit within 30s; its journal: %v", r.entries())
	}
	<-r.done
	return r.cmd.ProcessState.ExitCode()
}

// jsonMessage decodes a JSON log line's level and msg ("" when it is not one).
func jsonMessage(line string) (level, msg string) {
	var rec struct {
		Level string `json:"level"`
		Msg   string `json:"msg"`
	}
	if json.Unmarshal([]byte(line), &rec) != nil {
		return "", ""
	}
	return rec.Level, rec.Msg
}

// TestE2EJournalPriorities: why serve does not start is at priority 3
// (err) in the journal: a bad option (text: the log format is not known
// yet) and a refused start (a JSON record, json being the log format under
// systemd). Controls: a daemon that starts logs "enforcerd serving" at 6
// and no error; the same refusal on a stream JOURNAL_STREAM does not name
// carries no prefix (journald would file it at 6: the prefix follows the
// stream, not the variable).
func TestE2EJournalPriorities(t *testing.T) {
	e := prepareE2E(t, "")
	held := bindSocketUnit(t, e, readSocketUnit(t))

	// A bad setting: refused before the config is complete.
	r := startOnJournal(t, e, nil, false, "--pool", "10.20.0.1/16")
	if code := r.wait(t); code != 2 {
		t.Errorf("bad pool: exit %d, want 2", code)
	}
	got := r.entries()
	want := "enforcerd serve: --pool: invalid pool 10.20.0.1/16: host bits set (did you mean 10.20.0.0/16?); want an IPv4 prefix between /8 and /28"
	if len(got) != 1 || got[0].priority != 3 || got[0].message != want {
		t.Errorf("bad pool: journal %+v, want one entry PRIORITY=3 %q", got, want)
	}

	// A refused start (the sockets handed over do not match the config).
	r = startOnJournal(t, e, held, false, "--socket-group", "65534")
	if code := r.wait(t); code != 1 {
		t.Errorf("refused start: exit %d, want 1", code)
	}
	got = r.entries()
	if len(got) != 1 || got[0].priority != 3 {
		t.Fatalf("refused start: journal %+v, want one entry at PRIORITY=3", got)
	}
	if level, msg := jsonMessage(got[0].message); level != "ERROR" || !strings.HasPrefix(msg, "enforcerd serve: socket activation: the API socket "+e.d.Socket+" has group root (gid 0), mode 0600, but the config's socket-group is \"65534\"") {
		t.Errorf("refused start: entry %q, want a JSON record at level ERROR naming the socket's group and the config's", got[0].message)
	}

	// Control: the same refusal on a stream JOURNAL_STREAM does not name.
	r = startOnJournal(t, e, held, true, "--socket-group", "65534")
	r.wait(t)
	if got := r.entries(); len(got) != 1 || got[0].priority != 6 {
		t.Errorf("another stream: journal %+v, want one line with no prefix (PRIORITY=6)", got)
	} else if _, msg := jsonMessage(got[0].message); !strings.HasPrefix(msg, "enforcerd serve: socket activation: ") {
		t.Errorf("another stream: entry %q, want the refusal", got[0].message)
	}

	// Control: a daemon that starts logs at info, and no error.
	r = startOnJournal(t, e, held, false)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for e.d.Client().Ready(ctx) != nil {
		if ctx.Err() != nil {
			t.Fatalf("the matched daemon did not become ready; journal %+v", r.entries())
		}
		time.Sleep(50 * time.Millisecond)
	}
	syscall.Kill(r.cmd.Process.Pid, syscall.SIGTERM)
	if code := r.wait(t); code != 0 {
		t.Errorf("control: exit %d after SIGTERM", code)
	}
	serving := false
	for _, ent := range r.entries() {
		level, msg := jsonMessage(ent.message)
		if ent.priority <= 3 || level == "ERROR" {
			t.Errorf("control: an error in the journal of a clean start: %+v", ent)
		}
		if msg == "enforcerd serving" && ent.priority == 6 && level == "INFO" {
			serving = true
		}
	}
	t.Logf("control: %d journal entries of a clean start and stop", len(r.entries()))
	if !serving {
		t.Errorf("control: no \"enforcerd serving\" at PRIORITY=6 in %+v", r.entries())
	}
}
