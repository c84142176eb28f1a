"""`onceflow broker stats`: a running broker's request, error and duplicate counters.

Theory of operation: the broker, started with `--admin-port`, serves its Prometheus
metrics at `/metrics` (broker/metrics.py); this command fetches that text, parses it
with prometheus-client's own parser and prints rich tables: requests by API, error
codes returned by API (Kafka's ErrorsPerSec, NONE left out), duplicates recognised by
topic, faults injected. Prometheus itself can scrape the same URL.

    onceflow broker --admin-port 9644 &
    onceflow broker stats --admin http://127.0.0.1:9644
"""

from __future__ import annotations

from collections import defaultdict

from prometheus_client.parser import text_string_to_metric_families
from rich.table import Table

from onceflow.cli.clients import CliError, exits_cleanly, stdout
from onceflow.cli.faults import ADMIN_DEFAULT, AdminOption, admin_request

Samples = dict[str, list[tuple[dict[str, str], float]]]


def parse_metrics(text: str) -> Samples:
    """Sample name -> [(labels, value)], counters only by their `_total` samples."""
    samples: Samples = defaultdict(list)
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                samples[sample.name].append((sample.labels, sample.value))
    except ValueError as exc:
        raise CliError(f"the admin endpoint sent unreadable metrics: {exc}") from None
    return samples


def _table(title: str, columns: tuple[str, ...],
           rows: list[tuple[dict[str, str], float]]) -> Table:
    table = Table(title=title)
    for column in columns:
        table.add_column(column)
    table.add_column("count", justify="right")
    for labels, value in sorted(rows, key=lambda row: (-row[1], sorted(row[0].items()))):
        table.add_row(*(labels.get(c, "") for c in columns), f"{value:.0f}")
    return table


def stats_tables(samples: Samples) -> list[Table]:
    errors = [(labels, value) for labels, value in samples["onceflow_errors_total"]
              if labels.get("error") != "NONE"]
    return [
        _table("Requests", ("request",), samples["onceflow_requests_total"]),
        _table("Errors (ErrorsPerSec, NONE left out)", ("request", "error"), errors),
        _table("Duplicates recognised", ("topic",),
               samples["onceflow_producer_duplicates_total"]),
        _table("Faults injected", ("kind", "request"), samples["onceflow_faults_injected_total"]),
    ]


@exits_cleanly
def stats(admin: AdminOption = ADMIN_DEFAULT) -> None:
    """Show a running broker's counters (needs the broker's --admin-port)."""
    text = admin_request(admin, "GET", "/metrics").decode()
    console = stdout()
    for table in stats_tables(parse_metrics(text)):
        console.print(table)
