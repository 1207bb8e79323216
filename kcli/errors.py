"""The error types of each layer, and how the CLI boundary turns them into one line.

Every layer raises one type; the CLI catches :class:`KcliError` and prints ``str(err)`` with
``err.exit_code``. Nothing else should reach the user as a traceback unless ``-v`` is given.
"""

from __future__ import annotations


class KcliError(Exception):
    """Base of every error kcli reports to an operator."""

    exit_code: int = 1


class UsageError(KcliError):
    """Bad input from the command line or a file: exit code 2."""

    exit_code = 2


class OperationError(KcliError):
    """A valid request the cluster or a store refused or could not do: exit code 1."""

    exit_code = 1


class KafkaApiError(OperationError):
    """A Kafka protocol error code with its message, printed as ``NAME: message``."""

    def __init__(self, name: str, message: str = "", code: int | None = None) -> None:
        self.name = name
        self.message = message
        self.code = code
        super().__init__(f"{name}: {message}" if message else name)
