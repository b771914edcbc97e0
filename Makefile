# enforcerd: two commands on a fresh machine, as root.
#   make demo   install what is missing, build, and show enforcement in a simulated world
#   make test   install what is missing, build, run unit, fuzz and live tests
SHELL := /bin/bash
export PATH := /usr/local/go/bin:$(PATH)
export CGO_ENABLED := 1
GO        ?= go
TAGS      := seccomp
BIN       := bin/enforcerd
ROOTFS    ?= $(CURDIR)/.cache/rootfs
FUZZTIME  ?= 30000x
# Debian packages the build, the tests and the demo need.
PKGS      := gcc libc6-dev pkg-config libseccomp-dev busybox-static iproute2 util-linux nftables
# Extra packages only the benchmarks need (the peers we compare with).
BENCHPKGS := dnsperf dnsmasq-base iperf3 runc containernetworking-plugins

.PHONY: all build deps bench-deps test unit fuzz live demo bench rootfs clean vet

all: build

deps:
	@scripts/ensure-packages.sh $(PKGS)

bench-deps: deps
	@scripts/ensure-packages.sh $(BENCHPKGS)

build: deps
	$(GO) build -tags $(TAGS) -o $(BIN) ./cmd/enforcerd

vet: deps
	$(GO) vet -tags $(TAGS) ./...

rootfs: deps
	scripts/mkrootfs.sh $(ROOTFS)

unit: deps
	$(GO) test -tags $(TAGS) -count=1 $$($(GO) list ./... | grep -v /integration)

# A short fuzz run of every fuzz target (the seed corpus is committed).
fuzz: deps
	@scripts/fuzz.sh $(FUZZTIME)

# Live tests: real kernel, real binary, inside the test world. Root only.
live: build rootfs
	ENFORCERD_BIN=$(CURDIR)/$(BIN) ENFORCERD_ROOTFS=$(ROOTFS) \
	  $(GO) test -tags $(TAGS) -count=1 -p 1 -timeout 30m ./integration/...

test: vet unit fuzz live

demo: build rootfs
	$(GO) run -tags $(TAGS) ./integration/cmd/demo -bin $(CURDIR)/$(BIN) -rootfs $(ROOTFS)

bench: build rootfs bench-deps
	ENFORCERD_BIN=$(CURDIR)/$(BIN) ENFORCERD_ROOTFS=$(ROOTFS) scripts/bench.sh

clean:
	rm -rf bin .cache
