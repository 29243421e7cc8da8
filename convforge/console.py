"""Terminal tables, shared by the CLI and the harness (rich; a fixed width when output is not a terminal)."""

from __future__ import annotations

from typing import Sequence


def console():
    from rich.console import Console
    terminal = Console(highlight=False)
    return terminal if terminal.is_terminal else Console(highlight=False, width=160)


def print_table(title: str, columns: Sequence[str], rows: Sequence[Sequence[object]], justify_right=()) -> None:
    from rich.table import Table
    table = Table(title=title, title_justify="left")
    for col in columns:
        table.add_column(col, justify="right" if col in justify_right else "left")
    for row in rows:
        table.add_row(*(str(v) for v in row))
    console().print(table)
