# The two commands of the quick start: `make run` and `make test`.
# Each creates .venv on first use and installs everything it needs.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: run test bench chaos fuzz clean

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

# The long fuzz runs (docs/reliability.md, "Fuzzing"): every harness in fuzz/, one at a time,
# niced; crash files go to fuzz/artifacts/. FUZZ_RUNS=0 runs until stopped.
FUZZ_RUNS ?= 1000000
FUZZ_HARNESSES := request_decoder record_batch producer_state
fuzz: $(STAMP)
	for harness in $(FUZZ_HARNESSES); do \
		PYTHONPATH=src nice -n 10 $(BIN)/python -m fuzz $$harness --runs $(FUZZ_RUNS) \
			--artifacts fuzz/artifacts || exit 1; \
	done

clean:
	rm -rf $(VENV) data .pytest_cache
