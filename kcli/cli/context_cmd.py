"""`kcli context list|show|use|set|delete`: manage the contexts file (see kcli/contexts.py)."""

from __future__ import annotations

import sys
from typing import List, Optional

import typer

from kcli import contexts
from kcli.cli.common import options, parse_key_values
from kcli.cli.render import print_table, render
from kcli.errors import UsageError

context_app = typer.Typer(help="Named clusters: where to connect and with which client properties.",
                          no_args_is_help=True)


@context_app.command("list")
def list_(ctx: typer.Context) -> None:
    """List contexts; the current one is marked with '*'.

    Example: kcli context list
    """
    cfg = contexts.load()
    rows = [dict(c.to_dict(), current=(name == cfg.current_context)) for name, c in sorted(cfg.contexts.items())]

    def table() -> None:
        if not rows:
            sys.stdout.write(f"No contexts in {cfg.path}; add one with `kcli context set NAME --bootstrap-server HOST:PORT`.\n")
            return
        print_table([dict(r, mark="*" if r["current"] else "") for r in rows],
                    [("CURRENT", "mark"), ("NAME", "name"), ("BOOTSTRAP-SERVERS", "bootstrap_servers"),
                     ("PROPERTIES", "properties")])

    render(rows, options(ctx).output, table)


@context_app.command("show")
def show(ctx: typer.Context, name: Optional[str] = typer.Argument(None, help="Context (default: current).")) -> None:
    """Show one context (secrets masked).

    Example: kcli context show prod
    """
    cfg = contexts.load()
    if name is None:
        current = cfg.current()
        if current is None:
            raise UsageError(f"no current context in {cfg.path}; name one or run `kcli context use NAME`")
        name = current.name
    data = dict(cfg.get(name).to_dict(), current=(name == cfg.current_context))

    def table() -> None:
        sys.stdout.write(f"name: {data['name']}\ncurrent: {'true' if data['current'] else 'false'}\n"
                         f"bootstrap-servers: {data['bootstrap_servers']}\n")
        if data["properties"]:
            sys.stdout.write("properties:\n")
            for key, value in data["properties"].items():
                sys.stdout.write(f"  {key}: {value}\n")

    render(data, options(ctx).output, table)


@context_app.command("use")
def use(ctx: typer.Context, name: str = typer.Argument(..., help="Context to make current.")) -> None:
    """Make NAME the current context.

    Example: kcli context use prod
    """
    cfg = contexts.load()
    contexts.use_context(cfg, name)
    contexts.save(cfg)
    render({"current_context": name}, options(ctx).output,
           lambda: sys.stdout.write(f"Switched to context {name!r}.\n"))


@context_app.command("set")
def set_(
    ctx: typer.Context,
    name: str = typer.Argument(..., help="Context to create or update."),
    bootstrap_server: Optional[str] = typer.Option(None, "--bootstrap-server", "-b", help="HOST:PORT[,HOST:PORT...] (required when creating)."),
    property: List[str] = typer.Option([], "--property", help="Client property KEY=VALUE, e.g. security.protocol=SASL_SSL (repeatable)."),
    unset_property: List[str] = typer.Option([], "--unset-property", help="Remove a client property (repeatable)."),
) -> None:
    """Create or update a context. The first context created becomes current.

    Example: kcli context set prod --bootstrap-server kafka:9092 --property security.protocol=SASL_SSL
    """
    cfg = contexts.load()
    created = name not in cfg.contexts
    c = contexts.set_context(cfg, name, bootstrap_server, parse_key_values(property, "--property"), unset_property)
    contexts.save(cfg)
    render(dict(c.to_dict(), created=created, current=(cfg.current_context == name)), options(ctx).output,
           lambda: sys.stdout.write(f"Context {name!r} {'created' if created else 'updated'} in {cfg.path}.\n"))


@context_app.command("delete")
def delete(ctx: typer.Context, name: str = typer.Argument(..., help="Context to remove.")) -> None:
    """Remove a context (if it was current, no context is current afterwards).

    Example: kcli context delete staging
    """
    cfg = contexts.load()
    contexts.delete_context(cfg, name)
    contexts.save(cfg)
    render({"deleted": name, "current_context": cfg.current_context}, options(ctx).output,
           lambda: sys.stdout.write(f"Deleted context {name!r}.\n"))


def register(app: typer.Typer) -> None:
    app.add_typer(context_app, name="context")
