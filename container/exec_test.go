package container

import "testing"

// TestClassifyLookup reads libcontainer's error for a command its init
// could not find or run (the text of exec.LookPath's *exec.Error, the only
// form the init's failure reaches the daemon in) into the exit statuses
// container runtimes use.
func TestClassifyLookup(t *testing.T) {
	const start = "unable to start container process: "
	for _, tc := range []struct {
		command, msg string
		code         int
		detail       string
	}{
		{"nosuch", start + `exec: "nosuch": executable file not found in $PATH`, ExitNotFound, "executable file not found in $PATH"},
		{"/no/cmd", start + `exec: "/no/cmd": stat /no/cmd: no such file or directory`, ExitNotFound, "stat /no/cmd: no such file or directory"},
		{"/etc/passwd/x", start + `exec: "/etc/passwd/x": stat /etc/passwd/x: not a directory`, ExitNotFound, "stat /etc/passwd/x: not a directory"},
		{"/etc/passwd", start + `exec: "/etc/passwd": permission denied`, ExitCannotRun, "permission denied"},
		{"/tmp", start + `exec: "/tmp": is a directory`, ExitCannotRun, "is a directory"},
		{`a"b`, start + `exec: "a\"b": executable file not found in $PATH`, ExitNotFound, "executable file not found in $PATH"},
	} {
		code, detail, ok := classifyLookup(tc.command, tc.msg)
		if !ok || code != tc.code || detail != tc.detail {
			t.Errorf("classifyLookup(%q, %q) = %d %q %v, want %d %q", tc.command, tc.msg, code, detail, ok, tc.code, tc.detail)
		}
	}
	// Not a lookup failure of this command: the caller reports the error as
	// it is (125), unless another classifier knows it (a working directory
	// that does not exist: classifyChdir).
	for _, tc := range []struct{ command, msg string }{
		{"true", start + `chdir to cwd ("/nonexistent") set in config.json failed: no such file or directory`},
		{"sh", start + "procReady not received"},
		{"sh", start + `exec: "other": executable file not found in $PATH`},
	} {
		if code, detail, ok := classifyLookup(tc.command, tc.msg); ok {
			t.Errorf("classifyLookup(%q, %q) = %d %q, want not classified", tc.command, tc.msg, code, detail)
		}
	}
}

func TestClassifyChdir(t *testing.T) {
	const start = "unable to start container process: error during container init: "
	dir, detail, ok := classifyChdir(start + `chdir to cwd ("/no such") set in config.json failed: no such file or directory`)
	if !ok || dir != "/no such" || detail != "no such file or directory" {
		t.Errorf("classifyChdir = %q %q %v", dir, detail, ok)
	}
	if _, _, ok := classifyChdir(start + "procReady not received"); ok {
		t.Error("classifyChdir took a pids failure for a working directory")
	}
}
