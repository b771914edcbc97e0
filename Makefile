# enforcerd: two commands on a fresh machine, as root.
#   make demo   install what is missing, build, and show enforcement in a simulated world
#   make test   install what is missing, build, run unit, fuzz and live tests
SHELL := /bin/bash
export CGO_ENABLED := 1
# GO: a go at least as new as go.mod's, found once per make: go on PATH, /usr/local/go, or the
# toolchain scripts/ensure-go.sh fetches into .cache/go with Debian's golang-go (`go mod
# download` of go.mod's toolchain module, verified by the go command's checksum database).
# make GO=/path/to/go overrides it; `make clean` alone looks for none. Its directory goes first
# on PATH so that scripts and tests which run plain `go` (scripts/fuzz.sh) get the same one.
ifeq ($(origin GO),undefined)
ifneq ($(filter-out clean,$(or $(MAKECMDGOALS),all)),)
GO := $(shell scripts/ensure-go.sh)
$(if $(and $(GO),$(filter 0,$(.SHELLSTATUS))),,$(error no Go toolchain: scripts/ensure-go.sh failed, see its message above))
endif
endif
ifneq ($(findstring /,$(GO)),)
export PATH := $(dir $(abspath $(GO))):$(PATH)
endif
TAGS      := seccomp
BIN       := bin/enforcerd
CNIBIN    := bin/enforcerd-cni
CTLBIN    := bin/enforcerctl
ROOTFS    ?= $(CURDIR)/.cache/rootfs
GUEST     ?= $(CURDIR)/.cache/guest
FUZZTIME  ?= 30000x
# Debian packages the build, the tests and the demo need (podman: the CNI
# plugin's real-runtime test, with its CNI backend; runc: the OCI runtime the
# runtime tests name, as podman would pick crun, which refuses hybrid cgroups;
# tar: its image import; containerd and containernetworking-plugins' loopback:
# the kubelet path, containerd's CRI plugin driven by crictl; qemu-system-x86
# and cpio: the VM guest tests, whose guest scripts/mkguest.sh builds from
# Debian's kernel package, downloaded and extracted, never installed; curl and
# openssl: the name check's tests run them in a session's netns).
PKGS      := gcc libc6-dev pkg-config libseccomp-dev busybox-static iproute2 util-linux nftables podman tar \
             containerd runc containernetworking-plugins qemu-system-x86 cpio curl openssl
# Extra packages only the benchmarks need (the peers we compare with).
BENCHPKGS := dnsperf dnsmasq-base iperf3
# crictl, the CRI's client (what a kubelet speaks), built from the Go module
# proxy into .cache for the kubelet-path test (integration/e2e_cni_crictl_test.go).
CRICTL    := .cache/crictl/crictl
CRICTL_VERSION := v1.37.0

.PHONY: all build deps bench-deps test unit fuzz live demo bench rootfs guest clean vet crictl depaware

all: build

deps:
	@scripts/ensure-packages.sh $(PKGS)

bench-deps: deps
	@scripts/ensure-packages.sh $(BENCHPKGS)

# Stamped into the binary (enforcerd version): the nearest tag, else 0.1.0-dev, and the commit.
VERSION   ?= $(shell git describe --tags --dirty 2>/dev/null || echo 0.1.0-dev)
COMMIT    ?= $(shell git rev-parse --short=12 HEAD 2>/dev/null)
# enforcerd is linked statically (libseccomp.a and glibc's libc.a, with Go's
# own resolver and user lookup: no NSS), as runc's release builds are: every
# CLI call and every sandbox's init starts this binary, and the dynamic
# loader was a fifth of a bare start's CPU. enforcerctl, the thin client
# (the client commands only), is built without cgo: it links no netlink,
# nftables or libcontainer, and starts in a fraction of enforcerd's time.
STATIC    := -tags "$(TAGS) netgo osusergo" -ldflags "-extldflags=-static -X main.version=$(VERSION) -X main.commit=$(COMMIT)"
build: deps
	$(GO) build $(STATIC) -o $(BIN) ./cmd/enforcerd
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags "-X main.pluginVersion=$(VERSION)" -o $(CNIBIN) ./cmd/enforcerd-cni
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags "-X main.version=$(VERSION) -X main.commit=$(COMMIT)" -o $(CTLBIN) ./cmd/enforcerctl

