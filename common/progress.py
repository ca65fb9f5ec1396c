"""Progress bars that stay readable in logs.

On a terminal this is tqdm as usual. When stderr is not a terminal (CI, `nohup … > log`), tqdm
would write hundreds of carriage-return frames into one line; instead each update becomes a plain
line, at most one every `LOG_INTERVAL_S` seconds (and at the end).
"""

from __future__ import annotations

import io
import sys

from tqdm.auto import tqdm

LOG_INTERVAL_S = 30.0


class _LineWriter(io.TextIOBase):
    """A stream for tqdm that turns each redrawn frame into one plain line of `stream`."""

    def __init__(self, stream) -> None:
        self.stream = stream

    def write(self, text: str) -> int:
        line = text.replace("\r", "").strip()
        if line:
            self.stream.write(line + "\n")
            self.stream.flush()
        return len(text)

    def flush(self) -> None:
        self.stream.flush()


def progress_bar(*args, **kwargs) -> tqdm:
    """`tqdm(*args, **kwargs)`, or, when stderr is not a terminal, the same bar printed as plain
    lines every LOG_INTERVAL_S seconds (a `file` given by the caller is left alone). A bar over one
    item or none is not drawn (`disable`): "1/1" tells nothing, and a bar that only appears and ends at
    once is noise between the lines that do."""
    total = kwargs.get("total")
    if total is None and args and hasattr(args[0], "__len__"):
        total = len(args[0])
    if total is not None and total <= 1:
        kwargs["disable"] = True
    stream = kwargs.get("file") or sys.stderr
    if "file" not in kwargs and not (hasattr(stream, "isatty") and stream.isatty()):
        kwargs.update(
            file=_LineWriter(stream),
            mininterval=max(kwargs.get("mininterval", 0), LOG_INTERVAL_S),
            dynamic_ncols=False,
            ncols=100,
            ascii=True,
        )
    return tqdm(*args, **kwargs)


def close_progress_bars() -> None:
    """Close every bar still open (the loop of one was left by an error), so that what is printed next, the
    error, is the last line, not a bar redrawn after it when the bar is collected."""
    for bar in list(getattr(tqdm, "_instances", ())):
        bar.close()
