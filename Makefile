# One obvious way to build. `make help` lists the targets.
SHELL := /usr/bin/env bash
GO ?= go
BIN := $(CURDIR)/bin
VERSION ?= 0.26.0
LDFLAGS := -X github.com/iii-sandbox/iii/internal/version.Version=$(VERSION)
GOFLAGS_BUILD := -trimpath -ldflags '$(LDFLAGS)'
HOST_ARCH := $(shell $(GO) env GOARCH)
# The sandbox-libkrun package published into bin/registry, the registry `iii` uses by default.
# Keep ADAPTER_VERSION equal to adapter.Version (plugins/sandbox-libkrun/adapter/provider.go).
ADAPTER_VERSION ?= 0.3.1
# The standard registry workers published beside it (docs/standard-workers.md). Keep STATE_VERSION
# equal to state.Version (workers/state/config.go; a test checks).
STATE_VERSION ?= 0.22.19
STATE_DEFAULTS := {"adapter":{"name":"kv","config":{"store_method":"file_based"}}}
# Keep CRON_VERSION equal to cron.Version (workers/cron/config.go; a test checks).
CRON_VERSION ?= 0.21.26
CRON_DEFAULTS := {"adapter":{"name":"local"}}
# Keep HTTP_VERSION equal to httpworker.Version (workers/http/config.go; a test checks), HTTP_DEFAULTS
# to httpworker.DefaultConfig.
HTTP_VERSION ?= 0.22.7
HTTP_DEFAULTS := {"cors":{"allowed_origins":["*"],"allowed_methods":["GET","POST","PUT","DELETE","OPTIONS"]}}
# Keep QUEUE_VERSION equal to queue.Version (workers/queue/config.go; a test checks), QUEUE_DEFAULTS
# to queue.DefaultConfig.
QUEUE_VERSION ?= 0.21.26
QUEUE_DEFAULTS := {"adapter":{"name":"builtin","config":{"store_method":"file_based","file_path":"data/queue"}}}
# Keep PUBSUB_VERSION equal to pubsub.Version (workers/pubsub/config.go; a test checks): deprecated
# upstream, kept for projects that still declare it.
PUBSUB_VERSION ?= 0.21.14
PUBSUB_DEFAULTS := {"adapter":{"name":"local"}}
SANDBOX_LIBKRUN_DEFAULTS := {"auto_install":true,"default_cpus":1,"default_idle_timeout_secs":300,"default_memory_mb":512,"image_allowlist":["python","node"],"max_concurrent_sandboxes":32}

.PHONY: help build build-sandbox modules test test-nokvm bench demo fmt vet fuzz setup setup-test cross clean proto

help: ## List the targets.
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | sed -E 's/:.*## /\t/' | sort

modules: ## Download every module go.mod names into the module cache (an adapter module's offline `go mod tidy` needs them).
	$(GO) mod download

build-sandbox: ## Build only what make demo runs into bin/: iii, sandbox-libkrun, the guest agent.
	@mkdir -p $(BIN)
	$(GO) build $(GOFLAGS_BUILD) -o $(BIN)/ ./cmd/iii ./plugins/sandbox-libkrun/cmd/sandbox-libkrun
	CGO_ENABLED=0 GOOS=linux GOARCH=$(HOST_ARCH) $(GO) build -trimpath -ldflags '-s -w' \
		-o $(BIN)/iii-guest-agent-linux-$(HOST_ARCH) ./plugins/sandbox-libkrun/cmd/iii-guest-agent

build: modules build-sandbox ## Build every binary into bin/: iii, the adapters, the guest agent.
	$(GO) build $(GOFLAGS_BUILD) -o $(BIN)/sandbox-hostdir ./plugins/sdk/examples/hostdir/cmd/sandbox-hostdir
	$(GO) run -trimpath ./scripts/publish -registry $(BIN)/registry -name sandbox-libkrun -version $(ADAPTER_VERSION) \
		-description 'The sandbox adapter that runs sandboxes and worker VMs as microVMs' \
		-default-config '$(SANDBOX_LIBKRUN_DEFAULTS)' \
		$(BIN)/sandbox-libkrun $(BIN)/iii-guest-agent-linux-$(HOST_ARCH)
	$(GO) build $(GOFLAGS_BUILD) -o $(BIN)/state ./workers/state/cmd/state
	$(GO) run -trimpath ./scripts/publish -registry $(BIN)/registry -name state -version $(STATE_VERSION) \
		-description 'Scoped key/value state with change triggers (state::*, trigger type state)' \
		-default-config '$(STATE_DEFAULTS)' $(BIN)/state
	$(GO) build $(GOFLAGS_BUILD) -o $(BIN)/cron ./workers/cron/cmd/cron
	$(GO) run -trimpath ./scripts/publish -registry $(BIN)/registry -name cron -version $(CRON_VERSION) \
		-description 'Fire functions on cron schedules, seconds field first, UTC (trigger type cron)' \
		-default-config '$(CRON_DEFAULTS)' $(BIN)/cron
	$(GO) build $(GOFLAGS_BUILD) -o $(BIN)/http ./workers/http/cmd/http
	$(GO) run -trimpath ./scripts/publish -registry $(BIN)/registry -name http -version $(HTTP_VERSION) \
		-description 'HTTP routes as triggers (trigger type http, its own listener on 127.0.0.1:3111)' \
		-default-config '$(HTTP_DEFAULTS)' $(BIN)/http
	$(GO) build $(GOFLAGS_BUILD) -o $(BIN)/queue ./workers/queue/cmd/queue
	$(GO) run -trimpath ./scripts/publish -registry $(BIN)/registry -name queue -version $(QUEUE_VERSION) \
		-description 'Durable topics and function queues: retries, dead letters, the enqueue provider (trigger type durable:subscriber)' \
		-default-config '$(QUEUE_DEFAULTS)' $(BIN)/queue
	$(GO) build $(GOFLAGS_BUILD) -o $(BIN)/pubsub ./workers/pubsub/cmd/pubsub
	$(GO) run -trimpath ./scripts/publish -registry $(BIN)/registry -name pubsub -version $(PUBSUB_VERSION) \
		-description 'Deprecated: publish and the subscribe trigger type, fire and forget (use queue for messages that must arrive)' \
		-default-config '$(PUBSUB_DEFAULTS)' $(BIN)/pubsub