# The linters, built by go install at pinned versions into .cache (a new
# version is a new directory, so bumping one here rebuilds it).
STATICCHECK_VERSION := v0.8.2
DEADCODE_VERSION    := v0.52.0
STATICCHECK := .cache/tools/staticcheck-$(STATICCHECK_VERSION)/staticcheck
DEADCODE    := .cache/tools/deadcode-$(DEADCODE_VERSION)/deadcode

$(STATICCHECK):
	GOBIN=$(CURDIR)/$(dir $@) $(GO) install honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION)

$(DEADCODE):
	GOBIN=$(CURDIR)/$(dir $@) $(GO) install golang.org/x/tools/cmd/deadcode@$(DEADCODE_VERSION)

# go vet, staticcheck, and deadcode with every main and every test as a root
# (a function only tests call is a test helper, not dead): each prints
# nothing on a clean tree. Then the linked-package lists (depaware.txt).
vet: deps $(STATICCHECK) $(DEADCODE)
	$(GO) vet -tags $(TAGS) ./...
	$(STATICCHECK) -tags $(TAGS) ./...
	@out=$$($(DEADCODE) -test -tags $(TAGS) ./...) || exit 1; \
	  if [ -n "$$out" ]; then echo "$$out"; echo "deadcode: the functions above are unreachable"; exit 1; fi
	@scripts/check-registry-hosts.sh

# Rewrite cmd/*/depaware.txt, the packages each binary links (the unit
# tests fail while one is stale: review the diff, then commit it).
depaware:
	$(GO) test -count=1 -run '^TestDepaware$$' ./internal/depaware -update

rootfs: deps
	scripts/mkrootfs.sh $(ROOTFS)

# The VM guest of the VM-session tests: Debian's kernel and a busybox initramfs.
guest: deps
	scripts/mkguest.sh $(GUEST)

crictl: $(CRICTL)

$(CRICTL):
	GOBIN=$(CURDIR)/$(dir $(CRICTL)) $(GO) install sigs.k8s.io/cri-tools/cmd/crictl@$(CRICTL_VERSION)

# The packages that need no privilege run a second time as nobody
# (scripts/nonroot-tests.sh), so that none of them comes to need root.
NONROOT   := daemon daemon/eventlog daemon/metrics api
unit: deps
	$(GO) test -tags $(TAGS) -count=1 $$($(GO) list ./... | grep -v /integration)
	@if [ "$$(id -u)" = 0 ]; then scripts/nonroot-tests.sh $(NONROOT); fi

# A short fuzz run of every fuzz target (the seed corpus is committed).
fuzz: deps
	@scripts/fuzz.sh $(FUZZTIME)

# Live tests: real kernel, real binary, inside the test world. Root only.
live: build rootfs crictl guest
	ENFORCERD_BIN=$(CURDIR)/$(BIN) ENFORCERD_CNI_BIN=$(CURDIR)/$(CNIBIN) ENFORCERD_CTL_BIN=$(CURDIR)/$(CTLBIN) ENFORCERD_ROOTFS=$(ROOTFS) ENFORCERD_CRICTL=$(CURDIR)/$(CRICTL) ENFORCERD_GUEST=$(GUEST) \
	  $(GO) test -tags $(TAGS) -count=1 -p 1 -timeout 30m ./integration/...

test: vet unit fuzz live

demo: build rootfs
	$(GO) run -tags $(TAGS) ./integration/cmd/demo -bin $(CURDIR)/$(BIN) -rootfs $(ROOTFS)

bench: build rootfs bench-deps
	ENFORCERD_BIN=$(CURDIR)/$(BIN) ENFORCERD_CTL_BIN=$(CURDIR)/$(CTLBIN) ENFORCERD_ROOTFS=$(ROOTFS) scripts/bench.sh

# Keeps .cache/go, the downloaded toolchain (`make clean build` uses it, as does the next make).
clean:
	rm -rf bin $(filter-out .cache/go,$(wildcard .cache/*))
