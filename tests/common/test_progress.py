"""Progress bars: plain lines, not carriage-return frames, when stderr is not a terminal."""

from __future__ import annotations

import io

from common import progress


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


def test_no_bar_for_one_item_or_none(monkeypatch):
    stream = io.StringIO()
    monkeypatch.setattr(progress.sys, "stderr", stream)
    for items in ([7], []):
        assert list(progress.progress_bar(items, desc="embedding")) == items  # the loop itself runs
    with progress.progress_bar(total=1, desc="copying") as bar:
        bar.update(1)
    assert stream.getvalue() == ""
    list(progress.progress_bar([1, 2], desc="two"))
    assert "two: 100%" in stream.getvalue()


def test_after_an_error_in_a_loop_the_error_is_the_last_line(monkeypatch):
    import gc

    stream = io.StringIO()
    monkeypatch.setattr(progress.sys, "stderr", stream)

    def embed():
        for n in progress.progress_bar(range(10), desc="embedding"):
            if n == 4:
                raise ValueError("passages.jsonl:5: field text: empty text")

    try:
        embed()
    except ValueError as e:
        progress.close_progress_bars()  # what the CLI does before it prints the error
        print(f"atlas index build: error: {e}", file=stream)
    gc.collect()  # the bar's frame and generator are gone: nothing more is drawn
    lines = stream.getvalue().splitlines()
    assert lines[-1] == "atlas index build: error: passages.jsonl:5: field text: empty text"
    assert lines[-2].startswith("embedding:  40%") and "4/10" in lines[-2]
