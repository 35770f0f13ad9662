"""Tables (`jobs list`, `checkpoints list`, `gpus`, `cluster status`, `plan`) in a pipe: whole values, one row a
line, no box lines; on a terminal rich's boxed table."""
import io

from rich.console import Console
from rich.table import Table

from raytrain.cli.common import print_table

LONG_ID = "raytrain-gpt-zero-with-a-long-name-20261205-134849-28ec29"


def a_table():
    table = Table("id", "name", "state", "workers", "started", "duration")
    table.add_row(LONG_ID, "gpt-zero-with-a-long-name", "succeeded", "2", "2026-12-05 13:48:49", "0:00:09")
    table.add_row("raytrain-cnn-20261205-134812-7bab39", "cnn", "failed", "4", "2026-12-05 13:48:12", "1:02:03")
    return table


def test_in_a_pipe_every_value_is_whole_and_a_row_is_a_line():
    out = io.StringIO()
    print_table(a_table(), Console(file=out, width=80))  # not a terminal, 80 columns as in a pipe
    lines = out.getvalue().splitlines()
    assert len(lines) == 3, lines
    assert lines[0].split() == ["id", "name", "state", "workers", "started", "duration"]
    assert lines[1].split() == [LONG_ID, "gpt-zero-with-a-long-name", "succeeded", "2", "2026-12-05", "13:48:49", "0:00:09"]
    assert lines[2].split()[0] == "raytrain-cnn-20261205-134812-7bab39"
    assert lines[1].index("succeeded") == lines[2].index("failed")  # columns stay aligned
    text = "\n".join(lines)
    assert not any(c in text for c in "│┃━─…\x1b") and all(line == line.rstrip() for line in lines)


def test_on_a_terminal_the_table_is_boxed():
    out = io.StringIO()
    print_table(a_table(), Console(file=out, force_terminal=True, width=200))
    assert "┃" in out.getvalue() and LONG_ID in out.getvalue()


def test_a_table_drawn_without_padding_keeps_its_columns_apart_and_their_justification():
    from rich import box

    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, padding=(0, 0), show_edge=False)  # as `raytrain plan` draws
    table.add_column("ZeRO", justify="right")
    table.add_column("fits")
    table.add_row("0", "no")
    table.add_row("12", "CHOSEN")
    out = io.StringIO()
    print_table(table, Console(file=out))
    assert out.getvalue().splitlines() == ["ZeRO  fits", "   0  no", "  12  CHOSEN"]


def test_text_in_a_pipe_is_never_wrapped(monkeypatch):
    from raytrain.cli.common import output_console

    console = output_console()  # stdout is pytest's capture here: not a terminal
    assert not console.is_terminal and console.soft_wrap


def test_in_a_pipe_each_value_keeps_its_field_on_every_line():
    """An empty cell, a cell of several lines and a heading with spaces (as `cluster status` has them) would
    shift `awk`'s fields or split a row over lines: '-', the lines joined with ',', '_' for the spaces."""
    table = Table("node", "head", "memory (GiB avail/total)", "Train workers")
    table.add_row("vm", "yes", "22.9/23.5", "raytrain-gpt-1 x2\nraytrain-cnn-2 x1")
    table.add_row("vm2", "", "3.1/4.0", "-")
    out = io.StringIO()
    print_table(table, Console(file=out, width=80))
    assert [line.split() for line in out.getvalue().splitlines()] == [
        ["node", "head", "memory_(GiB_avail/total)", "Train_workers"],
        ["vm", "yes", "22.9/23.5", "raytrain-gpt-1", "x2,raytrain-cnn-2", "x1"],
        ["vm2", "-", "3.1/4.0", "-"],
    ]
    terminal = io.StringIO()
    table = Table("memory (GiB avail/total)")
    table.add_row("")
    print_table(table, Console(file=terminal, force_terminal=True, width=200))
    assert "memory (GiB avail/total)" in terminal.getvalue()  # on a terminal, as drawn
