"""What the gallery's Markdown pages and its HTML site both say: categories, one-sentence
summaries, a description cut into prose and formulas, the "use it" snippet and the labels of
measured numbers. The two writers (:mod:`kdsl.gallery.pages`, :mod:`kdsl.gallery.site`) only
format these.

>>> first_sentence("Involution (Li et al. 2021), as Canvas decomposes it: a kernel.\\n\\nMore.")
'Involution (Li et al. 2021), as Canvas decomposes it: a kernel.'
>>> [kind for kind, _ in description_blocks("A conv.\\n\\nout[n] = sum_c x[n, c] * w[c]\\n\\nNo bias.")]
['prose', 'formula', 'prose']
>>> markdown_prose("sum_c g*Cin/G")
'sum\\\\_c g\\\\*Cin/G'
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from kdsl import solve
from kdsl.codegen.torch import lazy_variables
from kdsl.lang.operator import Operator


@dataclass(frozen=True)
class Entry:
    """One operator of the gallery as both writers show it.

    ``name`` names its files (``pages/<name>.md``, ``site/<name>.html``, ``<name>.svg``);
    ``table`` is its layer table (``None``: no valid one); ``macs``/``params`` are summed over the
    table's layers; ``metrics`` are measured numbers by key; ``search`` is its rediscovery record;
    ``new`` marks an operator that search found."""

    name: str
    op: Operator
    description: str = ""
    table: str | None = None
    category: str = "other"
    macs: float | None = None
    params: float | None = None
    metrics: Mapping[str, Any] = field(default_factory=dict)
    search: Mapping[str, Any] | None = None
    new: bool = False


#: the index's sections, in order: (slug, title, one line on what belongs there)
CATEGORIES: tuple[tuple[str, str, str], ...] = (
    ("convolutions", "Convolutions and matrix products", "the conv family, 1x1 mixes, linear layers"),
    ("pooling", "Pooling", "averages and maxima over windows or tiles"),
    ("reshuffles", "Reshuffles", "data moved, nothing computed: pixel (un)shuffle, im2col"),
    ("branching", "Attention-like and branching", "kernels that branch, gate or multiply two data paths"),
    ("papers", "Papers' operators", "operators published by Syno and Canvas"),
    ("discoveries", "Search discoveries", "operators that kdsl discover found and added to the gallery"),
    ("other", "Other operators", "gallery files not in any category above"),
)

#: the category of each built-in gallery operator (a file not listed falls back on its kind)
CATEGORY_OF: dict[str, str] = {
    **dict.fromkeys(
        [
            "conv1d",
            "conv2d",
            "conv2d_kx1_1xk",
            "depthwise_conv2d",
            "depthwise_separable_conv2d",
            "dilated_conv2d",
            "grouped_conv2d",
            "pointwise_conv2d",
            "shift_conv2d",
            "strided_conv2d",
            "linear",
            "matmul",
            "bmm",
            "bmm_tn",
            "conv2d_valid",
            "alexnet_c1",
            "conv_transpose2d",
            "conv_transpose3d",
            "conv3d",
        ],
        "convolutions",
    ),
    **dict.fromkeys(["avg_pool2d", "avg_pool2d_strided", "max_pool2d", "max_pool2d_2x2"], "pooling"),
    **dict.fromkeys(["pixel_shuffle", "pixel_unshuffle", "unfold2d"], "reshuffles"),
    **dict.fromkeys(
        ["involution", "spatial_attention", "squeeze_excitation", "residual_conv2d", "attention_qk"], "branching"
    ),
    **dict.fromkeys(["syno_op1", "syno_op2", "canvas_resnet34", "shift_add"], "papers"),
}

#: how a gallery file says that search found it (the same words as :data:`kdsl.gallery.DISCOVERED`)
_DISCOVERED = "Found by kdsl discover"


def category(name: str, op: Operator, description: str = "") -> str:
    """The slug of the section an operator is listed in: the explicit table, else a discovery when
    its description says so, else ``branching`` for a branching kernel, else ``other``.

    >>> from kdsl import gallery
    >>> category("conv2d", gallery.load("conv2d")), category("mine", gallery.load("conv2d"))
    ('convolutions', 'other')
    """
    if name in CATEGORY_OF:
        return CATEGORY_OF[name]
    if description.startswith(_DISCOVERED):
        return "discoveries"
    return "branching" if not op.is_linear else "other"


def first_sentence(text: str) -> str:
    """The description's first sentence, whole (its first paragraph up to a full stop that ends a
    sentence: followed by a capital letter, or the paragraph's end), on one line."""
    paragraph = " ".join(text.strip().split("\n\n", 1)[0].split())
    match = re.search(r"[.!?](?=\s+[A-Z(`])", paragraph)
    return paragraph[: match.end()] if match else paragraph


