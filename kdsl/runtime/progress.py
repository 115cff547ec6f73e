"""Progress of long commands (search, discover, tune, bench): a tqdm bar on a terminal, plain
periodic lines anywhere else.

A ``\\r``-rewritten line looks fine on a terminal and turns into one huge line (or a wall of text)
in a log file or a CI job, so the stream decides: when it is a terminal and tqdm is installed, a
live bar; otherwise one complete line when the task starts, one every ``every`` seconds while it
runs, and one when it ends. ``KDSL_PROGRESS=plain`` forces the lines, ``KDSL_PROGRESS=off`` turns
both off (notes still print).

>>> import io
>>> stream = io.StringIO()
>>> with Progress("search", unit="nodes", stream=stream, every=3600) as bar:
...     bar.update(120, new=4, valid=3)
...     bar.note("a line of its own")
>>> print(stream.getvalue(), end="")
search: started
a line of its own
search: 120 nodes, new 4, valid 3 (done in ... s)
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, TextIO

from kdsl.runtime.units import seconds

try:  # optional: without it, a terminal gets the plain lines too
    import tqdm as _tqdm
except ImportError:  # pragma: no cover - tqdm is a dependency, but kdsl works without it
    _tqdm = None

__all__ = ["Progress", "progress"]


def _is_terminal(stream: TextIO) -> bool:
    isatty = getattr(stream, "isatty", None)
    try:
        return bool(isatty and isatty())
    except (ValueError, OSError):  # a closed stream
        return False


class Progress:
    """One task's progress: ``update`` advances a count (and sets named fields shown beside it),
    ``note`` prints a line of its own without breaking the bar, ``close`` ends it.

    ``total``: the count at which the task is done, if known (the bar then shows a percentage);
    ``unit``: what is counted (``nodes``, ``trials``, ``cases``); ``stream``: where it goes
    (``None``: nowhere); ``every``: seconds between plain lines; ``clock``: the count is the seconds
    elapsed (``unit="s"``, ``total`` a time limit), kept current by a thread, so that a task that waits
    a long time on one step (measuring a baseline) still shows it is alive."""

    def __init__(
        self,
        description: str,
        *,
        total: float | None = None,
        unit: str = "steps",
        stream: TextIO | None = sys.stderr,
        every: float = 10.0,
        clock: bool = False,
    ) -> None:
        self.description = description
        self.total = total
        self.unit = unit
        self.stream = stream
        self.every = every
        self.count: float = 0
        self.fields: dict[str, Any] = {}
        self.started = time.monotonic()
        self._last_line = self.started
        self._closed = False
        self._lock = threading.Lock()  # a heartbeat thread may update while the task's own thread notes
        mode = os.environ.get("KDSL_PROGRESS", "auto").strip().lower()
        self._quiet = stream is None or mode == "off"
        use_bar = not self._quiet and mode != "plain" and _tqdm is not None and _is_terminal(stream)
        # a clock's bar shows whole seconds (``14/60 s``), never the raw float of a monotonic clock
        shape = (
            {"bar_format": "{desc}: {percentage:3.0f}%|{bar}| {n:.0f}/{total:.0f} s{postfix}"}
            if clock and total
            else {}
        )
        self._bar = (
            _tqdm.tqdm(
                total=total, desc=description, unit=f" {unit}", file=stream, dynamic_ncols=True, leave=True, **shape
            )
            if use_bar
            else None
        )
        if self._bar is None and not self._quiet:
            self._write(f"{description}: started")
        self._stop = threading.Event()
        if clock and not self._quiet:
            threading.Thread(target=self._tick, name="kdsl-progress-clock", daemon=True).start()

    def _tick(self) -> None:
        while not self._stop.wait(1.0):
            elapsed = time.monotonic() - self.started
            self.set(min(elapsed, self.total) if self.total is not None else elapsed)

    def _write(self, text: str) -> None:
        assert self.stream is not None
        self.stream.write(text + "\n")
        self.stream.flush()

    def _status(self) -> str:
        if self.unit == "s":  # a clock: rounded seconds, ``14 s / 60 s``
            count = seconds(self.count) + ("" if self.total is None else f" / {seconds(self.total)}")
        else:  # counts are whole: ``3/64 trials``
            count = f"{self.count:.0f}" + ("" if self.total is None else f"/{self.total:.0f}")
            count += f" {self.unit}"
        parts = [count] + [f"{key} {value}" for key, value in self.fields.items()]
        return ", ".join(parts)

    def update(self, advance: float = 1, **fields: Any) -> None:
        """Add ``advance`` to the count and set ``fields`` (shown as ``name value``)."""
        with self._lock:
            self._update(advance, fields)

    def _update(self, advance: float, fields: dict[str, Any]) -> None:
        if self._closed:
            return
        self.count += advance
        self.fields.update(fields)
        if self._quiet:
            return
        if self._bar is not None:
            if fields:
                self._bar.set_postfix({k: v for k, v in self.fields.items()}, refresh=False)
            self._bar.update(advance)
            if not advance:
                self._bar.refresh()  # new fields only: tqdm redraws on a step, not on a postfix
            return
        now = time.monotonic()
        if now - self._last_line >= self.every:
            self._last_line = now
            self._write(f"{self.description}: {self._status()} ({seconds(now - self.started)})")

    def set(self, count: float, **fields: Any) -> None:
        """Set the count to ``count`` (for callers that know the total so far, not the step)."""
        with self._lock:
            self._update(count - self.count, fields)

    def note(self, text: str) -> None:
        """A line of its own (an event worth keeping in a log), printed above a live bar."""
        if self.stream is None:
            return
        with self._lock:
            if self._bar is not None:
                self._bar.write(text, file=self.stream)
            else:
                self._write(text)

    def close(self, stopped: bool = False) -> None:
        """End the task: the bar's last state stays on screen, or a last plain line says where it got
        (``stopped``: it ended early, by an error or Ctrl-C, and says so instead of "done")."""
        self._stop.set()
        with self._lock:
            if self._closed:
                return
            self._closed = True
            if self._bar is not None:
                self._bar.close()
            elif not self._quiet:
                ended = "stopped after" if stopped else "done in"
                self._write(
                    f"{self.description}: {self._status()} ({ended} {seconds(time.monotonic() - self.started)})"
                )

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, kind: type[BaseException] | None, *rest: object) -> None:
        self.close(stopped=kind is not None)


@contextmanager
def progress(description: str, **options: Any) -> Iterator[Progress]:
    """``with progress("tune", total=64, unit="trials") as bar: ...``: a :class:`Progress` that is
    closed at the end of the block, also on an error."""
    with Progress(description, **options) as bar:
        yield bar
