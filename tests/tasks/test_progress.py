"""Progress bars: plain lines, not carriage-return frames, when stderr is not a terminal."""

from __future__ import annotations

import io

from tasks import progress


def test_a_log_gets_whole_lines_at_most_every_interval(monkeypatch):
    stream = io.StringIO()  # not a terminal
    monkeypatch.setattr(progress.sys, "stderr", stream)
    monkeypatch.setattr(progress, "LOG_INTERVAL_S", 3600.0)
    with progress.progress_bar(total=500, desc="training") as bar:
        for _ in range(500):
            bar.set_postfix({"loss": "1.0"}, refresh=False)
            bar.update(1)
    text = stream.getvalue()
    lines = text.splitlines()
    assert "\r" not in text
    assert 1 <= len(lines) <= 3  # the first frame and the final one, not 500
    assert lines[-1].startswith("training: 100%") and "500/500" in lines[-1]


def test_a_terminal_keeps_the_ordinary_bar(monkeypatch):
    class Terminal(io.StringIO):
        def isatty(self):
            return True

    stream = Terminal()
    monkeypatch.setattr(progress.sys, "stderr", stream)
    with progress.progress_bar(total=3, desc="x", mininterval=0) as bar:
        bar.update(3)
    assert "\r" in stream.getvalue()