# a line that starts a formula: ``out[n, c] = ...`` (a name, an index list, an equals sign)
_FORMULA = re.compile(r"^[A-Za-z_][\w']*\[[^\]]*\]\s*=(?!=)")


# a line of a record paragraph: ``accuracy: 0.96``, ``baseline accuracy (conv2d): 0.962``
_RECORD_LINE = re.compile(r"^[A-Za-z][\w ()-]*: \S")


def description_blocks(text: str) -> list[tuple[str, str]]:
    """The description as ``("prose" | "formula" | "record", text)`` blocks: a formula starts at a
    line like ``out[n, o] = ...`` and goes on over the indented lines after it; a paragraph whose
    every line is ``key: value`` (a discovery's provenance) is a record, one item per line;
    everything else is prose, one block per paragraph (a formula line inside a paragraph splits it).

    >>> description_blocks("Found.\\n\\naccuracy: 0.96\\nparams: 10")
    [('prose', 'Found.'), ('record', 'accuracy: 0.96\\nparams: 10')]
    """
    blocks: list[tuple[str, str]] = []
    for paragraph in text.strip().split("\n\n"):
        rows = [line.strip() for line in paragraph.splitlines()]
        if len(rows) >= 2 and all(_RECORD_LINE.match(row) for row in rows):
            blocks.append(("record", "\n".join(rows)))  # a discovery's provenance: one item per line
            continue
        current: list[str] = []
        kind = "prose"
        for line in paragraph.splitlines():
            starts = bool(_FORMULA.match(line.strip()))
            continues = kind == "formula" and line[:1].isspace()
            if starts or continues:
                if kind == "prose" and current:
                    blocks.append(("prose", "\n".join(current)))
                    current = []
                kind = "formula"
                current.append(line.rstrip())
            else:
                if kind == "formula" and current:
                    blocks.append(("formula", "\n".join(current)))
                    current = []
                kind = "prose"
                current.append(line.strip())
        if current:
            blocks.append((kind, "\n".join(current)))
    return blocks


def markdown_prose(text: str) -> str:
    """Prose with the characters Markdown would take for markup escaped (``*`` and ``_`` as
    emphasis, ``<`` before a letter as HTML, a line's leading ``+``/``-``/``#``/``>`` as a list,
    heading or quote); double-backquoted code spans stay code."""
    parts = re.split(r"(``.+?``)", text)
    for index in range(0, len(parts), 2):
        part = parts[index].replace("\\", "\\\\")
        part = re.sub(r"([*_])", r"\\\1", part)
        part = re.sub(r"<(?=[A-Za-z/!?])", "&lt;", part)
        parts[index] = re.sub(r"(?m)^([+\-#>])", r"\\\1", part)
    return "".join(parts)


#: how to read a drawing of a linear chain (:func:`kdsl.codegen.render.svg`)
LEGEND = (
    "In the drawing each dim is a vertical line, labelled with its name and size where it starts; a box is a "
    "primitive across the dims it reads and makes: blue a window or a move, violet a split, "
    "merge or broadcast, orange a weight, green a reduction."
)


#: how to read a drawing of a branching kernel (:func:`kdsl.codegen.render.graph_svg`)
GRAPH_LEGEND = (
    "In the drawing each box is a node of the branching kernel (a chain lists its steps) with its result's dims; "
    "arrows run from a node's arguments, and a join (orange) marks its two as lhs and rhs."
)


#: what each measured number is, for people (the records keep short keys)
METRIC_LABELS: dict[str, str] = {
    "kdsl_fwd_ms": "kdsl → PyTorch, forward (ms)",
    "native_fwd_ms": "native PyTorch, forward (ms)",
    "tvm_fwd_ms": "kdsl → TVM default schedule, forward (ms)",
    "latency_ms": "latency (ms)",
    "latency_ratio": "latency / baseline's",
    "flops_ratio": "MACs / baseline's",  # the key says flops; it counts multiply-accumulates
}


