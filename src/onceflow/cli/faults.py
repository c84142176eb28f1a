"""`onceflow faults add|list|remove|clear`: fault injection on a running broker.

Theory of operation: the broker must run with `--admin-port`; these commands talk to
its admin endpoint over HTTP (broker/admin.py) - `POST /faults` with a JSON rule,
`GET /faults`, `DELETE /faults[/<id>]` - and print what the broker answered as a rich
table. Everything a person can get wrong (no endpoint listening, an unknown fault kind
or API, a bad error name) comes back as one `error:` line, exit code 1.

    onceflow broker --admin-port 9644 &
    onceflow faults add drop_responses --api produce --count 3
    onceflow faults add delay_responses --api fetch --ms 500 --forever
    onceflow faults add fail_requests --api produce --error NOT_LEADER_OR_FOLLOWER
    onceflow faults add node_down --node 1        # with --nodes 3
    onceflow faults list
    onceflow faults clear
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from typing import Annotated, Any

import typer
from rich.table import Table

from onceflow.cli.clients import CliError, exits_cleanly, stdout

ADMIN_ENV = "ONCEFLOW_ADMIN"
# The admin endpoint's bearer token (`onceflow broker --admin-token`), from the environment
# only: a token on a command line shows in `ps`.
ADMIN_TOKEN_ENV = "ONCEFLOW_ADMIN_TOKEN"
ADMIN_DEFAULT = "http://127.0.0.1:9644"
# The admin endpoint answers from the broker's event loop: a second is plenty; this
# bounds a broker that hangs.
ADMIN_TIMEOUT_S = 10.0
# Answers are small JSON documents or the metrics text; more is not our broker.
ADMIN_ANSWER_BYTES_MAX = 16 * 1024 * 1024

AdminOption = Annotated[
    str,
    typer.Option("--admin", envvar=ADMIN_ENV,
                 help="URL of the broker's admin endpoint (broker started with --admin-port)."),
]

faults_app = typer.Typer(
    name="faults",
    help="Inject faults into a running broker: lost answers, delays, errors, closed "
         "connections, nodes down. See docs/faults.md.",
    no_args_is_help=True,
)


def admin_request(admin: str, method: str, path: str, body: dict | None = None) -> bytes:
    """The body of the admin endpoint's answer; CliError for anything but success."""
    data = None if body is None else json.dumps(body).encode()
    headers = {"Content-Type": "application/json"}
    if token := os.environ.get(ADMIN_TOKEN_ENV):
        headers["Authorization"] = f"Bearer {token}"
    request = urllib.request.Request(admin.rstrip("/") + path, data=data, method=method,
                                     headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=ADMIN_TIMEOUT_S) as answer:
            return answer.read(ADMIN_ANSWER_BYTES_MAX)
    except urllib.error.HTTPError as exc:
        raise CliError(_error_text(exc)) from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise CliError(f"no admin endpoint at {admin} ({reason}); start the broker with "
                       "--admin-port and pass --admin") from None


def _error_text(exc: urllib.error.HTTPError) -> str:
    try:
        return str(json.loads(exc.read(ADMIN_ANSWER_BYTES_MAX))["error"])
    except (ValueError, KeyError, TypeError):
        return f"admin endpoint answered HTTP {exc.code}"


def admin_json(admin: str, method: str, path: str, body: dict | None = None) -> Any:
    return json.loads(admin_request(admin, method, path, body))


def rules_table(rules: list[dict]) -> Table:
    """One row per rule; spent rules dimmed. Kinds are shortened ("drop_responses" ->
    "drop") so the table fits 80 columns."""
    table = Table(title="Fault rules")
    for column in ("id", "kind", "api", "node", "left", "fired", "details"):
        table.add_column(column, justify="right" if column in ("id", "fired") else "left")
    for rule in rules:
        table.add_row(str(rule["id"]), rule["kind"].split("_")[0], rule["api"] or "*",
                      "*" if rule["node_id"] is None else str(rule["node_id"]),
                      _left(rule), str(rule["fired"]), _details(rule),
                      style=None if rule["active"] else "dim")
    return table


