# oac sandbox-agent. `make demo` and `make test` install what they need.
GO      ?= go
BIN     ?= bin
VERSION ?= $(shell git describe --always --dirty 2>/dev/null || echo dev)
LDFLAGS := -s -w -X github.com/oac/sandbox-agent/internal/buildinfo.Version=$(VERSION)
# Debian packages the demo uses: bubblewrap guests and curl. A demo never
# installs a container engine, a VM or a cluster on a user's desktop (one
# with Docker's own containerd.io would see its engine fought over).
DEMO_PKGS := bubblewrap ca-certificates uidmap curl util-linux mount iproute2
# What the tests add (qemu-system-arm and qemu-efi-aarch64 boot the arm64
# image; qemu-system-x86 brings virtiofsd; docker.io, containerd, runc, crun
# and etcd-server the container and Kubernetes rows; apparmor and
# busybox-static the AppArmor VM; zsh and fish run the completion scripts).
TEST_PKGS := $(DEMO_PKGS) zsh fish qemu-system-x86 qemu-system-arm qemu-efi-aarch64 kmod e2fsprogs erofs-utils tar runc crun docker.io etcd-server containerd containernetworking-plugins iptables ipset apparmor busybox-static
# The bench's peer, sandbox-runtime from the npm registry, runs on Node.js
# with socat and ripgrep.
BENCH_PKGS := socat ripgrep
UNIT_PKGS = $(shell $(GO) list ./... | grep -v /e2e)

# The guest architecture of the VM targets (kernel, initramfs, image):
# amd64 or arm64 (Apple silicon). The Debian kernel of each lives in its
# own cache; oac-guest for another architecture is cross-built.
HOST_ARCH := $(shell $(GO) env GOARCH 2>/dev/null || echo amd64)
ARCH ?= $(HOST_ARCH)
KERNEL_CACHE ?= $(if $(filter amd64,$(ARCH)),.cache/kernel,.cache/kernel-$(ARCH))
GUEST_BIN = $(if $(filter $(HOST_ARCH),$(ARCH)),$(BIN)/oac-guest,$(BIN)/linux-$(ARCH)/oac-guest)
# Modules the VM guest loads at boot (dependencies are added from
# modules.dep); empty: oac-image's default list (virtio transports, the
# disk, erofs, overlay, virtio-fs, nftables).
VM_MODULES ?=

.PHONY: all build guest fixtures deps test-deps test k8s-bins fmt-check vet unit e2e ts-test demo cross fuzz fuzz-short bench bench-load clean distclean kernel kernels initramfs image k8s-cluster-test

all: build

# oac-shim-kubernetes is oac-shim with the kubernetes provider (build tag
# kubernetes): client-go would double every other shim's memory.
build:
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $(BIN)/ ./cmd/oac-guest ./cmd/oac-shim ./cmd/oac-image
	CGO_ENABLED=0 $(GO) build -trimpath -tags kubernetes -ldflags '$(LDFLAGS)' -o $(BIN)/oac-shim-kubernetes ./cmd/oac-shim

