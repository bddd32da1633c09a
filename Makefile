# Two commands do all set-up on a fresh machine: `make demo` and `make test`.
# `make demo` installs the package and the tools (tools/, its own distribution), nothing more;
# `make test` and `make test-all` add the extras (dev, embed, flower, bench, fast: numba for the split projection).
# Each level has its own stamp, so `make demo` then `make test` upgrades .venv.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
BASE   := $(VENV)/.installed-base
FULL   := $(VENV)/.installed-full
PYTEST := $(PY) -m pytest -q --durations=15

.PHONY: demo test test-rest test-all wheel-check reproduce clean

$(PY):
	$(PYTHON) -m venv $(VENV)

# the package, then the tools (demo, attacks, benchmarks): a separate distribution no party's install carries
$(BASE): pyproject.toml setup.py tools/pyproject.toml | $(PY)
	$(PY) -m pip install -q -e .
	$(PY) -m pip install -q -e ./tools
	touch $@

$(FULL): $(BASE)
	$(PY) -m pip install -q -e '.[dev,embed,flower,bench,fast]'
	touch $@

demo: $(BASE)
	$(VENV)/bin/secure-afl demo --all

# the quick loop: everything that runs in one process, plus one end-to-end session per backend
test: $(FULL)
	$(PYTEST) -m '(not e2e and not slow) or smoke'

# what `make test` leaves out: the other end-to-end tests, Flower, the slow fuzz, the wheel check
test-rest: $(FULL)
	$(PYTEST) -m 'not ((not e2e and not slow) or smoke)'

# everything in one run (`.ci/run` runs `make test` then `make test-rest`: the same tests, each once)
test-all: $(FULL)
	$(PYTEST)

# the wheel, installed into a fresh virtual environment: every module imports, every backend's demo passes
wheel-check: $(FULL)
	$(PYTEST) -m wheel

reproduce: $(BASE)
	$(VENV)/bin/secure-afl reproduce dummy

clean:
	rm -rf $(VENV) build dist *.egg-info .pytest_cache