def metric_label(key: str) -> str:
    """The label of a measured number: :data:`METRIC_LABELS`, else the key with spaces.

    >>> metric_label("kdsl_fwd_ms"), metric_label("baseline_accuracy")
    ('kdsl → PyTorch, forward (ms)', 'baseline accuracy')
    """
    return METRIC_LABELS.get(key, key.replace("_", " "))


def search_badge(record: Mapping[str, Any] | None) -> tuple[str, str]:
    """``(kind, text)`` of the badge that says whether search rediscovered an operator: kind is
    ``found``, ``missed`` or ``unsearched``."""
    if not record:
        return "unsearched", "not searched yet"
    if record.get("found"):
        return "found", f"found by search at depth {record.get('depth')}"
    return "missed", f"not found by search (depth ≤ {record.get('max_depth', '?')})"


def search_rows(record: Mapping[str, Any]) -> list[tuple[str, str]]:
    """The rediscovery record as labelled rows (what search did and what it found)."""
    labels = {
        "found": "found",
        "strategy": "strategy",
        "spec": "spec",
        "space": "search space",
        "depth": "depth of the operator",
        "max_depth": "depth searched",
        "nodes": "nodes visited",
        "goal_nodes": "nodes per output goal (the spec's, then Cin -> Cin)",
        "seconds": "CPU seconds",
        "wall_seconds": "wall seconds",
        "key": "canonical key",
        "why": "why not found",
    }
    rows = []
    for key, label in labels.items():
        if record.get(key) is None:
            continue
        value = record[key]
        text = (
            "yes"
            if value is True
            else "no"
            if value is False
            else f"{value:.1f}"
            if key in ("seconds", "wall_seconds")
            else str(value)
        )
        rows.append((label, text))
    rows += [(key.replace("_", " "), str(value)) for key, value in record.items() if key not in labels]
    return rows


def use_it(name: str, op: Operator, table: str | None) -> str:
    """Python that loads the operator and builds a PyTorch module of it at the first layer of its
    table (the sizes the weights need; the others bind at the first call), then runs it once.

    >>> from kdsl import gallery
    >>> print(use_it("linear", gallery.load("linear"), "resnet18"))
    import torch
    import kdsl
    from kdsl.codegen import torch as kdsl_torch
    <BLANKLINE>
    op = kdsl.gallery.load("linear")
    module = kdsl_torch.build(op, {"Cin": 64, "Cout": 64})  # an nn.Module; N binds at the first call
    y = module(torch.randn(1, 64))  # y: [1, 64]
    """
    layer = solve.load_layers(table)[0] if table else None
    lines = ["import torch", "import kdsl", "from kdsl.codegen import torch as kdsl_torch", ""]
    lines.append(f"op = kdsl.gallery.load({name!r})".replace("'", '"'))
    if layer is None:
        lines.append("module = kdsl_torch.build(op, {...})  # the sizes of your layer")
        return "\n".join(lines)
    lazy = sorted(lazy_variables(op).items(), key=lambda item: item[1])  # in the input's order: N, H, W
    lazy = [name for name, _ in lazy]
    used = set(op.primary_variables) | set(op.dynamic_variables)
    # a table whose layers bind their own coefficients (gensor_pool's windows): those that differ from the defaults
    used |= {k for k in op.coefficient_variables if k in layer and layer[k] != op.default_coefficients.get(k)}
    sizes = {k: v for k, v in layer.values.items() if k in used and k not in lazy}
    shapes = solve.shapes(op, layer)
    later = f"; {', '.join(lazy)} bind{'s' if len(lazy) == 1 else ''} at the first call" if lazy else ""
    bound = "{" + ", ".join(f'"{k}": {v}' for k, v in sizes.items()) + "}"
    lines.append(f"module = kdsl_torch.build(op, {bound})  # an nn.Module{later}")
    inputs = shapes.get("inputs", {"x": shapes["input"]})  # a kernel of several inputs takes them in order
    arguments = ", ".join(f"torch.randn({', '.join(str(n) for n in shape)})" for shape in inputs.values())
    lines.append(f"y = module({arguments})  # y: {list(shapes['output'])}")
    return "\n".join(lines)
