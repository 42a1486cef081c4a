"""The daemon's garbage-collector setting: young collections in larger batches.

CPython collects its youngest generation every 700 container allocations (``gc`` default).
A turn of the daemon at 1,000 agents allocates tens of thousands of short-lived objects
(messages, ledger events, node views, actions); nearly all of them are freed by reference
counting the moment the
turn drops them, so the collector finds almost nothing, yet at 700 it runs dozens of times a
turn and promotes what is alive at that instant to older generations, which then make the
full collections longer. Measured with ``bench/bench_scale.py --agents 1000 --tasks 10000
--no-local`` (sixth session, three runs each, load 8-15): the decision of a turn that starts
500 tasks took 2.75-3.15 ms CPU at the default and 1.87-2.14 ms with this setting; about a
third of a decision was the collector.

Only the first threshold changes; cycles are still collected, at most every ``YOUNG`` net
allocations (a few MB at worst), and the previous setting comes back when the run ends."""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator

YOUNG = 50_000


@contextlib.contextmanager
def young_collections_batched(threshold: int = YOUNG) -> Iterator[None]:
    """Raise the youngest generation's threshold to at least ``threshold`` for the block."""
    before = gc.get_threshold()
    gc.set_threshold(max(before[0], threshold), *before[1:])
    try:
        yield
    finally:
        gc.set_threshold(*before)
