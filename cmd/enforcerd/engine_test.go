package main

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
)

func TestValidateCPUs(t *testing.T) {
	for _, tc := range []struct {
		cpus    float64
		machine int
		want    string
	}{
		{0, 4, ""}, // the default
		{0.01, 4, ""},
		{1.5, 4, ""},
		{4, 4, ""},
		{4.5, 4, "cpus 4.5: this machine has 4 CPUs; give at most 4"},
		{3, 2, "cpus 3: this machine has 2 CPUs; give at most 2"},
		{-1, 4, "cpus -1: give a number of CPUs from 0.01 to 4 (this machine's count), e.g. 0.5"},
		{0.001, 4, "cpus 0.001: give a number of CPUs from 0.01 to 4 (this machine's count), e.g. 0.5"},
	} {
		got := ""
		if err := validateCPUs(tc.cpus, tc.machine); err != nil {
			got = err.Error()
		}
		if got != tc.want {
			t.Errorf("validateCPUs(%v, %d) = %q, want %q", tc.cpus, tc.machine, got, tc.want)
		}
	}
}

// TestValidateRequestRootfs: without --images-dir every rootfs is refused
// (a 400 naming the value and the option); the refusal is a bad request.
func TestValidateRequestRootfs(t *testing.T) {
	img := t.TempDir()
	if err := os.Mkdir(filepath.Join(img, "bin"), 0o755); err != nil {
		t.Fatal(err)
	}
	e := &engine{}
	for _, tc := range []struct{ rootfs, want string }{
		{img, `rootfs "` + img + `": no image directory is configured; the operator must start serve with --images-dir DIR to allow sandboxes`},
		{"/", `rootfs "/": no image directory is configured; the operator must start serve with --images-dir DIR to allow sandboxes`},
		{"rel", `rootfs "rel": give an absolute directory`},
		{"/nonexistent", `rootfs "/nonexistent": no image directory is configured; the operator must start serve with --images-dir DIR to allow sandboxes`},
	} {
		req := CreateRequest{Name: "s1", Rootfs: tc.rootfs}
		err := e.validateRequest(&req)
		if err == nil || err.Error() != tc.want || !errors.Is(err, ErrBadRequest) {
			t.Errorf("rootfs %q: %v, want a bad request %q", tc.rootfs, err, tc.want)
		}
	}
	req := CreateRequest{Name: "s1", NetworkOnly: true, CPUs: 1e6}
	if err := e.validateRequest(&req); err == nil || !errors.Is(err, ErrBadRequest) {
		t.Errorf("cpus 1e6: %v, want a bad request", err)
	}
}
