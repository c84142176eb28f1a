"""`Broker`: the in-process broker with what runs beside it - the web console.

    from onceflow import Broker

    with Broker(console=True) as broker:      # prints "onceflow console at http://..."
        ...

The composition root above the broker and the console: `onceflow.broker.embedded.Broker`
serves the admin port with whatever frontend it is handed and never imports the console
(docs/architecture.md); this class hands it the console. Without `console=True` it is
the embedded broker unchanged.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from onceflow.broker.embedded import Broker as EmbeddedBroker


class Broker(EmbeddedBroker):
    def __init__(self, data_dir: str | Path | None = None, *, console: bool = False,
                 console_token: str | None = None, **settings: Any) -> None:
        """`console=True`: serve the web console on the admin port (`admin_port`, any free
        port by default) and print its URL at start; `console_token` is its login token,
        needed when `host` is beyond localhost."""
        self.console = console
        if console:
            # Imported only when asked for: Starlette, uvicorn and Jinja2 stay unloaded
            # for the broker alone (tests start hundreds).
            from onceflow.console.mount import broker_frontend

            settings.setdefault("admin_port", 0)
            settings["admin_frontend"] = broker_frontend(console_token)
        super().__init__(data_dir, **settings)

    def start(self) -> Broker:
        super().start()
        if self.console:
            print(f"onceflow console at {self.admin_url}", flush=True)
        return self

    @property
    def console_url(self) -> str | None:
        """The console's URL when started with `console=True`, else None."""
        return self.admin_url if self.console else None
