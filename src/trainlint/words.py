"""The trigger-word pre-filter: which of a run's words one file's bytes spell.

Each rule declares trigger words; a file that spells none of a rule's words is not
analysed for it, and a file that spells none of any rule's words (nor the project
summary's) is never modelled. The words of the whole selection are numbered once per run
(:class:`WordTable`), and each file's bytes are searched for each distinct word at most
once, only when a rule or the summary asks (:class:`FileWords`). One alternation regex
over all the words was measured 3x slower than bytes ``in``, which runs at memchr speed,
and searching a file's distinct whitespace-free tokens instead of its bytes (a split, a
set and a join first) 12% slower on torch and the training tree, in pairs: the split
costs more than the shorter searches save.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence


class WordTable:
    """The distinct words of some groups of words (a rule's triggers, the summary's
    words), numbered: ``groups[k]`` holds the numbers of group ``k``'s words."""

    def __init__(self, groups: Sequence[Iterable[bytes]]) -> None:
        numbers: dict[bytes, int] = {}
        self.groups: list[tuple[int, ...]] = [
            tuple(numbers.setdefault(w, len(numbers)) for w in group) for group in groups
        ]
        self.words: tuple[bytes, ...] = tuple(numbers)
        #: for each word, the other words of the table inside it, shortest first: bytes
        #: without ``grad`` spell no ``zero_grad`` (most files lack most words, and one
        #: search then answers several)
        self.parts: tuple[tuple[int, ...], ...] = tuple(
            tuple(
                sorted(
                    (j for j, v in enumerate(self.words) if v != w and v in w),
                    key=lambda j: len(self.words[j]),
                )
            )
            for w in self.words
        )
        #: how many bytes before a join a word across it may start in
        self.reach = max(map(len, self.words), default=1) - 1


class FileWords:
    """Which of a table's words one file's bytes spell: each word searched at most once,
    and only when asked."""

    def __init__(self, table: WordTable, data: bytes) -> None:
        self.data = data
        self.table = table
        self.present: list[bool | None] = [None] * len(table.words)

    def has(self, i: int) -> bool:
        found = self.present[i]
        if found is None:
            for j in self.table.parts[i]:
                if not self.has(j):
                    self.present[i] = False
                    return False
            found = self.present[i] = self.table.words[i] in self.data
            if found:
                for j in self.table.parts[i]:
                    self.present[j] = True
        return found

    def any(self, numbers: Iterable[int]) -> bool:
        """Whether the bytes spell any of these words."""
        return any(self.has(i) for i in numbers)

    def followed_by(self, extra: bytes) -> Callable[[int], bool]:
        """``has`` for these bytes followed by ``extra`` (a view's words), reusing the
        searches made so far: the bytes' own answer, or an occurrence that ends in
        ``extra`` (and may start in the bytes' last few)."""
        data, words, has = self.data, self.table.words, self.has
        end = data[max(0, len(data) - self.table.reach) :] + extra
        return lambda i: has(i) or words[i] in end
