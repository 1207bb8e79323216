from kcli.cli.early_interrupt import exit_on_early_interrupt

exit_on_early_interrupt()  # Ctrl-C while the CLI is still importing: one line and 130, no traceback

from kcli.cli.app import main  # noqa: E402

main()
