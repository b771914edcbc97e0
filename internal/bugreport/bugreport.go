package bugreport

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"encoding/json"
	"fmt"
	"io"
	"regexp"
	"time"

	"github.com/enforcerd/enforcerd/api"
)

// Section is one file of the archive.
type Section struct {
	Name string // what it is: "version", "doctor", ...
	File string // its file name in the archive
	Data []byte // empty when unavailable
	// Note says why the section is missing or partial ("" when whole).
	Note string
}

// Available reports whether the section was gathered.
func (s Section) Available() bool { return len(s.Data) > 0 }

// Report is the sections of one bug report, in the order added.
type Report struct {
	Created  time.Time
	Sections []Section
}

// Add adds a section of text or JSON; data passes through Scrub.
func (r *Report) Add(name, file string, data []byte, note string) {
	r.Sections = append(r.Sections, Section{Name: name, File: file, Data: Scrub(data), Note: note})
}

// AddJSON adds v as indented JSON, or, when err is set, an unavailable
// section whose note is err.
func (r *Report) AddJSON(name, file string, v any, err error) {
	if err != nil {
		r.Add(name, file, nil, api.OneLine(err.Error()))
		return
	}
	data, merr := json.MarshalIndent(v, "", "  ")
	if merr != nil {
		r.Add(name, file, nil, "encode: "+merr.Error())
		return
	}
	r.Add(name, file, append(data, '\n'), "")
}

// SectionSummary is one section in summary.json and in --json.
type SectionSummary struct {
	Name   string `json:"name"`
	File   string `json:"file"`
	Status string `json:"status"` // "ok", "partial" (gathered, with a note) or "unavailable"
	Note   string `json:"note,omitempty"`
	Bytes  int    `json:"bytes"`
}

// Summary is summary.json: what the archive holds.
type Summary struct {
	Created  time.Time        `json:"created"`
	Sections []SectionSummary `json:"sections"`
}

// Summary summarises the sections.
func (r *Report) Summary() Summary {
	s := Summary{Created: r.Created.UTC(), Sections: []SectionSummary{}}
	for _, sec := range r.Sections {
		st := "ok"
		switch {
		case !sec.Available():
			st = "unavailable"
		case sec.Note != "":
			st = "partial"
		}
		s.Sections = append(s.Sections, SectionSummary{Name: sec.Name, File: sec.File, Status: st, Note: sec.Note, Bytes: len(sec.Data)})
	}
	return s
}

// SummaryFile is the name of the summary in the archive.
const SummaryFile = "summary.json"

// WriteArchive writes the report as a gzipped tar: every file under the
// directory dir/, summary.json first, then each available section (an
// unavailable one has its note in the summary only). Files are mode 0600
// and stamped with the report's time.
func (r *Report) WriteArchive(w io.Writer, dir string) error {
	gz := gzip.NewWriter(w)
	tw := tar.NewWriter(gz)
	mtime := r.Created.UTC()
	add := func(name string, data []byte) error {
		hdr := &tar.Header{Name: dir + "/" + name, Mode: 0o600, Size: int64(len(data)), ModTime: mtime, Typeflag: tar.TypeReg, Format: tar.FormatPAX}
		if err := tw.WriteHeader(hdr); err != nil {
			return fmt.Errorf("archive %s: %w", name, err)
		}
		if _, err := tw.Write(data); err != nil {
			return fmt.Errorf("archive %s: %w", name, err)
		}
		return nil
	}
	sum, err := json.MarshalIndent(r.Summary(), "", "  ")
	if err != nil {
		return fmt.Errorf("encode summary: %w", err)
	}
	if err := add(SummaryFile, append(sum, '\n')); err != nil {
		return err
	}
	for _, sec := range r.Sections {
		if !sec.Available() {
			continue
		}
		if err := add(sec.File, sec.Data); err != nil {
			return err
		}
	}
	if err := tw.Close(); err != nil {
		return fmt.Errorf("archive: %w", err)
	}
	return gz.Close()
}

// urlUserinfo is the userinfo of a URL: after the scheme's "//", up to
// the last '@' of the authority (a password may hold a bare '@').
var urlUserinfo = regexp.MustCompile(`(?i)\b([a-z][a-z0-9+.-]*://)[^\s/?#"'\\<>]*@`)

// Scrub removes the userinfo of every URL in data ("https://u:pw@host/x"
// becomes "https://host/x"), as the daemon does for scopes before it
// stores, logs or shows them: the archive holds no credential even where
// a text carried one.
func Scrub(data []byte) []byte {
	if !bytes.Contains(data, []byte("@")) {
		return data
	}
	return urlUserinfo.ReplaceAll(data, []byte("$1"))
}
