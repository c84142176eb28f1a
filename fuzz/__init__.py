"""Coverage-guided fuzz harnesses (atheris, libFuzzer) for the code that judges peer bytes.

Theory of operation. Each harness module has `test_one_input(data)`, which feeds one fuzzed
input to the code under test and lets an exception escape only when it is a crash; the
protocol's own errors (named per harness in `PROTOCOL_ERRORS`) are caught there, because they
are the documented answer to bad input (a Kafka error code or a closed connection). Anything
else that escapes - IndexError, struct.error, KeyError, AssertionError, RecursionError,
MemoryError - and a run that exceeds libFuzzer's `-timeout` is a crash: libFuzzer stops and
writes the input to a `crash-*` / `timeout-*` file. `seeds()` returns valid inputs built
with the project's own encoders, written into a fresh corpus directory at start.

`python -m fuzz <harness> --runs N` runs one harness (see `fuzz/__main__.py`); only the
`onceflow` package is instrumented for coverage. The results of the long runs are in
docs/reliability.md, section "Fuzzing".

Nothing here imports `onceflow` at package level: the runner must import the harness inside
atheris' import hook, so that onceflow's modules are instrumented when they are first loaded.
"""

HARNESSES = {
    "request_decoder": "fuzz.request_decoder",
    "record_batch": "fuzz.record_batch",
    "producer_state": "fuzz.producer_state",
}
