"""One line of progress on a terminal, redrawn in place (``broker plan --sample``, ``run``,
``simulate``)."""

from __future__ import annotations


class RedrawnLine:
    """Each ``draw`` overwrites the last (padded to its width); ``close`` ends the line."""

    def __init__(self, stream) -> None:
        self.stream = stream
        self.width = 0

    def draw(self, text: str) -> None:
        self.stream.write("\r" + text.ljust(self.width))
        self.stream.flush()
        self.width = len(text)

    def close(self) -> None:
        if self.width:
            self.stream.write("\n")
            self.stream.flush()
            self.width = 0
