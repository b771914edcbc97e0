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
ROOTFS    ?= $(CURDIR)/.cache/rootfs
FUZZTIME  ?= 30000x
# Debian packages the build, the tests and the demo need (podman: the CNI
# plugin's real-runtime test, with its CNI backend; runc: the OCI runtime that test
# names, as podman would pick crun, which refuses hybrid cgroups; tar: its image import).
PKGS      := gcc libc6-dev pkg-config libseccomp-dev busybox-static iproute2 util-linux nftables podman runc tar
# Extra packages only the benchmarks need (the peers we compare with).
BENCHPKGS := dnsperf dnsmasq-base iperf3 containernetworking-plugins

.PHONY: all build deps bench-deps test unit fuzz live demo bench rootfs clean vet

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
# loader was a fifth of a bare start's CPU.
STATIC    := -tags "$(TAGS) netgo osusergo" -ldflags "-extldflags=-static -X main.version=$(VERSION) -X main.commit=$(COMMIT)"
build: deps
	$(GO) build $(STATIC) -o $(BIN) ./cmd/enforcerd
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags "-X main.pluginVersion=$(VERSION)" -o $(CNIBIN) ./cmd/enforcerd-cni

# go vet, and no package registry host name in any tracked file.
vet: deps
	$(GO) vet -tags $(TAGS) ./...
	@scripts/check-registry-hosts.sh

rootfs: deps
	scripts/mkrootfs.sh $(ROOTFS)

unit: deps
	$(GO) test -tags $(TAGS) -count=1 $$($(GO) list ./... | grep -v /integration)

# A short fuzz run of every fuzz target (the seed corpus is committed).
fuzz: deps
	@scripts/fuzz.sh $(FUZZTIME)

# Live tests: real kernel, real binary, inside the test world. Root only.
live: build rootfs
	ENFORCERD_BIN=$(CURDIR)/$(BIN) ENFORCERD_CNI_BIN=$(CURDIR)/$(CNIBIN) ENFORCERD_ROOTFS=$(ROOTFS) \
	  $(GO) test -tags $(TAGS) -count=1 -p 1 -timeout 30m ./integration/...

test: vet unit fuzz live

demo: build rootfs
	$(GO) run -tags $(TAGS) ./integration/cmd/demo -bin $(CURDIR)/$(BIN) -rootfs $(ROOTFS)

bench: build rootfs bench-deps
	ENFORCERD_BIN=$(CURDIR)/$(BIN) ENFORCERD_ROOTFS=$(ROOTFS) scripts/bench.sh

# Keeps .cache/go, the downloaded toolchain (`make clean build` uses it, as does the next make).
clean:
	rm -rf bin $(filter-out .cache/go,$(wildcard .cache/*))