# oac-guest for ARCH: bin/oac-guest when it is this host's, else
# cross-built (static, no cgo) into bin/linux-ARCH/.
guest: build
ifneq ($(ARCH),$(HOST_ARCH))
	GOOS=linux GOARCH=$(ARCH) CGO_ENABLED=0 $(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $(GUEST_BIN) ./cmd/oac-guest
endif

# Debian's cloud kernel for ARCH, fetched with apt-get download (a foreign
# architecture is added to dpkg first), unpacked and depmod'ed into
# $(KERNEL_CACHE); a no-op when the cache exists.
kernel:
	@scripts/kernel.sh $(KERNEL_CACHE) $(ARCH)

# Both kernels the tests boot.
kernels:
	@scripts/kernel.sh .cache/kernel amd64
	@scripts/kernel.sh .cache/kernel-arm64 arm64

# The VM image beside oac-shim: bin/vmlinuz and bin/initramfs.img (oac-guest
# as /init plus the modules), the qemu provider's defaults. With ARCH other
# than the host's they go to bin/linux-ARCH/.
INITRAMFS_DIR = $(dir $(GUEST_BIN))
initramfs: guest kernel
	cp $(KERNEL_CACHE)/vmlinuz $(INITRAMFS_DIR)vmlinuz
	$(BIN)/oac-image initramfs --agent $(GUEST_BIN) --kernel-modules $(KERNEL_CACHE)/modules \
	  $(if $(VM_MODULES),--module $(VM_MODULES)) -o $(INITRAMFS_DIR)initramfs.img

# Test fixtures standing in for oac-sandbox-io and the daemon (make demo).
fixtures:
	CGO_ENABLED=0 $(GO) build -trimpath -o $(BIN)/fixtures/sandbox-io-standin ./e2e/internal/standin/sandboxio
	CGO_ENABLED=0 $(GO) build -trimpath -o $(BIN)/fixtures/daemon-standin ./e2e/internal/standin/daemon

# Every guest image output from a base rootfs (BASE: a directory or a
# tar/tar.gz; empty: the injected parts only) into $(IMAGE_OUT), for ARCH
# (make image ARCH=arm64 for Apple silicon: a cross-built oac-guest and
# Debian's arm64 kernel). The oac-sandbox-io binary comes from its own
# project: set SANDBOX_IO (built for ARCH). Outputs are reproducible: the
# same inputs give the same bytes (SOURCE_DATE_EPOCH sets the timestamps,
# default 0).
IMAGE_OUT ?= $(BIN)/image$(if $(filter amd64,$(ARCH)),,-$(ARCH))
BASE ?=
SANDBOX_IO ?=
image: guest kernel
	@[ -n "$(SANDBOX_IO)" ] || { echo "make image: set SANDBOX_IO=/path/to/oac-sandbox-io"; exit 2; }
	rm -rf $(IMAGE_OUT)
	$(BIN)/oac-image build --arch $(ARCH) $(if $(BASE),--base $(BASE)) --agent $(GUEST_BIN) --sandbox-io $(SANDBOX_IO) \
	  --kernel $(KERNEL_CACHE)/vmlinuz --kernel-modules $(KERNEL_CACHE)/modules $(if $(VM_MODULES),--module $(VM_MODULES)) -o $(IMAGE_OUT)

# What the demo needs; test-deps adds the rest and checks what apt cannot
# give (Node.js 20 or newer: Debian 12's archive has 18).
deps:
	@scripts/deps.sh $(DEMO_PKGS)

test-deps:
	@scripts/deps.sh $(TEST_PKGS)
	@scripts/node-check.sh

test: test-deps fmt-check vet cross unit fuzz-short k8s-bins k8s-cluster-test e2e ts-test

# The test cluster's kube-apiserver, kubelet, kube-scheduler and
# kube-controller-manager, built by tools/k8s into the user cache once
# (minutes on a cold cache; a no-op after), agent-sandbox's controller,
# built by tools/agent-sandbox the same way (about a minute cold), and the
# NetworkPolicy enforcer (kube-router), built by tools/netpol (about two
# minutes cold): before e2e, so that their build is not paid inside the e2e
# tests' time limit.
k8s-bins:
	$(GO) run ./internal/kcluster/kbins

# A real single-node Kubernetes cluster (internal/kcluster: etcd, a private
# containerd, kube-apiserver, kube-scheduler, kube-controller-manager and
# kubelet built by tools/k8s into the user cache once, minutes on a cold
# cache) schedules and runs Pods, binds claims, collects garbage, enforces
# RBAC, enforces NetworkPolicy (a deny-all policy confines its Pod both
# ways), runs agent-sandbox's controller (a warm pool, a claim bound to its
# warm Pod), and is stopped leaving nothing. The e2e tests start the same
# cluster for the kubernetes provider's rows; this target proves the cluster
# alone, before them in make test (about 40 s).
k8s-cluster-test: test-deps
	$(GO) test -tags k8s -count=1 -timeout 30m -v -run TestCluster ./internal/kcluster/

fmt-check:
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	if [ -n "$$out" ]; then echo "gofmt needed on:"; echo "$$out"; exit 1; fi

vet:
	$(GO) vet ./...
	$(GO) vet -tags kubernetes ./host/provider/kubernetes/ ./host/shimcli/

unit:
	$(GO) test -race -count=1 $(UNIT_PKGS)
	$(GO) test -race -count=1 -tags kubernetes ./host/provider/kubernetes/ ./host/shimcli/

# e2e builds its own binaries once per run and boots real guests (amd64 and
# arm64 VMs among them). TestConformance writes its provider x promise
# table to .cache/conformance.md.
e2e: kernels
	@mkdir -p .cache
	OAC_KERNEL_CACHE=$(abspath .cache/kernel) OAC_KERNEL_CACHE_ARM64=$(abspath .cache/kernel-arm64) \
	  OAC_CONFORMANCE_TABLE=$(abspath .cache/conformance.md) $(GO) test -count=1 -timeout 30m ./e2e/...
	@echo; echo "conformance:"; cat .cache/conformance.md

# The TypeScript client (clients/typescript): types generated from schema/,
# built with tsc, tested with Node's test runner against the real oac-shim
# booting bwrap guests. Needs Node.js 20+ and the npm registry for its
# development dependencies; make demo does not.
ts-test: build fixtures
	@scripts/ts-test.sh $(abspath $(BIN))

demo: deps build fixtures
	CGO_ENABLED=0 $(GO) build -trimpath -o $(BIN)/demo-upstream ./examples/demo-upstream
	@scripts/demo.sh $(BIN)

# Every command a user is told to run is linked for each OS and arch where
# they are told to run it (static, no cgo): on Linux all of cmd/ (oac-guest
# runs in Linux guests, oac-bench drives bwrap and /proc), on macOS and
# Windows oac-shim and oac-image (whose build command, writing Unix owners and
# device nodes, is compiled out on Windows with package imagebuild). Every
# package builds and vets for the desktop OSes (the guest, the e2e tests and
# the benchmarks are Linux-only and excluded by build tags); the darwin-only
# Virtualization.framework code of the vz provider is type-checked as a cgo
# build on macOS would compile it (it is built and tested for real only by
# .github/workflows/macos.yml).
WINDOWS_PKGS = $(shell GOOS=windows $(GO) list ./... | grep -v -e /imagebuild)
CROSS_CMDS_linux = ./cmd/...
CROSS_CMDS_darwin = ./cmd/oac-shim ./cmd/oac-image
CROSS_CMDS_windows = ./cmd/oac-shim ./cmd/oac-image
cross:
	@set -e; out=$$(mktemp -d); trap 'rm -rf "$$out"' EXIT; \
	for os in linux darwin windows; do for arch in amd64 arm64; do \
	  case $$os in linux) cmds="$(CROSS_CMDS_linux)";; darwin) cmds="$(CROSS_CMDS_darwin)";; windows) cmds="$(CROSS_CMDS_windows)";; esac; \
	  echo "GOOS=$$os GOARCH=$$arch go build $$cmds"; \
	  GOOS=$$os GOARCH=$$arch CGO_ENABLED=0 $(GO) build -o "$$out/$$os-$$arch/" $$cmds; \
	done; done
	GOOS=windows GOARCH=amd64 CGO_ENABLED=0 $(GO) build $(WINDOWS_PKGS)
	GOOS=windows GOARCH=amd64 CGO_ENABLED=0 $(GO) vet $(WINDOWS_PKGS)
	GOOS=darwin GOARCH=arm64 CGO_ENABLED=0 $(GO) build ./...
	GOOS=darwin GOARCH=arm64 CGO_ENABLED=0 $(GO) vet ./...
	GOOS=darwin GOARCH=amd64 CGO_ENABLED=0 $(GO) build ./...
	$(GO) run ./internal/darwincheck ./host/provider/vz

