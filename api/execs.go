package api

import (
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"unicode/utf8"
)

// OutputFrame is the frame of one piece of an exec's output: Data when it
// is valid UTF-8, DataB64 otherwise.
func OutputFrame(stream string, data []byte, offset int64) ExecFrame {
	fr := ExecFrame{Stream: stream, Offset: offset}
	if utf8.Valid(data) {
		fr.Data = string(data)
	} else {
		fr.DataB64 = base64.StdEncoding.EncodeToString(data)
	}
	return fr
}

// streamExec writes the exec's frames from offset on as NDJSON. An error
// of the engine after the header is the stream's last frame (125).
func (a *server) streamExec(fw *frameWriter, r *http.Request, name, id string, offset int64, follow bool) {
	err := a.e.ExecOutput(r.Context(), name, id, offset, follow, fw.frame)
	switch {
	case err == nil, r.Context().Err() != nil, fw.writeFailed():
	case !fw.hasStarted() && StatusOf(err) < 500:
		a.fail(fw.w, r, err)
	default:
		a.log.Error("exec output failed", "session", name, "exec", id, "err", err)
		exit := ExitEnforcerd
		_ = fw.frame(ExecFrame{Error: OneLine(err.Error()), Exit: &exit})
	}
}

func (f *frameWriter) writeFailed() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.err != nil
}

func (a *server) execOutput(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	var offset int64
	if v := q.Get("offset"); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 0 {
			writeError(w, http.StatusBadRequest, CodeBadRequest, fmt.Sprintf("offset %q: want the offset of a frame, a number from 0", v))
			return
		}
		offset = n
	}
	var follow bool
	switch v := q.Get("follow"); v {
	case "", "0", "false":
	case "1", "true":
		follow = true
	default:
		writeError(w, http.StatusBadRequest, CodeBadRequest, fmt.Sprintf("follow %q: want 1 or 0", v))
		return
	}
	// Refusals (unknown session or exec, a bad offset) before the header.
	name, id := r.PathValue("name"), r.PathValue("id")
	if _, err := a.e.InspectExec(name, id); err != nil {
		a.fail(w, r, err)
		return
	}
	a.streamExec(newFrameWriter(w), r, name, id, offset, follow)
}

func (a *server) execList(w http.ResponseWriter, r *http.Request) {
	execs, err := a.e.ListExecs(r.PathValue("name"))
	if err != nil {
		a.fail(w, r, err)
		return
	}
	if execs == nil {
		execs = []ExecInfo{}
	}
	writeJSONStatus(w, http.StatusOK, execs)
}

func (a *server) execInspect(w http.ResponseWriter, r *http.Request) {
	info, err := a.e.InspectExec(r.PathValue("name"), r.PathValue("id"))
	if err != nil {
		a.fail(w, r, err)
		return
	}
	writeJSONStatus(w, http.StatusOK, info)
}

func (a *server) execKill(w http.ResponseWriter, r *http.Request) {
	info, err := a.e.KillExec(r.PathValue("name"), r.PathValue("id"))
	if err != nil {
		a.fail(w, r, err)
		return
	}
	writeJSONStatus(w, http.StatusOK, info)
}

// IsExecFrameEnd reports whether fr is an exec stream's last frame.
func IsExecFrameEnd(fr ExecFrame) bool { return fr.Exit != nil || fr.Error != "" }

var errStreamCut = errors.New("exec stream ended without an exit status")
