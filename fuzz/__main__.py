"""Run one fuzz harness: `python -m fuzz <harness> [--runs N] [--corpus DIR] [-- libFuzzer args]`.

Seeds are written into the corpus directory (a temporary one unless --corpus is given), then
libFuzzer runs `--runs` inputs (0 or less: until stopped). A crash makes libFuzzer print the
traceback, write the input to `<artifacts>/crash-<sha1>` and exit non-zero; this process
exits with libFuzzer's status. To replay a crash file: `python -m fuzz <harness> -- FILE`.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import sys
import tempfile
from pathlib import Path

from fuzz import HARNESSES

# Every input is bounded: an endless loop on some input is a crash, not a slow run.
INPUT_TIMEOUT_S = 30
# A huge allocation (a length trusted from the input) must fail the run, not the machine.
RSS_LIMIT_MB = 2048


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fuzz", description=__doc__)
    parser.add_argument("harness", choices=sorted(HARNESSES))
    parser.add_argument("--runs", type=int, default=1_000_000,
                        help="inputs to run (default 1,000,000; 0: no limit)")
    parser.add_argument("--corpus", type=Path, help="corpus directory (default: temporary)")
    parser.add_argument("--artifacts", type=Path, default=Path("fuzz/artifacts"),
                        help="where crash-*/timeout-* files go (default: fuzz/artifacts)")
    parser.add_argument("--seed", type=int, default=0, help="libFuzzer -seed (0: random)")
    parser.add_argument("--max-len", type=int, default=0, help="libFuzzer -max_len (0: harness default)")
    parser.add_argument("libfuzzer_args", nargs="*", help="passed to libFuzzer after --")
    args = parser.parse_args(argv)

    import atheris  # noqa: PLC0415 - only needed here, after argument checks

    with atheris.instrument_imports(include=["onceflow"]):
        harness = importlib.import_module(HARNESSES[args.harness])

    with tempfile.TemporaryDirectory(prefix=f"fuzz-{args.harness}-") as tmp:
        corpus = args.corpus or Path(tmp)
        corpus.mkdir(parents=True, exist_ok=True)
        for seed in harness.seeds():
            (corpus / hashlib.sha1(seed).hexdigest()).write_bytes(seed)
        args.artifacts.mkdir(parents=True, exist_ok=True)
        libfuzzer = [
            sys.argv[0],
            f"-runs={args.runs if args.runs > 0 else -1}",
            f"-timeout={INPUT_TIMEOUT_S}",
            f"-rss_limit_mb={RSS_LIMIT_MB}",
            f"-max_len={args.max_len or harness.MAX_LEN}",
            f"-seed={args.seed}",
            f"-artifact_prefix={args.artifacts}/",
            "-print_final_stats=1",
            *args.libfuzzer_args,
        ]
        if not any(not arg.startswith("-") for arg in args.libfuzzer_args):
            libfuzzer.append(str(corpus))
        atheris.Setup(libfuzzer, harness.test_one_input)
        atheris.Fuzz()  # exits the process itself when libFuzzer is done
    return 0


if __name__ == "__main__":
    sys.exit(main())
