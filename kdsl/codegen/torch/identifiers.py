"""Names in the generated PyTorch source: the names the module uses itself, the Python identifier of
each size variable, the einops axis of each dim, the class name."""

from __future__ import annotations

import keyword
import re
from dataclasses import dataclass, field

#: Every name the generated ``__init__`` and ``forward`` use for themselves. Size variables are
#: locals of those methods, so a variable with one of these names (or a keyword, or one Python
#: would mangle) gets another identifier there (see :func:`_identifiers`); a test checks that
#: the generated methods use no other name.
OWN_NAMES = frozenset(
    {
        "self",
        "super",
        "__class__",  # zero-argument super() reads it
        "list",
        "nn",
        "torch",
        "F",
        "math",
        "einsum",
        "rearrange",
        "reduce",
        "ShapeError",
        "bias",
        "_conv",
        "_unfold",
        "_im2col",
        "_check_input",
        "shapes",
        "shape",
        "fan_ins",
        "weights",
        "x",
        "w",
    }
)
#: The public attributes of ``torch.nn.Module`` (torch 2.13; a test compares them with the installed
#: torch's). A weight named like one gets another attribute (:func:`weight_attributes`).
NN_MODULE_ATTRIBUTES = frozenset(
    """T_destination add_module apply bfloat16 buffers call_super_init children compile cpu cuda double
    dump_patches eval extra_repr float forward get_buffer get_extra_state get_parameter get_submodule half
    ipu load_state_dict modules mtia named_buffers named_children named_modules named_parameters parameters
    register_backward_hook register_buffer register_forward_hook register_forward_pre_hook
    register_full_backward_hook register_full_backward_pre_hook register_load_state_dict_post_hook
    register_load_state_dict_pre_hook register_module register_parameter register_state_dict_post_hook
    register_state_dict_pre_hook requires_grad_ set_extra_state set_submodule share_memory state_dict to
    to_empty train training type xpu zero_grad""".split()
)
#: The ``torch.nn`` layer attributes a convolution-like module sets
#: (:func:`kdsl.codegen.torch.layer_facts.nn_layer`).
NN_LAYER_ATTRIBUTES = frozenset(
    {"in_channels", "out_channels", "kernel_size", "stride", "dilation", "groups", "in_features", "out_features"}
)
#: The attributes a weight's parameter must not take: ``nn.Module``'s and the generated module's own.
RESERVED_ATTRIBUTES = (
    NN_MODULE_ATTRIBUTES
    | NN_LAYER_ATTRIBUTES
    | {
        "bias",
        "fan_ins",
        "kdsl_source",
        "masks",
        "operator",
        "padded_forward",
        "padding",
        "reset_parameters",
        "sizes",
        "weights",
    }
)
#: Module-level names of the generated source (a class name must not hide one of them).
MODULE_NAMES = OWN_NAMES | {"math", "HELPERS"}

#: Axis names einops rejects or that clash with the keyword arguments of rearrange/reduce.
_EINOPS_TAKEN = frozenset({"axis", "tensor", "pattern", "reduction"})


def _einops_ok(name: str) -> bool:
    """Whether einops takes ``name`` as an axis and it can be passed as a keyword argument."""
    return (
        name.isidentifier()
        and not name.startswith("_")
        and not name.endswith("_")
        and not keyword.iskeyword(name)
        and name not in _EINOPS_TAKEN
    )


def _python_ok(name: str, reserved: frozenset[str] = frozenset()) -> bool:
    """Whether ``name`` can be a size variable's own identifier in the generated methods."""
    mangled = name.startswith("__") and not name.endswith("__")  # Python renames it inside a class
    return not (name in OWN_NAMES or name in reserved or keyword.iskeyword(name) or name == "__debug__" or mangled)


def _identifiers(variables: list[str], reserved: frozenset[str] = frozenset()) -> dict[str, str]:
    """Size variable -> its Python identifier in the generated code: its own name where that is
    safe, else a new one that no other variable and no name of the module has (``F`` -> ``F_``).
    ``reserved``: more names the generated code uses for itself (a branching kernel's variables)."""
    taken = set(variables) | OWN_NAMES | reserved
    table = {}
    for name in variables:
        identifier = name
        if not _python_ok(name, reserved):
            identifier = f"v{name}" if name.startswith("__") else f"{name}_"
            while identifier in taken or not _python_ok(identifier, reserved):
                identifier += "_"
            taken.add(identifier)
        table[name] = identifier
    return table


@dataclass
class _Axes:
    """DSL dim name -> einops axis name, one-to-one by construction: a dim keeps its own name
    where einops takes it, else gets a new one that no dim and no earlier axis has."""

    taken: set[str]
    names: dict[str, str] = field(default_factory=dict)

    def __call__(self, name: str) -> str:
        if name not in self.names:
            base = name if _einops_ok(name) and name not in self.names.values() else name.strip("_") or "dim"
            axis, number = base, 2
            while not _einops_ok(axis) or axis in self.names.values() or (axis != name and axis in self.taken):
                axis, number = f"{base}{number}", number + 1
            self.names[name] = axis
        return self.names[name]

    def renamed(self) -> dict[str, str]:
        return {name: axis for name, axis in self.names.items() if name != axis}


def _class_name(name: str) -> str:
    parts = re.split(r"[^A-Za-z0-9]+", name)
    text = "".join(p[:1].upper() + p[1:] for p in parts if p) or "Operator"
    text = text if text[0].isalpha() else "Op" + text
    return text + "Operator" if text in MODULE_NAMES or keyword.iskeyword(text) else text
