# The two commands of the quick start: `make run` and `make test`.
# Each creates .venv on first use and installs everything it needs.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: run test bench chaos clean

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

# The long chaos runs (docs/reliability.md): single node, then --nodes 3. Each prints its
# seed; CHAOS_SEED repeats a run, CHAOS_SECONDS sets the length of each.
CHAOS_SECONDS ?= 900
CHAOS_SEED    ?=
chaos: $(STAMP)
	nice -n 10 $(BIN)/python -m tests.chaos --seconds $(CHAOS_SECONDS) $(if $(CHAOS_SEED),--seed $(CHAOS_SEED))
	nice -n 10 $(BIN)/python -m tests.chaos --seconds $(CHAOS_SECONDS) --nodes 3 $(if $(CHAOS_SEED),--seed $(CHAOS_SEED))

clean:
	rm -rf $(VENV) data .pytest_cache
