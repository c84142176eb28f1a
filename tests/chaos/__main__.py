"""`python -m tests.chaos`: one chaos run (see run.py)."""

from tests.chaos.run import main

main()
