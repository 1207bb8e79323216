"""`kcli completion bash|zsh|fish` and topic-name completion from the current context."""

from __future__ import annotations

from enum import Enum

import typer


class Shell(str, Enum):
    bash = "bash"
    zsh = "zsh"
    fish = "fish"


def completion_script(shell: str) -> str:
    """The script Typer generates for ``shell`` (as ``_KCLI_COMPLETE=source_<shell> kcli``), trimmed
    to start with its first line and end with one newline."""
    from typer._completion_shared import get_completion_script

    # Typer's scripts start with a blank line: zsh's autoload wants `#compdef kcli` first.
    return get_completion_script(prog_name="kcli", complete_var="_KCLI_COMPLETE", shell=shell).strip() + "\n"


def complete_topic(incomplete: str) -> list[str]:
    """Topic names from the cluster the current context (or a running default broker) names.

    Completion must be fast and silent: it never boots the embedded broker, and any failure
    just yields no candidates."""
    import os

    try:
        from kcli.broker.embedded import default_data_dir, running_broker
        from kcli.contexts import load as load_contexts

        bootstrap = os.environ.get("KCLI_BOOTSTRAP_SERVER")
        props: dict[str, str] = {}
        if not bootstrap:
            try:
                cfg = load_contexts()
                ctx = cfg.current() if hasattr(cfg, "current") else None
                if ctx is not None:
                    bootstrap = ctx.bootstrap_servers
                    props = dict(getattr(ctx, "properties", {}) or {})
            except Exception:
                bootstrap = None
        bootstrap = bootstrap or os.environ.get("KAFKA_BOOTSTRAP_SERVERS")
        if not bootstrap:
            running = running_broker(default_data_dir())  # never another cluster's broker
            bootstrap = running.bootstrap if running is not None else None
        if not bootstrap:
            return []
        from confluent_kafka.admin import AdminClient

        md = AdminClient({"bootstrap.servers": bootstrap, "socket.timeout.ms": 1000, **props}).list_topics(timeout=1.5)
        return sorted(t for t in md.topics if t.startswith(incomplete))
    except Exception:
        return []


def register(app: typer.Typer) -> None:
    @app.command("completion")
    def completion(shell: Shell = typer.Argument(..., help="bash, zsh or fish.")) -> None:
        """Print the shell completion script.

        Example: kcli completion bash > /etc/bash_completion.d/kcli
        """
        typer.echo(completion_script(shell.value), nl=False)
