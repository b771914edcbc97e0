package rules

import (
	"archive/tar"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
)

// Defaults applied when a Spec leaves a limit at zero. DefaultCPUs: one CPU's worth of time
// per period, whatever the machine has, so that one sandbox cannot starve the host and the
// other sessions by default; a session that needs more asks for it.
const (
	DefaultMemoryBytes = 512 << 20
	DefaultPidsMax     = 1024
	DefaultCPUs        = 1.0
)

// Smallest limits a sandbox may be given: below them its init and a shell
// do not start, and the failure would come from the kernel mid-create.
const (
	MinMemoryBytes = 4 << 20
	MinPidsMax     = 4
	MinCPUs        = 0.01 // one CFS quota of 1 ms per 100 ms period
)

// MemoryWant, PidsWant and CPUsWant say what each limit accepts, in the one
// wording every layer uses: the daemon's refusal of an API field
// ("cpus 0.001: " + CPUsWant) and the command line's refusal of a flag
// (`invalid value "0" for flag --cpus: ` + CPUsWant). A limit left out is
// the default; in the API's JSON a 0 is a field left out, on the command
// line a 0 is refused (no flag takes 0 for "the default").
func MemoryWant() string {
	return fmt.Sprintf("want at least %d MiB (%d bytes); leave it out for the default %d MiB",
		MinMemoryBytes>>20, MinMemoryBytes, DefaultMemoryBytes>>20)
}

// PidsWant: see MemoryWant.
func PidsWant() string {
	return fmt.Sprintf("want at least %d; leave it out for the default %d", MinPidsMax, DefaultPidsMax)
}

// CPUsWant: see MemoryWant. machine is the CPU count of the machine that
// judges (more CPUs than it has would be no limit at all).
func CPUsWant(machine int) string {
	return fmt.Sprintf("want %v to %d (the CPUs of this machine); leave it out for the default %v", MinCPUs, machine, DefaultCPUs)
}

// CPUsInRange reports whether a given number of CPUs (0 is not "left
// out" here) is a limit this machine can apply.
func CPUsInRange(cpus float64, machine int) bool {
	return !math.IsNaN(cpus) && !math.IsInf(cpus, 0) && cpus >= MinCPUs && cpus <= float64(machine)
}

// ValidateImageName is the rule for an image's name: 1 to 63 of lower-case letters, digits,
// '.', '_' and '-', starting with a letter or digit (it is a directory name in the store).
//
// Hand-written rather than a regexp: every enforcerd process (each CLI call, each sandbox's
// init) would compile a package-level regexp at start.
func ValidateImageName(name string) error {
	ok := len(name) >= 1 && len(name) <= 63
	for i := 0; ok && i < len(name); i++ {
		c := name[i]
		alnum := c >= 'a' && c <= 'z' || c >= '0' && c <= '9'
		ok = alnum || i > 0 && (c == '.' || c == '_' || c == '-')
	}
	if !ok {
		return fmt.Errorf("image name %q: want 1 to 63 of a-z, 0-9, '.', '_' and '-', starting with a letter or digit (e.g. python-3.12-slim)", name)
	}
	return nil
}

// TarLayout writes the OCI image layout in dir to w as a tar (what Import reads): its regular
// files and directories, names relative to dir. Anything else in it (a symlink, a device) is
// refused, naming it: a layout holds nothing else.
func TarLayout(dir string, w io.Writer) error {
	if _, err := os.Stat(filepath.Join(dir, "oci-layout")); err != nil {
		return fmt.Errorf("%s: not an OCI image layout (no oci-layout file)", dir)
	}
	tw := tar.NewWriter(w)
	err := filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil || rel == "." {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		if !fi.IsDir() && !fi.Mode().IsRegular() {
			return fmt.Errorf("%s: not a regular file or directory; an OCI layout holds only those", p)
		}
		hdr, err := tar.FileInfoHeader(fi, "")
		if err != nil {
			return err
		}
		hdr.Name = filepath.ToSlash(rel)
		if fi.IsDir() {
			hdr.Name += "/"
		}
		hdr.Uid, hdr.Gid, hdr.Uname, hdr.Gname = 0, 0, "", ""
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if fi.IsDir() {
			return nil
		}
		f, err := os.Open(p)
		if err != nil {
			return err
		}
		defer f.Close()
		_, err = io.Copy(tw, f)
		return err
	})
	if err != nil {
		return err
	}
	return tw.Close()
}
