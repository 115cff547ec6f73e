"""einops patterns turned into plain torch calls when kdsl writes a module, not when it runs.

The PyTorch backend thinks in einops patterns (``"N (g co) H W -> N g co H W"``): they name the
DSL's dims. einops parses a pattern and checks the shapes on every call, a few microseconds of
Python each time, which on a GPU at small sizes costs as much as the kernels (a module with three
``rearrange`` calls took twice as long as PyTorch's own grouped convolution on an H200). So the
generated code calls ``reshape``/``permute``/``torch.einsum`` with the shapes and the permutation
worked out here, once, and keeps the pattern as a comment for the reader.

:func:`rearrange_code` writes one ``rearrange`` as ``reshape`` (to split the source's groups),
``permute`` and ``reshape`` (to form the target's groups), leaving out each part that does nothing
(or as ``F.pixel_shuffle``/``F.pixel_unshuffle`` where it is exactly one of them);
:func:`einsum_code` writes an einops ``einsum`` as ``torch.einsum`` over one letter per dim.

>>> rearrange_code("x", "N (g co) H W", "N g co H W", {"g": "G"})
'x.reshape(x.shape[0], G, x.shape[1] // G, x.shape[2], x.shape[3])'
>>> rearrange_code("w", "g co ci kh kw", "(g co) ci kh kw", {})
'w.flatten(0, 1)'
>>> rearrange_code("x", "N H W c", "N c H W", {})
'x.permute(0, 3, 1, 2)'
>>> rearrange_code("x", "(N) (C) H W", "N C H W", {}) is None
True
>>> rearrange_code("x", "N (C a b) H W", "N C (H a) (W b)", {"a": "r", "b": "r"})
'F.pixel_shuffle(x, r)'
>>> einsum_code(["x", "w"], ["N Cin H W", "d Cin"], "N d H W")
'torch.einsum("abcd,eb->aecd", x, w)'
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

__all__ = ["einsum_code", "parse_pattern", "rearrange_code"]


def parse_pattern(pattern: str) -> list[list[str]]:
    """An einops pattern as its groups: ``"N (g co) () H"`` -> ``[["N"], ["g", "co"], [], ["H"]]``."""
    return [token.strip("()").split() for token in re.findall(r"\([^)]*\)|\S+", pattern)]


def _product(codes: Sequence[str]) -> str:
    """Python code of the product of size codes (``1`` for none)."""
    codes = [c for c in codes if c != "1"]
    if len(codes) == 1:
        return codes[0]
    return " * ".join(c if re.fullmatch(r"[\w.\[\]]+", c) else f"({c})" for c in codes) or "1"


def rearrange_code(operand: str, source: str, target: str, lengths: Mapping[str, str]) -> str | None:
    """Python code of ``einops.rearrange(operand, "source -> target", **lengths)`` in torch calls,
    or None where it would change nothing (only parentheses around single dims differ).

    ``operand`` is a variable or an attribute (it is read more than once); ``lengths`` gives the
    Python code of dims' sizes: every dim of a source group but one must have one (as einops
    needs), the others are read from ``operand.shape``. A permutation is a view; a reshape after it
    copies where the strides need it, as ``rearrange`` does.
    """
    groups, targets = parse_pattern(source), parse_pattern(target)
    elementary = [d for g in groups for d in g]
    order = [d for g in targets for d in g]
    if sorted(elementary) != sorted(order):
        raise ValueError(f"rearrange {source!r} -> {target!r} does not keep its dims")
    sizes: dict[str, str] = {}
    for position, group in enumerate(groups):
        whole = f"{operand}.shape[{position}]"
        if len(group) == 1:
            sizes[group[0]] = lengths.get(group[0], whole)
            continue
        unknown = [d for d in group if d not in lengths]
        if len(unknown) > 1:
            raise ValueError(f"rearrange {source!r}: give the lengths of all but one of {group}")
        for d in group:
            if d in lengths:
                sizes[d] = lengths[d]
        if unknown:  # einops allows one: the group's length over the others'
            known = _product([lengths[d] for d in group if d in lengths])
            sizes[unknown[0]] = whole if known == "1" else f"{whole} // {known if ' ' not in known else f'({known})'}"
    shuffle = _pixel_shuffle(operand, groups, targets, lengths)
    if shuffle is not None:
        return shuffle
    split = any(len(g) != 1 for g in groups)
    permutation = [elementary.index(d) for d in order]
    permuted = permutation != list(range(len(permutation)))
    joined = any(len(g) != 1 for g in targets)
    if not split and not permuted and not joined:
        return None
    # group boundaries of the source and the target as cut points in the elementary order
    source_cuts = _cuts(groups)
    if not permuted:
        if _cuts(targets) == source_cuts and len(targets) == len(groups):
            return None  # the same groups (a unit group dropped in one and added in the other is covered below)
        merged = _flatten_only(groups, targets)
        if merged is not None:
            return f"{operand}.flatten({merged[0]}, {merged[1]})"
        shape = [_group_size(g, groups, sizes, operand) for g in targets]
        return f"{operand}.reshape({', '.join(shape)})"
    code = operand
    if split:
        code = f"{code}.reshape({', '.join(sizes[d] for d in elementary)})"
    code = f"{code}.permute({', '.join(str(p) for p in permutation)})"
    if joined:
        shape = [_product([sizes[d] for d in g]) for g in targets]
        code = f"{code}.reshape({', '.join(shape)})"
    return code


def _pixel_shuffle(
    operand: str, groups: list[list[str]], targets: list[list[str]], lengths: Mapping[str, str]
) -> str | None:
    """``F.pixel_shuffle`` (``F.pixel_unshuffle``) where the rearrangement is exactly it: one kernel,
    where reshape, permute and reshape are three calls. Shuffle: ``... (c a b) h w -> ... c (h a) (w b)``
    with a and b of one given length r; unshuffle the other way."""
    if len(groups) < 3 or len(groups) != len(targets) or groups[:-3] != targets[:-3]:
        return None
    if any(len(g) != 1 for g in groups[:-3]):
        return None
    (c, h, w), (tc, th, tw) = groups[-3:], targets[-3:]
    if len(c) == 3 and [tc, th, tw] == [c[:1], h + c[1:2], w + c[2:]] and len(h) == len(w) == 1:
        a, b, function = c[1], c[2], "pixel_shuffle"
    elif len(tc) == 3 and [c, h, w] == [tc[:1], th + tc[1:2], tw + tc[2:]] and len(th) == len(tw) == 1:
        a, b, function = tc[1], tc[2], "pixel_unshuffle"
    else:
        return None
    if a not in lengths or lengths[a] != lengths.get(b):
        return None
    return f"F.{function}({operand}, {lengths[a]})"


def _cuts(groups: list[list[str]]) -> list[int]:
    cuts, count = [], 0
    for group in groups:
        count += len(group)
        cuts.append(count)
    return cuts


def _group_size(group: list[str], groups: list[list[str]], sizes: dict[str, str], operand: str) -> str:
    """A target group's size: the source group's own ``shape`` entry where they are the same dims."""
    for position, source in enumerate(groups):
        if source == group and len(group) > 1:
            return f"{operand}.shape[{position}]"
    return _product([sizes[d] for d in group])


def _flatten_only(groups: list[list[str]], targets: list[list[str]]) -> tuple[int, int] | None:
    """(start, end) when the target only merges the source's single dims start..end into one."""
    if any(len(g) != 1 for g in groups) or len(targets) >= len(groups):
        return None
    multi = [i for i, g in enumerate(targets) if len(g) != 1]
    if len(multi) != 1 or not targets[multi[0]] or len(targets) != len(groups) - len(targets[multi[0]]) + 1:
        return None
    start = multi[0]
    return start, start + len(targets[start]) - 1


def einsum_code(operands: Sequence[str], patterns: Sequence[str], result: str) -> str:
    """``torch.einsum`` of ``operands`` whose dims the einops patterns name (no groups), one letter
    per dim name, for ``einops.einsum(*operands, "patterns -> result")``."""
    names: dict[str, str] = {}
    letters = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"

    def spell(pattern: str) -> str:
        text = ""
        for group in parse_pattern(pattern):
            if len(group) != 1:
                raise ValueError(f"einsum pattern {pattern!r} has a group")
            if group[0] not in names:
                if len(names) == len(letters):
                    raise ValueError("torch.einsum takes at most 52 dims")
                names[group[0]] = letters[len(names)]
            text += names[group[0]]
        return text

    spec = ",".join(spell(p) for p in patterns) + "->" + spell(result)
    return f'torch.einsum("{spec}", {", ".join(operands)})'
