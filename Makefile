# The two commands of the quick start: `make run` and `make test`.
# Each creates .venv on first use and installs everything it needs.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: run test bench clean

$(STAMP): pyproject.toml scripts/setup.sh scripts/system-packages.sh scripts/java-clients.sh tests/js/package.json \
          scripts/console-assets.sh web/package-lock.json
	bash scripts/setup.sh $(PYTHON) $(VENV)
	touch $(STAMP)

run: $(STAMP)
	$(BIN)/python -m onceflow.demo

test: $(STAMP)
	bash scripts/test.sh $(BIN)

bench: $(STAMP)
	$(BIN)/python bench/throughput.py

clean:
	rm -rf $(VENV) data .pytest_cache
