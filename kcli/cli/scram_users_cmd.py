"""`kcli users list|set|delete`: SASL/SCRAM credentials of a running cluster, over the Kafka protocol.

Parsing and rendering only; the work is in :mod:`kcli.ops.users`. The PLAIN users file stays
with `kcli broker users` (it is a file on the broker's host, not cluster metadata).
"""

from __future__ import annotations

import sys
from typing import List, Optional

import typer

from kcli.cli.common import options
from kcli.cli.render import print_table, render
from kcli.errors import UsageError
from kcli.ops.connection import connect

users_app = typer.Typer(help="SASL/SCRAM users of the cluster (SCRAM-SHA-256, SCRAM-SHA-512), as kafka-configs.sh "
                             "--entity-type users manages them.", no_args_is_help=True)


def _password(from_stdin: bool) -> str:
    if from_stdin:
        line = sys.stdin.readline()
        password = line[:-1] if line.endswith("\n") else line
        password = password[:-1] if password.endswith("\r") else password
    elif sys.stdin.isatty():
        password = typer.prompt("Password", hide_input=True, confirmation_prompt=True)
    else:
        raise UsageError("stdin is not a terminal: pass the password with --password-stdin")
    if not password:
        raise UsageError("the password must not be empty")
    return password


@users_app.command("list")
def list_(
    ctx: typer.Context,
    users: Optional[List[str]] = typer.Argument(None, help="Users to show (default: every SCRAM user)."),
) -> None:
    """List SCRAM users with their mechanisms and iteration counts (never a secret).

    Example: kcli users list -o json
    """
    from kcli.ops.users import list_users

    opts = options(ctx)
    with connect(opts) as conn:
        result = list_users(conn, users)

    def table() -> None:
        if not result:
            sys.stdout.write("No SCRAM users.\n")
            return
        rows = [{"user": u.user, "mechanism": c.mechanism, "iterations": c.iterations}
                for u in result for c in u.credentials]
        print_table(rows, [("USER", "user"), ("MECHANISM", "mechanism"), ("ITERATIONS", "iterations")])

    render(result, opts.output, table)


@users_app.command("set")
def set_(
    ctx: typer.Context,
    user: str = typer.Argument(..., help="User name (the SASL username clients log in with)."),
    mechanism: str = typer.Option("SCRAM-SHA-512", "--mechanism", help="SCRAM-SHA-256 or SCRAM-SHA-512."),
    iterations: int = typer.Option(4096, "--iterations", help="PBKDF2 iterations; the broker accepts 4096..16384."),
    password_stdin: bool = typer.Option(False, "--password-stdin", help="Read the password from the first line of stdin."),
) -> None:
    """Create a user's SCRAM credential, or replace it (a new salt and password).

    The salted password is computed here, so the password never travels; the broker stores
    only keys derived from it. Credentials for the other mechanism are left alone.

    Example: echo "$PASSWORD" | kcli users set alice --mechanism SCRAM-SHA-512 --iterations 8192 --password-stdin
    """
    from kcli.ops.users import parse_mechanism, set_user

    mechanism = parse_mechanism(mechanism)  # before asking for a password
    password = _password(password_stdin)
    opts = options(ctx)
    with connect(opts) as conn:
        result = set_user(conn, user, mechanism, password, iterations)
    render(result, opts.output,
           lambda: sys.stdout.write(f"Set the {mechanism} credential of user {user!r} ({iterations} iterations).\n"))


@users_app.command("delete")
def delete(
    ctx: typer.Context,
    user: str = typer.Argument(..., help="User whose credential to remove."),
    mechanism: Optional[str] = typer.Option(None, "--mechanism", help="Only this mechanism (default: every one the user has)."),
) -> None:
    """Remove a user's SCRAM credential(s); its connections already authenticated stay open.

    Example: kcli users delete alice --mechanism SCRAM-SHA-256
    """
    from kcli.ops.users import delete_user, parse_mechanism

    if mechanism is not None:
        mechanism = parse_mechanism(mechanism)
    opts = options(ctx)
    with connect(opts) as conn:
        result = delete_user(conn, user, mechanism)
    render(result, opts.output,
           lambda: sys.stdout.write(f"Deleted the {', '.join(result.mechanisms)} credential(s) of user {user!r}.\n"))


def register(app: typer.Typer) -> None:
    app.add_typer(users_app, name="users")
