# The one place flags live. CI calls `make test`.
GO            ?= go
PKGS          ?= ./...
GOLANGCI_VER  ?= v2.15.0
GOLANGCI      := $(GO) run github.com/golangci/golangci-lint/v2/cmd/golangci-lint@$(GOLANGCI_VER)
PROTOC_GEN_GO := $(shell $(GO) tool -n protoc-gen-go 2>/dev/null)
BIN           ?= bin

.PHONY: all build install test test-allocs test-short test-32bit vet lint generate verify-generate bench demo clean fuzz reports bench-go check-dist chaos fleet fleet-cost sim flood hostile

all: build

build:
	$(GO) build -o $(BIN)/meshnode ./cmd/meshnode

# Into $(go env GOPATH)/bin (usually ~/go/bin); the module is not published,
# so `go install ...@latest` cannot work.
install:
	$(GO) install ./cmd/meshnode

# The operator files in dist/: systemd-analyze verify on the unit (skipped
# without Debian's systemd package) and the Grafana dashboard's metric names.
check-dist:
	$(GO) test -count=1 -v ./dist

vet:
	$(GO) vet $(PKGS)

# The full suite: race detector, shuffled order, fuzz seed corpora included.
# The packages whose tests take longest run first: two packages run at a
# time, and started last they would run on alone at the end while a core
# idles. Tests that mostly wait on real time call t.Parallel, and up to
# four of them run at once (-parallel 4): they use little CPU.
test: vet test-32bit test-allocs
	$(GO) test -race -shuffle=on -parallel 4 -timeout 9m $$($(GO) list $(PKGS) | awk '/\/(node|testnet|transport)$$/ { print; next } { rest = rest " " $$0 } END { print rest }')

# Edge devices run 32-bit ARM, where an int has 32 bits: every package
# (tests included) must build there, and values from the network, the disk
# and config files past such an int must be refused or bounded, never
# wrapped. 386 runs natively on an amd64 host whose kernel has IA32
# emulation (most do), so the decoders' tests and those of such values run
# as a 32-bit program; on a host that cannot run one they are skipped, and
# the target says so: the ARM vet has type-checked every package and test
# for a 32-bit int already, and building them for 386 only to not run them
# took two more minutes of compiling on a cold build cache.
CAN_RUN_386 = $(shell d=$$(mktemp -d) && CGO_ENABLED=0 GOARCH=386 $(GO) test -c -o $$d/p.test ./internal/badconfig >/dev/null 2>&1 && $$d/p.test -test.run '^$$' >/dev/null 2>&1 && echo yes; rm -rf $$d)
test-32bit:
	CGO_ENABLED=0 GOARCH=arm GOARM=7 $(GO) vet $(PKGS)
	@if [ "$(CAN_RUN_386)" != yes ]; then \
		echo "test-32bit: this kernel cannot run 386 programs (no IA32 emulation): the 32-bit tests are not run (the ARM vet above type-checked them)"; exit 0; fi; \
	set -ex; \
	CGO_ENABLED=0 GOARCH=386 $(GO) test -count=1 -run 'Name|Signer|Ref|Frame|Receipt|Decode|Fuzz' ./transport ./internal/envcodec ./mailbox/...; \
	CGO_ENABLED=0 GOARCH=386 $(GO) test -count=1 -run 'PastAnInt|DamagedOverflow|PastThisBuild|UnboundedPeerBytes|RetryHint|HugeTTL' ./node ./partition ./outbox ./cmd/meshnode ./internal/storecheck

# The allocation guards of the hot paths (allocs_test.go in node and
# transport), without the race detector, which drops sync.Pool puts at
# random, so they are skipped in the race run above. A few seconds once
# the build is cached.
test-allocs:
	$(GO) test -count=1 -run '^TestAllocsPer(Message|Receipt)$$' ./node ./transport

test-short:
	$(GO) test -short -race $(PKGS)

lint:
	$(GOLANGCI) run $(PKGS)
	cd bench && $(GOLANGCI) run ./...

# protoc comes from Debian's protobuf-compiler; protoc-gen-go is pinned in
# go.mod (tool directive); protoc-gen-meshnode is built from this repository.
# The wire schema, then each example's service (its .pb.go and _meshnode.pb.go).
PROTO_EXAMPLES := examples/device/devicepb
generate:
	@command -v protoc >/dev/null || { echo "protoc not found: apt-get install protobuf-compiler" >&2; exit 1; }
	$(GO) build -o $(BIN)/protoc-gen-meshnode ./cmd/protoc-gen-meshnode
	cd mailbox/pb && protoc --plugin=protoc-gen-go=$(PROTOC_GEN_GO) --go_out=. --go_opt=paths=source_relative meshnode.proto
	for d in $(PROTO_EXAMPLES); do \
		(cd $$d && protoc --plugin=protoc-gen-go=$(PROTOC_GEN_GO) --plugin=protoc-gen-meshnode=$(abspath $(BIN))/protoc-gen-meshnode \
			--go_out=. --go_opt=paths=source_relative --meshnode_out=. --meshnode_opt=paths=source_relative *.proto) || exit 1; \
	done

