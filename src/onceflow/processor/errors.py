"""The processor's one exception type.

Handler exceptions are data (they go through the retry policy) and Kafka errors that
the client recovers from are logged; `ProcessorError` is raised for what stops a
processor: a fatal client error (e.g. a fenced transactional producer), outputs that
could not be delivered, or a crash of our own code in a worker.
"""


class ProcessorError(RuntimeError):
    pass
