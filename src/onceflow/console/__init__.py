"""onceflow's web console: makes exactly-once visible (docs/console.md).

The console is a Kafka client beside the broker (it never imports `onceflow.broker`):
it reads any Kafka-compatible cluster over the protocol - confluent-kafka's AdminClient
and consumers, and `onceflow.client`'s raw connections for the transaction APIs - and
serves server-rendered pages whose live parts are refreshed over server-sent events.

Module map:

| module | concern |
|---|---|
| app.py | `create_app`: the Starlette app, its routes, lifespan (the overview's sampler) |
| server.py | serving it alone with uvicorn (`onceflow console`) |
| settings.py, guard.py | binding and login rules; sessions, login, CSRF and Host checks |
| backend.py | the shared cluster connection; `Extras` a broker may offer |
| model/ | what each page shows, read from the cluster (blocking, no HTTP) |
| routes/ | the HTTP routes per page family |
| web.py, params.py, decode.py | templates, errors, event streams; URL parameters; values |
| templates/, static/ | Jinja2 templates; CSS, our JS, vendored htmx + sse + uPlot |

Importing this package imports nothing heavy; `app` brings Starlette.
"""
