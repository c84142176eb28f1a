"""What `make run` shows (`python -m onceflow.demo`): exactly-once results through crashes.

| module | concern |
|---|---|
| __main__.py | runs the two demos in turn; the Makefile's entry point |
| exactly_once.py | transactional copiers SIGKILLed again and again, checked live with read_committed |
| pipeline.py | the pizza pipeline on Spark, its driver SIGKILLed mid-batch and restarted |
| processes.py | killing a whole process tree (a Spark driver and its workers), as a machine failure does |

The demos are applications on top of everything else: they run an embedded broker and
drive it with real clients, the copier and the pipeline of `onceflow.examples`.
"""