setup: ## Install what sandboxes need (QEMU, a kernel, tools) and build the preset images (idempotent).
	./scripts/setup.sh

setup-test: setup ## Install what the tests need too (idempotent): the pinned Node SDK.
	./scripts/setup-test.sh

test: setup-test build vet cross ## Set up, build and run the whole test suite; ends with the environment it ran in.
	@rm -rf $(BIN)/test-facts; rc=0; \
	III_BIN_DIR=$(BIN) III_TEST_FACTS=$(BIN)/test-facts $(GO) test -count=1 -timeout 25m ./... || rc=$$?; \
	$(GO) run -trimpath ./scripts/testenv -facts $(BIN)/test-facts -root $(CURDIR); exit $$rc

test-nokvm: ## make test in a mount namespace whose /dev holds no kvm (proves the suite needs none).
	./scripts/test-nokvm.sh make test

bench: build ## Run the benchmark harnesses and print figures beside their floors.
	./scripts/bench/run.sh

demo: ## Set up and run the main job end to end (builds what it runs first, then times each stage).
	MAKE="$(MAKE)" ./scripts/demo.sh

fmt: ## Format the code.
	gofmt -w $$(git ls-files '*.go' | grep -v '\.pb\.go$$')

vet: ## go vet (this host, darwin, linux/arm64), a gofmt check and golangci-lint (.golangci.yml).
	$(GO) vet ./...
	GOOS=darwin $(GO) vet ./...
	GOOS=linux GOARCH=arm64 $(GO) vet ./...
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	./tools/lint/run.sh

fuzz: ## Run every fuzz target for a short while.
	./scripts/fuzz.sh

cross: ## Cross-compile every binary for darwin/arm64 and linux/arm64 (the guest agent: linux only).
	GOOS=darwin GOARCH=arm64 $(GO) build -o /dev/null ./cmd/iii
	GOOS=darwin GOARCH=arm64 $(GO) build -o /dev/null ./plugins/sandbox-libkrun/cmd/sandbox-libkrun
	GOOS=darwin GOARCH=arm64 $(GO) build -o /dev/null ./plugins/sdk/examples/hostdir/cmd/sandbox-hostdir
	GOOS=linux GOARCH=arm64 $(GO) build -o /dev/null ./cmd/iii
	GOOS=linux GOARCH=arm64 $(GO) build -o /dev/null ./plugins/sandbox-libkrun/cmd/sandbox-libkrun
	GOOS=linux GOARCH=arm64 $(GO) build -o /dev/null ./plugins/sdk/examples/hostdir/cmd/sandbox-hostdir
	GOOS=darwin GOARCH=arm64 $(GO) build -o /dev/null ./workers/state/cmd/state
	GOOS=linux GOARCH=arm64 $(GO) build -o /dev/null ./workers/state/cmd/state
	GOOS=darwin GOARCH=arm64 $(GO) build -o /dev/null ./workers/cron/cmd/cron
	GOOS=linux GOARCH=arm64 $(GO) build -o /dev/null ./workers/cron/cmd/cron
	GOOS=darwin GOARCH=arm64 $(GO) build -o /dev/null ./workers/http/cmd/http
	GOOS=linux GOARCH=arm64 $(GO) build -o /dev/null ./workers/http/cmd/http
	GOOS=darwin GOARCH=arm64 $(GO) build -o /dev/null ./workers/queue/cmd/queue
	GOOS=linux GOARCH=arm64 $(GO) build -o /dev/null ./workers/queue/cmd/queue
	GOOS=darwin GOARCH=arm64 $(GO) build -o /dev/null ./workers/pubsub/cmd/pubsub
	GOOS=linux GOARCH=arm64 $(GO) build -o /dev/null ./workers/pubsub/cmd/pubsub
	CGO_ENABLED=0 GOOS=linux GOARCH=arm64 $(GO) build -o /dev/null ./plugins/sandbox-libkrun/cmd/iii-guest-agent
	CGO_ENABLED=0 GOOS=linux GOARCH=amd64 $(GO) build -o /dev/null ./plugins/sandbox-libkrun/cmd/iii-guest-agent

proto: ## Regenerate the gRPC code from contract/proto with pinned generators.
	./scripts/proto.sh

clean: ## Remove build outputs.
	rm -rf $(BIN)
