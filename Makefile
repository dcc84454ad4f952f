# agentvm — build, install, test, benchmark.
#   make demo    fresh Debian 12 machine -> a container running under agentvm
#   make test    installs what it needs, then runs every test
PREFIX     ?= /usr/local
CARGO      ?= cargo
PROFILE    ?= release
TARGET_DIR := target/x86_64-unknown-linux-gnu/$(PROFILE)
BIN        := $(TARGET_DIR)/agentvm
# containerd's shim v2 for agentvm (shim/): containerd finds it in PATH by
# the runtime name io.containerd.agentvm.v2.
SHIM       := $(TARGET_DIR)/containerd-shim-agentvm-v2
CARGO_PROFILE_FLAG := $(if $(filter release,$(PROFILE)),--release,)

export AGENTVM_COMMIT ?= $(shell git rev-parse --short HEAD 2>/dev/null || echo unknown)

.PHONY: all build deps kernel kernel-testhost kernel-test test-builtin virtiofsd install demo test lint unit-test fuzz fuzz-test integration-test conformance bench clean

KERNEL_DEST := $(DESTDIR)$(PREFIX)/share/agentvm/vmlinux

all: build

deps:
	scripts/install-deps.sh
	scripts/install-criu.sh

build:
	$(CARGO) build $(CARGO_PROFILE_FLAG) --locked -p agentvm -p agentvm-shim

# The guest kernel, built once per config into /var/cache/agentvm/kernels.
kernel:
	install -D -m 0644 "$$(kernels/build.sh)" $(KERNEL_DEST)

# The test host's kernel (the guest's options plus KVM and KVM_AMD), cached
# beside the guest kernel; `make test-builtin` boots it under QEMU TCG.
kernel-testhost:
	kernels/build.sh --flavor testhost >/dev/null

virtiofsd:
	scripts/install-virtiofsd.sh

install: build kernel virtiofsd
	install -D -m 0755 $(BIN) $(DESTDIR)$(PREFIX)/bin/agentvm
	install -D -m 0755 $(SHIM) $(DESTDIR)$(PREFIX)/bin/containerd-shim-agentvm-v2
	scripts/register-docker-runtimes.sh $(PREFIX)/bin/agentvm

demo: deps install
	scripts/demo.sh $(PREFIX)/bin/agentvm

lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --locked --workspace --all-targets $(CARGO_PROFILE_FLAG) -- -D warnings

# Also runs each fuzz target for a bounded number of cases and replays
# fuzz/regressions/ (the agentvm-fuzz crate's tests; docs/fuzzing.md).
unit-test:
	$(CARGO) test --locked $(CARGO_PROFILE_FLAG) --workspace --bins --lib

# Fuzzing on stable Rust (docs/fuzzing.md): every target for FUZZ_SECONDS
# each, in the `fuzz` profile (optimised, overflow checks on, panics caught).
# A crash saves its input under fuzz/crashes/ and fails the target.
FUZZ_SECONDS ?= 60
FUZZ_TARGET  ?= all
FUZZ_SEED    ?=
fuzz:
	$(CARGO) run --locked --profile fuzz -p agentvm-fuzz -- --target $(FUZZ_TARGET) \
		--time $(FUZZ_SECONDS) $(if $(FUZZ_SEED),--seed $(FUZZ_SEED),)

# Just the bounded fuzz run and the regression corpus (part of unit-test).
fuzz-test:
	$(CARGO) test --locked $(CARGO_PROFILE_FLAG) -p agentvm-fuzz --lib

integration-test: build
	$(CARGO) test --locked $(CARGO_PROFILE_FLAG) -p agentvm --tests -- --test-threads=2

conformance: build
	PROFILE=$(PROFILE) tests/oci-validation/run.sh

# The guest kernel's own smoke boot (exit 77 = cannot run here: skipped).
kernel-test: kernel
	@kernels/smoke-boot.sh; rc=$$?; \
	if [ $$rc -eq 77 ]; then echo "kernel-test: skipped"; elif [ $$rc -ne 0 ]; then exit $$rc; fi

# The builtin VMM's tests that need a standard hardware KVM, run inside the
# test host (a QEMU TCG VM with AMD SVM and kvm_amd; docs/testing.md): the
# real-KVM tests, a Linux guest booted by the builtin VMM, and the microvm
# tier's own tests (tests/microvm.rs, tests/sandbox_network.rs) with
# vmm = "builtin". agentvm and its test binaries are static, so they run
# there as they are. Exit 77 = cannot run here: skipped, said so.
TEST_EXE = $(CARGO) test --locked $(CARGO_PROFILE_FLAG) -p agentvm $(1) --no-run --message-format=json \
	| jq -r 'select(.reason == "compiler-artifact" and .profile.test and .target.name == "$(2)") | .executable' | tail -n1
test-builtin: kernel-testhost build
	@lib=$$($(call TEST_EXE,--lib,agentvm)); microvm=$$($(call TEST_EXE,--test microvm,microvm)); \
	network=$$($(call TEST_EXE,--test sandbox_network,sandbox_network)); \
	[ -n "$$lib" ] && [ -n "$$microvm" ] && [ -n "$$network" ] || { echo "test-builtin: cannot find agentvm's test binaries"; exit 1; }; \
	AGENTVM_KERNEL="$$(kernels/build.sh)" TESTHOST_KERNEL="$$(kernels/build.sh --flavor testhost)" \
		tests/testhost/run.sh "$$lib" $(BIN) "$$microvm" "$$network"; rc=$$?; \
	if [ $$rc -eq 77 ]; then echo "test-builtin: skipped"; elif [ $$rc -ne 0 ]; then exit $$rc; fi

test: deps lint unit-test kernel virtiofsd kernel-test test-builtin integration-test conformance

# Part (e), pods through CRI, needs the shim: `build` makes it (the bench
# profile shares the release directory). Part (f) boots the test host of
# test-builtin, with QEMU and virtiofsd beside the builtin VMM.
bench: deps build kernel virtiofsd kernel-testhost
	$(CARGO) bench --locked -p agentvm --bench compare

clean:
	$(CARGO) clean