def _left(rule: dict) -> str:
    if not rule["active"]:
        return "spent"
    if rule["seconds_left"] is not None:
        return f"{rule['seconds_left']:.1f} s"
    return "forever" if rule["remaining"] is None else str(rule["remaining"])


def _details(rule: dict) -> str:
    kind = rule["kind"]
    if kind == "delay_responses":
        return f"{rule['ms']} ms"
    if kind == "fail_requests":
        return rule["error"]
    if kind == "close_connections":
        return "after performing" if rule["perform"] else "instead of performing"
    return ""


def nodes_table(nodes: list[dict]) -> Table:
    table = Table(title="Nodes")
    for column in ("node", "address", "state"):
        table.add_column(column)
    for node in nodes:
        table.add_row(str(node["node_id"]), f"{node['host']}:{node['port']}",
                      "up" if node["up"] else "[red]down[/red]")
    return table


@faults_app.command("add")
@exits_cleanly
def add(
    kind: Annotated[str, typer.Argument(
        help="drop_responses, delay_responses, fail_requests, close_connections, "
             "refuse_connections, node_down or node_up.")],
    api: Annotated[str, typer.Option("--api", help="API the rule applies to ('*': all).")]
    = "produce",
    count: Annotated[int, typer.Option("--count", min=1, help="How many times it fires.")] = 1,
    forever: Annotated[bool, typer.Option("--forever", help="Fire until cleared.")] = False,
    ms: Annotated[int, typer.Option("--ms", min=0, help="delay_responses: delay.")] = 1_000,
    error: Annotated[str, typer.Option("--error", help="fail_requests: Kafka error name or code.")]
    = "NOT_LEADER_OR_FOLLOWER",
    seconds: Annotated[float, typer.Option("--seconds", help="refuse_connections: for how long.")]
    = None,
    node: Annotated[int, typer.Option("--node", help="Only this node (node_down/up: which).")]
    = None,
    perform: Annotated[bool, typer.Option(
        "--perform", help="close_connections: perform the request, then close.")] = False,
    admin: AdminOption = ADMIN_DEFAULT,
) -> None:
    """Add one fault rule (or take a node down or up)."""
    spec: dict[str, Any] = {"kind": kind, "api": api, "count": None if forever else count,
                            "node_id": node}
    if kind == "delay_responses":
        spec["ms"] = ms
    elif kind == "fail_requests":
        spec["error"] = error
    elif kind == "close_connections":
        spec["perform"] = perform
    elif kind == "refuse_connections" and seconds is not None:
        spec["seconds"] = seconds
    done = admin_json(admin, "POST", "/faults", spec)
    if "nodes" in done:
        stdout().print(nodes_table(done["nodes"]))
    else:
        stdout().print(rules_table([done]))


@faults_app.command("list")
@exits_cleanly
def list_rules(admin: AdminOption = ADMIN_DEFAULT) -> None:
    """Show active and recently spent rules, and the nodes."""
    state = admin_json(admin, "GET", "/faults")
    stdout().print(rules_table(state["rules"]))
    stdout().print(nodes_table(state["nodes"]))


@faults_app.command("remove")
@exits_cleanly
def remove(rule_id: Annotated[int, typer.Argument(help="Rule id (see `faults list`).")],
           admin: AdminOption = ADMIN_DEFAULT) -> None:
    """Remove one active rule."""
    admin_json(admin, "DELETE", f"/faults/{rule_id}")
    stdout().print(f"removed rule {rule_id}")


@faults_app.command("clear")
@exits_cleanly
def clear(admin: AdminOption = ADMIN_DEFAULT) -> None:
    """Remove every rule and bring every node back up."""
    done = admin_json(admin, "DELETE", "/faults")
    stdout().print(f"cleared {done['cleared']} rule(s); every node is up")
