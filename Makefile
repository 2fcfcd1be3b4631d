# Set-up and the two everyday commands. `make demo` runs the investigation on the embedded model;
# `make test` runs the linter and every test. Both create .venv and install on first use.
# `make docs` builds the documentation site into site/.
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
# the CPU wheel of torch that lies on this machine's disk; an unpinned torch would pull a CUDA build
TORCH  ?= torch==2.13.0

.PHONY: install test lint demo docs chromium assets benchmarks clean

$(STAMP): pyproject.toml Makefile
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH)"
	$(PY) -m pip install -q -e ".[app,dev,corpus,ray,docs]"
	touch $(STAMP)

install: $(STAMP)

# bertviz's scripts (require.js, d3 5.7, jQuery 2) from the npm registry: the app inlines them, never a CDN
ASSETS := apps/vendor/node_modules/.package-lock.json
$(ASSETS): apps/vendor/package.json apps/vendor/package-lock.json
	npm ci --prefix apps/vendor --no-audit --no-fund
	touch $(ASSETS)

assets: $(ASSETS)

# Debian's Chromium for the browser tests (never a browser download by Playwright)
chromium:
	@command -v chromium >/dev/null 2>&1 || (apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium)

lint: install
	$(VENV)/bin/ruff check inspector apps tests benchmarks fixtures
	$(VENV)/bin/lint-imports

test: install assets chromium lint
	HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 $(PY) -m pytest -q

demo: install assets
	HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 $(VENV)/bin/inspector demo $(DEMO_ARGS)

# the documentation site from docs/ (MkDocs, Material, mkdocstrings), offline; --strict: a broken link, reference
# or generated part fails the build (mkdocs.yml, docs/hooks/generated.py)
docs: install
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --site-dir site

benchmarks: install
	$(PY) benchmarks/capture.py
	$(PY) benchmarks/analysis.py
	$(PY) benchmarks/app.py

clean:
	rm -rf $(VENV) out site .pytest_cache apps/vendor/node_modules
