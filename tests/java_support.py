"""Run small Java programs against the Java Kafka client (kafka-clients 3.9.1).

`scripts/setup.sh` puts kafka-clients and its run-time jars in `<venv>/share/kafka-java`
(from the PyPI package shigawire-apache-flink-libraries: no Maven repository is reachable).
Programs live in `tests/java/<Name>.java`, one public class `Name` each; they are compiled
once per source content into a cache directory and run with the client on the classpath.
A program reports what it saw as JSON lines on stdout, which `run_java` returns parsed.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

JAVA_LIB = Path(sys.prefix) / "share" / "kafka-java"
SOURCES = Path(__file__).parent / "java"
BUILD_ROOT = Path(tempfile.gettempdir()) / "onceflow-java-build"
COMPILE_TIMEOUT_S = 180


def classpath(*extra: Path) -> str:
    jars = sorted(JAVA_LIB.glob("*.jar"))
    if not any(j.name == "kafka-clients.jar" for j in jars):
        raise RuntimeError(f"the Java Kafka client is missing from {JAVA_LIB}: run "
                           "scripts/setup.sh (make test does) to fetch it")
    return os.pathsep.join(str(p) for p in (*extra, *jars))


def compile_program(name: str) -> Path:
    """The directory holding the compiled classes of tests/java/<name>.java."""
    source = SOURCES / f"{name}.java"
    digest = hashlib.sha256(source.read_bytes() + classpath().encode()).hexdigest()[:16]
    classes = BUILD_ROOT / f"{name}-{digest}"
    if (classes / f"{name}.class").exists():
        return classes
    BUILD_ROOT.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f"{name}-", dir=BUILD_ROOT))
    try:
        subprocess.run(["javac", "-nowarn", "-encoding", "UTF-8", "-cp", classpath(),
                        "-d", str(staging), str(source)],
                       check=True, capture_output=True, text=True, timeout=COMPILE_TIMEOUT_S)
        try:
            staging.rename(classes)  # atomic: concurrent test sessions may race here
        except OSError:
            if not (classes / f"{name}.class").exists():
                raise
    except subprocess.CalledProcessError as exc:
        raise RuntimeError(f"javac {source.name} failed:\n{exc.stderr}") from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return classes


def java_command(name: str, *args: str) -> list[str]:
    return ["java", "-cp", classpath(compile_program(name)), name, *args]


def run_java(name: str, *args: str, timeout_s: float = 120) -> list[dict]:
    """Run tests/java/<name>.java to completion; its JSON lines on stdout, parsed. Raises
    with the program's stderr when it exits non-zero."""
    done = subprocess.run(java_command(name, *args), capture_output=True, text=True,
                          timeout=timeout_s)
    if done.returncode != 0:
        raise AssertionError(f"{name} exited {done.returncode}:\n{done.stderr[-4000:]}")
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