verify-generate: generate
	@git diff --exit-code -- mailbox/pb $(PROTO_EXAMPLES) || { echo "generated code is stale: run make generate and commit" >&2; exit 1; }
	@test -z "$$(git status --porcelain -- mailbox/pb $(PROTO_EXAMPLES))" || { git status --short -- mailbox/pb $(PROTO_EXAMPLES); echo "generated files are not committed" >&2; exit 1; }

# The side-by-side harness (its own module under bench/): meshnode vs NATS,
# raw quic-go and bbolt, at a size that takes a few minutes.
bench:
	cd bench && $(GO) run ./cmd/meshbench -backlog 100000 -json bench.json

# Go benchmarks of the hot paths in every package.
bench-go:
	$(GO) test -run '^$$' -bench . -benchmem -count 1 $(PKGS)

# Short fuzzing of every decoder of bytes from the network, a file or an
# HTTP request (seed corpora also run in `make test`). FUZZTIME each.
FUZZTIME ?= 20s
FUZZ_TARGETS = \
	./transport:FuzzReadFrame ./transport:FuzzDecodeEnvelopeFrame ./transport:FuzzEnvelopeCodec ./transport:FuzzEnvelopeLimits ./transport:FuzzVerifyOrigin \
	./transport:FuzzDecodeControlFrame ./transport:FuzzReceiptEncodeMatchesGeneric ./transport:FuzzReadEnvelopeFrame ./transport:FuzzLaneNames \
	./mailbox/pb:FuzzUnmarshalFrame ./mailbox/pb:FuzzUnmarshalEnvelope ./mailbox:FuzzErrorOf \
	./mesh:FuzzPreamble ./mesh:FuzzDecodeMeta ./mesh:FuzzDecodeLeaveIntent ./mesh:FuzzDecodePeers ./mesh:FuzzMemberlistLogLine \
	./outbox:FuzzDecodeRecord ./outbox:FuzzDecodeOutStream ./outbox:FuzzResume ./outbox:FuzzMigrateEnvelope \
	./outbox:FuzzCheckRecipient ./outbox:FuzzStreamKey \
	./internal/storecheck:FuzzCheck ./internal/admin:FuzzDecodeSendRequest ./internal/admin:FuzzDecodeResponse
fuzz:
	@set -e; for t in $(FUZZ_TARGETS); do \
		pkg=$${t%%:*}; name=$${t##*:}; \
		echo "fuzz $$name ($$pkg, $(FUZZTIME))"; \
		$(GO) test -run '^$$' -fuzz "^$$name$$" -fuzztime $(FUZZTIME) $$pkg; \
	done

# Membership at fleet size (figures in docs/fleet-scale.md). Not in `test`:
# 200 real members for a 2-minute steady run; 1,000 and 5,000 simulated
# members in virtual time; a stranger flooding the gossip port for 30 s.
fleet:
	MESH_FLEET=200 MESH_FLEET_STEADY=2m MESH_REPORT_DIR=$(CURDIR)/docs $(GO) test -count 1 -run TestFleet -v -timeout 30m ./mesh/

# What a fleet of whole nodes costs per node at rest (memory, goroutines,
# connections, gossip); figures in README.md.
fleet-cost:
	MESHNODE_FLEET_NODES=200 $(GO) test -count 1 -run TestFleetCost -v -timeout 20m ./testnet/

sim:
	MESH_SIM=1000,5000 MESH_REPORT_DIR=$(CURDIR)/docs $(GO) test -count 1 -run TestSimulatedCluster -v -timeout 150m ./mesh/

flood:
	MESH_FLOOD=30s $(GO) test -count 1 -run TestGossipFloodCannotMoveMembership -v -timeout 5m ./mesh/

# A member and a stranger attack one node's memory at once for 30 s while
# a good peer asks it (figures in docs/threat-model.md). make test runs 2 s.
hostile:
	MESHNODE_HOSTILE=30s $(GO) test -count 1 -run TestMemoryUnderAttack -v -timeout 5m ./node/

# The chaos run at size: 10 seeds of 100,000 reliable messages each, under
# the full nemesis (see testnet/chaos_test.go). make test runs 10 seeds of 2,000.
chaos:
	TESTNET_CHAOS_SEEDS=10 TESTNET_CHAOS_MESSAGES=100000 TESTNET_CHAOS_DURATION=60s \
		$(GO) test -run '^TestChaos$$' -count=1 -timeout 120m -v ./testnet | grep -E '^(---|    ---|ok|FAIL)|seed [0-9]+: sent|lost|duplicate runs|order violations|healthy|unexpected|seeds,'

demo:
	$(GO) run ./cmd/meshnode demo

clean:
	rm -rf $(BIN)

# The scenario reports linked from the README, at the large size (several
# minutes on 2 cores).
reports:
	$(GO) run ./cmd/meshnode testnet run all --size large --out docs
