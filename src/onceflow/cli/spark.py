"""`onceflow spark pack`: the current virtual environment as a relocatable archive for a
Spark cluster's executors (`spark.archives` / `--archives ARCHIVE#environment`).

The archive is built with venv-pack (the `venv-pack2` distribution, part of the spark
extra). It holds the environment's packages and scripts, not the Python interpreter:
`bin/python` stays a link to the base interpreter the venv was made from, so every
worker needs that Python (same version, same path) - venv-pack's own rule.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Annotated

import typer

from onceflow.cli.clients import CliError, exits_cleanly, stdout

spark_app = typer.Typer(name="spark", no_args_is_help=True,
                        help="Prepare Spark clusters for onceflow pipelines.")

DEFAULT_ARCHIVE = "onceflow-env.tar.gz"


def current_venv() -> Path:
    """The virtual environment this Python runs in; CliError when it runs in none."""
    if sys.prefix == sys.base_prefix:
        raise CliError(f"{sys.executable} is not in a virtual environment: create one with "
                       "onceflow[spark] installed, or pass --prefix")
    return Path(sys.prefix)


@spark_app.command("pack")
@exits_cleanly
def pack(
    output: Annotated[Path, typer.Option("--output", "-o", help="Archive to write (.tar.gz, .zip ...).")] = Path(DEFAULT_ARCHIVE),
    prefix: Annotated[Path | None, typer.Option(
        "--prefix", "-p", help="Virtual environment to pack; default: this command's own.")] = None,
    force: Annotated[bool, typer.Option("--force", help="Overwrite an existing archive.")] = False,
) -> None:
    """Pack a virtual environment (with onceflow[spark] installed, not editable) into an
    archive for the executors, and print how to use it."""
    try:
        import venv_pack
    except ImportError as exc:  # pragma: no cover - the spark extra is missing
        raise CliError(f"packing needs the spark extra (pip install 'onceflow[spark]'): {exc}") from None

    venv = prefix if prefix is not None else current_venv()
    started = time.monotonic()
    try:
        written = Path(venv_pack.pack(prefix=str(venv), output=str(output), force=force))
    except venv_pack.VenvPackException as exc:
        # An editable install (pip install -e) is a link to a source tree the workers lack.
        raise CliError(f"cannot pack {venv}: {' '.join(str(exc).split())}") from None
    size_mb = written.stat().st_size / 1e6
    out = stdout()
    out.print(f"packed {venv} into {written} ({size_mb:,.1f} MB in {time.monotonic() - started:.1f} s)",
              highlight=False, soft_wrap=True)
    out.print("use it (the executors unpack it as ./environment and run its Python):\n"
              f"  onceflow pipeline run FILE --master spark://HOST:7077 --archive {written}\n"
              f"  session(\"spark://HOST:7077\", archive=\"{written}\")   # onceflow.spark\n"
              f"  spark-submit --archives {written}#environment "
              "--conf spark.pyspark.python=./environment/bin/python ...",
              highlight=False, soft_wrap=True)