# Every fuzz target in turn for FUZZTIME; `make test` runs each one briefly
# (fuzz-short, FUZZTIME_SHORT: a count of inputs, not a duration, so a loaded
# machine cannot end a run while its workers are still starting). Corpora
# live in each package's testdata/fuzz.
FUZZTIME ?= 30s
FUZZTIME_SHORT ?= 1000x
fuzz:
	@GO=$(GO) scripts/fuzz.sh $(FUZZTIME)

fuzz-short:
	@GO=$(GO) scripts/fuzz.sh $(FUZZTIME_SHORT)

clean:
	rm -rf $(BIN)

distclean: clean
	rm -rf .cache

# Speed and memory figures beside their baselines; writes bench/results.md and .json.
BENCH_RUNS ?= 15
BENCH_DENSITY ?= 50
bench: test-deps build fixtures kernels
	@scripts/deps.sh $(BENCH_PKGS)
	OAC_KERNEL_CACHE=$(abspath .cache/kernel) OAC_KERNEL_CACHE_ARM64=$(abspath .cache/kernel-arm64) \
	  $(GO) run ./cmd/oac-bench -bin $(BIN) -out bench -runs $(BENCH_RUNS) -density $(BENCH_DENSITY)
	$(MAKE) bench-load

# Load at full scale: one guest with BENCH_LOAD_CONNS concurrent egress
# connections moving checksummed bytes both ways, BENCH_DENSITY bwrap guests
# started at once (the e2e load tests, CI-sized in make test). Their figures
# go to bench/load-results.md.
BENCH_LOAD_CONNS ?= 1000
bench-load:
	OAC_LOAD_CONNS=$(BENCH_LOAD_CONNS) OAC_LOAD_GUESTS=$(BENCH_DENSITY) OAC_KERNEL_CACHE=$(abspath $(KERNEL_CACHE)) \
	  $(GO) test -count=1 -timeout 30m -run '^TestLoad' -v ./e2e/ | tee bench/load.log
	@{ echo "# Load at full scale ($$(date -u +%F), $$(nproc) cores)"; echo; \
	   grep -o 'LOAD .*' bench/load.log | sed 's/^LOAD /- /'; } > bench/load-results.md
	@rm -f bench/load.log; cat bench/load-results.md
