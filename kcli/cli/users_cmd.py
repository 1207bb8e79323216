"""`kcli broker users add|list|delete`: manage the SASL/PLAIN users file so nobody hand-writes hashes.

The broker re-reads the file when it changes, so these commands take effect without a restart.
"""

from __future__ import annotations

import sys
from pathlib import Path

import typer

from kcli.cli.common import options
from kcli.cli.render import print_table, render
from kcli.errors import UsageError

users_app = typer.Typer(help="SASL/PLAIN users of the broker (the sasl.plain.users.file).", no_args_is_help=True)

USERS_FILE_ENV = "KCLI_SASL_USERS_FILE"
_USERS_FILE_HELP = "The broker's sasl.plain.users.file (created on first add, mode 0600)."


def _read(path: Path, missing_ok: bool):  # noqa: ANN202 - UsersFile
    from kcli.config.definitions import ConfigError
    from kcli.security.sasl import UsersFile

    try:
        return UsersFile.read(path, missing_ok=missing_ok)
    except ConfigError as err:
        raise UsageError(str(err)) from None


def _password(from_stdin: bool) -> str:
    if from_stdin:
        line = sys.stdin.readline()
        password = line[:-1] if line.endswith("\n") else line
        password = password[:-1] if password.endswith("\r") else password
    elif sys.stdin.isatty():
        password = typer.prompt("Password", hide_input=True, confirmation_prompt=True)
    else:
        raise UsageError("no password given: pass --password-stdin and write it to stdin, or run interactively")
    if not password:
        raise UsageError("the password must not be empty")
    if "\0" in password:
        raise UsageError("the password must not contain NUL characters (SASL/PLAIN separates fields with them)")
    return password


@users_app.command("add")
def add(
    ctx: typer.Context,
    name: str = typer.Argument(..., help="User name (the SASL/PLAIN username)."),
    users_file: Path = typer.Option(..., "--users-file", envvar=USERS_FILE_ENV, help=_USERS_FILE_HELP),
    password_stdin: bool = typer.Option(False, "--password-stdin", help="Read the password from the first line of stdin."),
    update: bool = typer.Option(False, "--update", help="Change the password of an existing user."),
    scheme: str = typer.Option("scrypt", "--scheme", help="Hash scheme: scrypt or pbkdf2-sha256."),
) -> None:
    """Add a user (or change a password with --update); only a salted hash is stored.

    Example: echo "$PASSWORD" | kcli broker users add alice --users-file /etc/kcli/users --password-stdin
    """
    from kcli.config.definitions import ConfigError
    from kcli.security.sasl import SCHEMES, check_username, hash_password

    if scheme not in SCHEMES:
        raise UsageError(f"--scheme must be one of: {', '.join(SCHEMES)}, got {scheme!r}")
    try:
        check_username(name)
    except ConfigError as err:
        raise UsageError(str(err)) from None
    users = _read(users_file, missing_ok=True)
    if name in users.users and not update:
        raise UsageError(f"user {name!r} already exists in {users_file} (use --update to change the password)")
    if name not in users.users and update:
        raise UsageError(f"user {name!r} is not in {users_file}: drop --update to add it")
    users.set(name, hash_password(_password(password_stdin), scheme))
    try:
        users.write()
    except ConfigError as err:
        raise UsageError(str(err)) from None
    action = "updated" if update else "added"
    render({"user": name, "action": action, "users_file": str(users_file)}, options(ctx).output,
           lambda: sys.stdout.write(f"{action.capitalize()} user {name!r} {'in' if update else 'to'} {users_file}.\n"))


@users_app.command("list")
def list_(
    ctx: typer.Context,
    users_file: Path = typer.Option(..., "--users-file", envvar=USERS_FILE_ENV, help=_USERS_FILE_HELP),
) -> None:
    """List user names and their hash scheme (never the hashes).

    Example: kcli broker users list --users-file /etc/kcli/users
    """
    users = _read(users_file, missing_ok=False)
    rows = [{"user": n, "scheme": c.scheme} for n, c in sorted(users.users.items())]

    def table() -> None:
        if not rows:
            sys.stdout.write(f"No users in {users_file}.\n")
            return
        print_table(rows, [("USER", "user"), ("SCHEME", "scheme")])

    render(rows, options(ctx).output, table)


@users_app.command("delete")
def delete(
    ctx: typer.Context,
    name: str = typer.Argument(..., help="User to remove."),
    users_file: Path = typer.Option(..., "--users-file", envvar=USERS_FILE_ENV, help=_USERS_FILE_HELP),
) -> None:
    """Remove a user; its connections that are already authenticated stay open.

    Example: kcli broker users delete alice --users-file /etc/kcli/users
    """
    from kcli.config.definitions import ConfigError

    users = _read(users_file, missing_ok=False)
    if not users.delete(name):
        raise UsageError(f"user {name!r} is not in {users_file}")
    try:
        users.write()
    except ConfigError as err:
        raise UsageError(str(err)) from None
    render({"user": name, "action": "deleted", "users_file": str(users_file)}, options(ctx).output,
           lambda: sys.stdout.write(f"Deleted user {name!r} from {users_file}.\n"))


def register(app: typer.Typer) -> None:
    """Attach under ``kcli broker`` (called by kcli.cli.broker_cmd.register)."""
    app.add_typer(users_app, name="users")
