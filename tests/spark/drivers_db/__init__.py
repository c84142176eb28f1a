"""Spark driver scripts of the onceflow-db sink tests (run as child processes)."""
