package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"
)

// apiClient speaks enforcerd's /v1 API over its unix socket, keeping
// connections alive as a client library would (no process per call).
type apiClient struct {
	http *http.Client
}

func newAPIClient(socket string) *apiClient {
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", socket)
		},
		MaxIdleConnsPerHost: 8,
		DisableCompression:  true,
	}
	return &apiClient{http: &http.Client{Transport: tr, Timeout: 2 * time.Minute}}
}

// do sends one request and returns how long it took until the whole
// response was read; a status other than want is an error.
func (c *apiClient) do(ctx context.Context, method, path string, body any, want int) (time.Duration, error) {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return 0, err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, "http://enforcerd/v1"+path, rd)
	if err != nil {
		return 0, err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	start := time.Now()
	resp, err := c.http.Do(req)
	if err != nil {
		return 0, fmt.Errorf("%s %s: %w", method, path, err)
	}
	out, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	took := time.Since(start)
	if err != nil {
		return 0, fmt.Errorf("%s %s: read response: %w", method, path, err)
	}
	if resp.StatusCode != want {
		return 0, fmt.Errorf("%s %s: %s: %s", method, path, resp.Status, strings.TrimSpace(string(out)))
	}
	return took, nil
}

// createNet creates a network-only session with a NIC: allowlist mode with
// one name, so it has a netns, a veth, firewall elements and a DNS
// registration, as ptp ADD gives a netns a veth and an address.
func (c *apiClient) createNet(ctx context.Context, name string) (time.Duration, error) {
	return c.do(ctx, http.MethodPost, "/sessions", map[string]any{
		"name": name, "network_only": true, "allow": []string{"api.bench.test"},
	}, http.StatusCreated)
}

// createSandbox creates a session with a sandbox on rootfs, with the same
// network and policy as createNet.
func (c *apiClient) createSandbox(ctx context.Context, name, rootfs string) (time.Duration, error) {
	return c.do(ctx, http.MethodPost, "/sessions", map[string]any{
		"name": name, "rootfs": rootfs, "allow": []string{"api.bench.test"},
	}, http.StatusCreated)
}

func (c *apiClient) delete(ctx context.Context, name string) (time.Duration, error) {
	return c.do(ctx, http.MethodDelete, "/sessions/"+name, nil, http.StatusOK)
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
