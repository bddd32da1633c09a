# Two commands do all set-up on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: demo test test-slow bench reproduce clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev,embed,flower]'
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/secure-afl demo

test: $(STAMP)
	$(PY) -m pytest -q

test-slow: $(STAMP)
	$(PY) -m pytest -q -m slow

reproduce: $(STAMP)
	$(VENV)/bin/secure-afl reproduce dummy

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
