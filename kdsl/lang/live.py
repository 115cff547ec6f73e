"""The live dims of a build: the dims alive at one point of building an operator, in order.

A :class:`Live` is the state a primitive's shape rule (:meth:`kdsl.lang.primitives.Primitive.apply`)
reads and updates: it resolves dim references (a name, or a size only one dim has) and replaces,
merges, adds and removes dims in O(1) each.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from types import MappingProxyType

from kdsl.lang.errors import AmbiguousDimError, ShapeError, UnboundDimError
from kdsl.lang.sizes import Size


class Live:
    """The dims alive at one point of a build, in order: name -> size, plus which ones come from a
    sliding window (Unfold) or a repetition (Expand), which Stride needs to be valid.

    Every update is O(1) (Merge: O(distance between the two dims)), so building an operator with
    thousands of dims stays linear: the order is a linked list, and an index from size to names
    answers size references. :attr:`sizes` is a read-only ordered view, rebuilt only when read
    after a change.

    >>> from kdsl.lang.sizes import primary
    >>> N, C = primary("N C")
    >>> live = Live({"N": N, "C": C}, ())
    >>> live.replace("N", [("a", N / C), ("b", C)], "Split")
    >>> list(live.sizes)
    ['a', 'b', 'C']
    >>> live.find(C)  # two dims have size C: the one named C is meant
    'C'
    """

    __slots__ = ("_sizes", "_next", "_prev", "_first", "_last", "_by_size", "_view", "windowed")

    def __init__(self, sizes: Mapping[str, Size], windowed: Iterable[str]) -> None:
        self._sizes: dict[str, Size] = {}
        self._next: dict[str, str | None] = {}
        self._prev: dict[str, str | None] = {}
        self._first: str | None = None
        self._last: str | None = None
        self._by_size: dict[Size, dict[str, None]] = {}
        self._view: dict[str, Size] | None = None
        #: the names of dims that come from a window or an Expand (Stride may act on them)
        self.windowed: set[str] = set(windowed)
        for name, size in sizes.items():
            self._link_after(self._last, name, size)

    def copy(self) -> Live:
        clone = Live.__new__(Live)
        clone._sizes = dict(self._sizes)
        clone._next = dict(self._next)
        clone._prev = dict(self._prev)
        clone._first, clone._last = self._first, self._last
        clone._by_size = {size: dict(names) for size, names in self._by_size.items()}
        clone._view = self._view
        clone.windowed = set(self.windowed)
        return clone

    # -- reading ------------------------------------------------------------------------------
    @property
    def sizes(self) -> Mapping[str, Size]:
        """The live dims in order, name -> size (read-only)."""
        if self._view is None:
            view: dict[str, Size] = {}
            name = self._first
            while name is not None:
                view[name] = self._sizes[name]
                name = self._next[name]
            self._view = view
        return MappingProxyType(self._view)

    def __contains__(self, name: object) -> bool:
        return name in self._sizes

    def size(self, name: str) -> Size:
        return self._sizes[name]

    def has_size(self, size: Size) -> bool:
        """Whether some live dim has exactly this size."""
        return size in self._by_size

    def __len__(self) -> int:
        return len(self._sizes)

    def describe(self) -> str:
        return "[" + ", ".join(f"{n}: {s}" for n, s in self.sizes.items()) + "]"

    def resolve(self, ref: object, role: str) -> str:
        """The name of the live dim ``ref`` refers to.

        A string refers by name. A size refers to the one live dim of that size; when several
        have it, to the one whose name is the size's variable name (``Cin`` -> dim ``Cin``);
        otherwise the reference is ambiguous and the user must name the dim.
        """
        if isinstance(ref, str):
            if ref in self._sizes:
                return ref
            raise UnboundDimError(f"{role}: there is no dim named {ref!r:.140}; the live dims are {self.describe()}")
        if not isinstance(ref, Size):
            raise ShapeError(f"{role}: {ref!r:.140} is neither a dim name nor a size")
        found = self.find(ref)
        if found is None:
            raise UnboundDimError(f"{role}: no live dim has size {ref}; the live dims are {self.describe()}")
        return found

    def find(self, ref: Size) -> str | None:
        """Resolve a size reference; ``None`` if no dim has that size (ambiguity raises)."""
        matches = self._by_size.get(ref)
        if not matches:
            return None
        if len(matches) == 1:
            return next(iter(matches))
        if ref.variable_name in matches:
            return ref.variable_name
        ordered = [n for n in self.sizes if n in matches]
        raise AmbiguousDimError(
            f"size {ref} matches the dims {', '.join(ordered)}; refer to one of them by name (a string)"
        )

    # -- updating -----------------------------------------------------------------------------
    def _link_after(self, before: str | None, name: str, size: Size) -> None:
        """Insert ``name`` right after ``before`` (at the front when ``before`` is None)."""
        after = self._first if before is None else self._next[before]
        self._prev[name] = before
        self._next[name] = after
        if before is None:
            self._first = name
        else:
            self._next[before] = name
        if after is None:
            self._last = name
        else:
            self._prev[after] = name
        self._sizes[name] = size
        self._by_size.setdefault(size, {})[name] = None
        self._view = None

    def remove(self, name: str) -> None:
        """Drop the live dim ``name`` (it must exist)."""
        before, after = self._prev.pop(name), self._next.pop(name)
        if before is None:
            self._first = after
        else:
            self._next[before] = after
        if after is None:
            self._last = before
        else:
            self._prev[after] = before
        size = self._sizes.pop(name)
        same = self._by_size[size]
        del same[name]
        if not same:
            del self._by_size[size]
        self.windowed.discard(name)
        self._view = None

    def add(self, name: str, size: Size, role: str) -> None:
        """Append a new dim (its name must be free)."""
        if name in self._sizes:
            raise ShapeError(f"{role}: a dim named {name!r} already exists; choose another name")
        self._link_after(self._last, name, size)

    def resize(self, name: str, size: Size) -> None:
        """Give the live dim ``name`` a new size, keeping its place."""
        old = self._sizes[name]
        same = self._by_size[old]
        del same[name]
        if not same:
            del self._by_size[old]
        self._sizes[name] = size
        self._by_size.setdefault(size, {})[name] = None
        self._view = None

    def replace(self, name: str, produced: Sequence[tuple[str, Size]], role: str, *, windowed: bool = False) -> None:
        """Replace the dim ``name`` by ``produced`` at the same place; the new dims are windowed
        when ``windowed`` is true. Checks the new names before changing anything."""
        self._check_new(produced, role, freed=(name,))
        before = self._prev[name]
        self.remove(name)
        for new_name, size in produced:
            self._link_after(before, new_name, size)
            before = new_name
        if windowed:
            self.windowed.update(n for n, _ in produced)

    def merge(self, outer: str, inner: str, name: str, size: Size, role: str, *, windowed: bool) -> None:
        """Replace ``outer`` and ``inner`` by one dim ``name``.

        Where it goes is kept from the first implementation (generated code and pages depend on
        the order): at the index ``outer`` had, counted in the list without both dims. So it takes
        ``outer``'s place when ``inner`` comes after it, and one place further on when before.
        """
        self._check_new([(name, size)], role, freed=(outer, inner))
        if self._precedes(inner, outer):
            anchor = self._next[outer]  # never inner, which comes before
            self.remove(inner)
            self.remove(outer)
            if anchor is None:  # outer was last: the merged dim goes last
                anchor = self._last
        else:
            anchor = self._prev[outer]  # never inner, which comes after
            self.remove(inner)
            self.remove(outer)
        self._link_after(anchor, name, size)
        if windowed:
            self.windowed.add(name)

    def _precedes(self, a: str, b: str) -> bool:
        """Whether dim ``a`` comes before dim ``b``: walk outwards from ``b`` in both directions,
        so neighbouring dims (the usual case) answer at once."""
        back, ahead = self._prev[b], self._next[b]
        while back is not None or ahead is not None:
            if back == a:
                return True
            if ahead == a:
                return False
            back = self._prev[back] if back is not None else None
            ahead = self._next[ahead] if ahead is not None else None
        return False

    def _check_new(self, produced: Sequence[tuple[str, Size]], role: str, freed: tuple[str, ...]) -> None:
        names = [n for n, _ in produced]
        for new_name in names:
            if new_name in self._sizes and new_name not in freed:
                raise ShapeError(f"{role}: a dim named {new_name!r} already exists; choose another name")
        if len(set(names)) != len(names):
            raise ShapeError(f"{role}: the new dims need distinct names")
