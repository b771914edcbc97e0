package main

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/enforcerd/enforcerd/api"
)

// apiClient times enforcerd's /v1 API calls through api.Client, the client
// the CLI is built on (connections kept alive, no process per call).
type apiClient struct {
	c *api.Client
}

func newAPIClient(c *api.Client) *apiClient { return &apiClient{c: c} }

// apiCallTimeout bounds one call.
const apiCallTimeout = 2 * time.Minute

// timed runs one call and returns how long it took until the whole
// response was read.
func timed(ctx context.Context, what string, call func(context.Context) error) (time.Duration, error) {
	ctx, cancel := context.WithTimeout(ctx, apiCallTimeout)
	defer cancel()
	start := time.Now()
	if err := call(ctx); err != nil {
		return 0, fmt.Errorf("%s: %w", what, err)
	}
	return time.Since(start), nil
}

// createNet creates a network-only session with a NIC: allowlist mode with
// one name, so it has a netns, a veth, firewall elements and a DNS
// registration, as ptp ADD gives a netns a veth and an address.
func (c *apiClient) createNet(ctx context.Context, name string) (time.Duration, error) {
	return c.create(ctx, api.CreateRequest{Name: name, NetworkOnly: true, Allow: []string{"api.bench.test"}})
}

// createSandbox creates a session with a sandbox on rootfs, with the same
// network and policy as createNet.
func (c *apiClient) createSandbox(ctx context.Context, name, rootfs string) (time.Duration, error) {
	return c.create(ctx, api.CreateRequest{Name: name, Rootfs: rootfs, Allow: []string{"api.bench.test"}})
}

func (c *apiClient) create(ctx context.Context, req api.CreateRequest) (time.Duration, error) {
	return timed(ctx, "create session "+req.Name, func(ctx context.Context) error {
		_, err := c.c.Create(ctx, req)
		return err
	})
}

func (c *apiClient) delete(ctx context.Context, name string) (time.Duration, error) {
	return timed(ctx, "remove session "+name, func(ctx context.Context) error {
		return c.c.Remove(ctx, name)
	})
}

// rssKiB reads VmRSS of a process from /proc/<pid>/status.
func rssKiB(pid int) (int, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			f := strings.Fields(v)
			if len(f) > 0 {
				return strconv.Atoi(f[0])
			}
		}
	}
	return 0, fmt.Errorf("no VmRSS in /proc/%d/status", pid)
}
