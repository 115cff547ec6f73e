"""Reading DSL source safely: an interpreter over a whitelist of Python's AST.

The source is parsed with :func:`ast.parse` and only these forms are evaluated: ``import`` of
kdsl (ignored), assignments to names, calls of the DSL's own functions, names bound earlier,
int/str/bool literals, a dict of coefficient defaults, and the operators ``>>``, ``*``, ``/``,
``**`` and unary ``-``. Nothing is passed to ``eval`` or ``exec``, so a file cannot run code.

>>> op = parse('''
... N, C, L = primary("N C L"); K = coefficient("K")
... w = Weight(C, "k", name="w")
... op = Input(N, C, L) >> Unfold(L, K, "k") >> Share(w) >> Reduce("k") >> Output(N, C, L)
... ''')
>>> [d.name for d in op.outputs]
['N', 'C', 'L']
"""

from __future__ import annotations

import ast
import warnings
from collections.abc import Callable, Mapping
from fractions import Fraction
from typing import Any

from kdsl.lang.branches import JOIN_FUNCTIONS, Tensor
from kdsl.lang.build import Builder, Input
from kdsl.lang.errors import KdslError, ParseError
from kdsl.lang.names import MAX_CONSTANT, MAX_EXPONENT
from kdsl.lang.nonlinear import MAX_SCALE, UNARY
from kdsl.lang.operator import Operator
from kdsl.lang.primitives import PRIMITIVES, Dim, Output, Weight
from kdsl.lang.sizes import KINDS, Size, coefficient, dynamic, primary

MAX_SOURCE_CHARS = 200_000
MAX_QUOTED_CHARS = 300

#: the functions a DSL program may call, with the keywords each accepts
FUNCTIONS: dict[str, tuple[Callable[..., Any], frozenset[str]]] = {
    "primary": (primary, frozenset()),
    "coefficient": (coefficient, frozenset()),
    "dynamic": (dynamic, frozenset()),
    "Dim": (Dim, frozenset()),
    "Weight": (Weight, frozenset({"name"})),
    "Input": (Input, frozenset({"name"})),
    "Output": (Output, frozenset({"defaults"})),
    # each primitive accepts its optional and keyword fields as keywords (declared once, in
    # kdsl.lang.primitives and kdsl.lang.nonlinear)
    **{
        kind: (cls, frozenset(f.name for f in cls.fields if f.optional or f.keyword))
        for kind, cls in {**PRIMITIVES, **UNARY}.items()
    },
    **{kind: (function, frozenset()) for kind, function in JOIN_FUNCTIONS.items()},
}
IMPORTABLE = frozenset({"kdsl", "kdsl.lang"})


class _Interpreter:
    def __init__(self, source: str) -> None:
        self.lines = source.splitlines()
        self.env: dict[str, Any] = {}
        self.order: dict[str, None] = {}  # names in first-binding order (a dict: O(1) membership)
        self.read: set[str] = set()  # names read by a later expression (a branch must be joined)

    def fail(self, node: ast.AST, message: str) -> ParseError:
        line = getattr(node, "lineno", None)
        where = f"line {line}: " if line else ""
        return ParseError(where + message)

    # -- statements ---------------------------------------------------------------------------
    def run(self, tree: ast.Module) -> None:
        for index, statement in enumerate(tree.body):
            if isinstance(statement, ast.ImportFrom) and statement.module in IMPORTABLE and statement.level == 0:
                continue
            if isinstance(statement, ast.Import) and all(a.name in IMPORTABLE for a in statement.names):
                continue
            is_docstring = isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Constant)
            if is_docstring and index == 0 and isinstance(statement.value.value, str):
                continue
            if isinstance(statement, ast.Assign) and len(statement.targets) == 1:
                value = self.evaluate(statement.value)
                self.bind(statement.targets[0], value)
                continue
            raise self.fail(
                statement,
                f"only assignments like `name = Input(...) >> ...` are allowed, not {type(statement).__name__}",
            )

    def bind(self, target: ast.expr, value: Any) -> None:
        if isinstance(target, ast.Name):
            self.check_target(target)
            self.env[target.id] = value
            self.order.setdefault(target.id, None)
            return
        if isinstance(target, ast.Tuple) and all(isinstance(t, ast.Name) for t in target.elts):
            values = value if isinstance(value, tuple) else (value,)
            if len(values) != len(target.elts):
                raise self.fail(target, f"{len(target.elts)} names on the left but {len(values)} values on the right")
            for element, item in zip(target.elts, values):
                self.bind(element, item)
            return
        raise self.fail(target, "only plain names (or a tuple of names) can be assigned")

    def check_target(self, target: ast.Name) -> None:
        if target.id in FUNCTIONS:
            raise self.fail(target, f"{target.id} is a DSL function and cannot be reassigned")
        if target.id.startswith("_"):
            raise self.fail(target, f"names starting with _ are not allowed ({target.id})")

    # -- expressions --------------------------------------------------------------------------
    def evaluate(self, node: ast.expr) -> Any:
        try:
            return self._evaluate(node)
        except KdslError as error:
            already = error.context is not None and error.context.startswith("line ")
            if not already and getattr(node, "lineno", None):
                line = self.lines[node.lineno - 1].strip() if node.lineno <= len(self.lines) else ""
                if len(line) > MAX_QUOTED_CHARS:  # a message quotes the line, not a 200 KB one
                    line = line[:MAX_QUOTED_CHARS] + " ..."
                # the line goes first; a context the error already has (the partial operator, the
                # tensor a branching step met) stays below it
                context = f"line {node.lineno}: {line}"
                if error.context:
                    context += "\n" + error.context
                raise error.with_context(context) from None
            raise

    def _evaluate(self, node: ast.expr) -> Any:
        if isinstance(node, ast.Constant):
            value = node.value
            if isinstance(value, (bool, str)):
                return value
            if isinstance(value, int):
                return self.small_int(node, value)
            if isinstance(value, float) and abs(value) <= MAX_SCALE:
                return value  # a Map("scale", by=...) factor; sizes refuse floats
            raise self.fail(node, f"the literal {value!r:.40} is not allowed (only ints, strings, True/False, floats)")
        if isinstance(node, ast.Name):
            if node.id in self.env:
                self.read.add(node.id)
                return self.env[node.id]
            if node.id in FUNCTIONS:
                raise self.fail(node, f"{node.id} must be called: {node.id}(...)")
            raise self.fail(node, f"the name {node.id!r} is not defined (define it before use)")
        if isinstance(node, ast.Call):
            return self.call(node)
        if isinstance(node, ast.BinOp):
            return self.binary(node)
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            operand = self._evaluate(node.operand)
            if isinstance(operand, (int, float)) and not isinstance(operand, bool):
                return -operand
            raise self.fail(node, "unary minus applies only to numbers")
        if isinstance(node, ast.Dict):
            result = {}
            for key, value in zip(node.keys, node.values):
                if not (isinstance(key, ast.Constant) and isinstance(key.value, str)):
                    raise self.fail(node, "dict keys must be strings")
                result[key.value] = self._evaluate(value)
            return result
        raise self.fail(node, f"{type(node).__name__} expressions are not part of the DSL")

    def small_int(self, node: ast.AST, value: int) -> int:
        if abs(value) > MAX_CONSTANT:
            # the digits are not printed: a 200,000-digit literal would make a 200 KB message
            raise self.fail(node, f"an integer literal is too large (at most {MAX_CONSTANT} in absolute value)")
        return value

    def call(self, node: ast.Call) -> Any:
        if not isinstance(node.func, ast.Name) or node.func.id not in FUNCTIONS:
            name = node.func.id if isinstance(node.func, ast.Name) else type(node.func).__name__
            raise self.fail(node, f"{name}(...) is not a DSL function; allowed: {', '.join(sorted(FUNCTIONS))}")
        function, allowed = FUNCTIONS[node.func.id]
        if any(isinstance(a, ast.Starred) for a in node.args):
            raise self.fail(node, "*args is not allowed")
        args = [self._evaluate(a) for a in node.args]
        kwargs = {}
        for keyword in node.keywords:
            if keyword.arg is None or keyword.arg not in allowed:
                raise self.fail(
                    node,
                    f"{node.func.id}() takes no keyword {keyword.arg!r}"
                    + (f"; it accepts {', '.join(sorted(allowed))}" if allowed else ""),
                )
            kwargs[keyword.arg] = self._evaluate(keyword.value)
        try:
            return function(*args, **kwargs)
        except KdslError:
            raise
        except TypeError as error:
            raise self.fail(node, f"{node.func.id}(...): {error}") from None

    def binary(self, node: ast.BinOp) -> Any:
        if isinstance(node.op, ast.RShift):
            return self.pipeline(node)
        left = self._evaluate(node.left)
        right = self._evaluate(node.right)
        tensors = (Input, Builder, Tensor)
        if isinstance(left, tensors) and isinstance(right, tensors):
            joins = {ast.Add: "add", ast.Sub: "sub", ast.Mult: "mul"}
            if type(node.op) not in joins:
                raise self.fail(node, "two tensors join with +, -, * or Blend(...)/Product(...)")
            return JOIN_FUNCTIONS["Blend"](joins[type(node.op)], left, right)
        numbers = (Size, int)
        if not isinstance(left, numbers) or not isinstance(right, numbers) or isinstance(left, bool):
            raise self.fail(node, "arithmetic (*, /, **) applies only to sizes and integers")
        if isinstance(node.op, ast.Mult):
            return self.normalize(node, Size.of(left) * Size.of(right))
        if isinstance(node.op, ast.Div):
            if right == 0:
                raise self.fail(node, "division by zero in a size")
            return self.normalize(node, Size.of(left) / Size.of(right))
        if isinstance(node.op, ast.Pow):
            if not isinstance(right, int) or isinstance(right, bool) or abs(right) > MAX_EXPONENT:
                raise self.fail(node, f"exponents must be integers between -{MAX_EXPONENT} and {MAX_EXPONENT}")
            return self.normalize(node, Size.of(left) ** right)
        raise self.fail(node, f"the operator {type(node.op).__name__} is not part of the DSL")

    def pipeline(self, node: ast.BinOp) -> Any:
        """``a >> b >> c`` parses as ``(a >> b) >> c``: walk that left spine in a loop, not by
        recursion, so a pipeline of thousands of steps needs no deep Python stack."""
        spine: list[ast.BinOp] = []
        left_node: ast.expr = node
        while isinstance(left_node, ast.BinOp) and isinstance(left_node.op, ast.RShift):
            spine.append(left_node)
            left_node = left_node.left
        value = self._evaluate(left_node)
        for link in reversed(spine):
            right = self._evaluate(link.right)
            if isinstance(value, (int, str, Size, dict)) or isinstance(right, (int, str, Size, dict)):
                raise self.fail(link, ">> composes primitives, pipelines, Input and Output, not sizes or names")
            try:
                value = value >> right
            except KdslError:
                raise
            except TypeError:
                raise self.fail(link, f"cannot compose {type(value).__name__} >> {type(right).__name__}") from None
        return value

    def normalize(self, node: ast.AST, size: Size) -> Size | int:
        """Keep constant sizes as ints when they are whole (so ``2*3`` stays an int)."""
        if abs(size.constant.numerator) > MAX_CONSTANT or size.constant.denominator > MAX_CONSTANT:
            raise self.fail(node, f"a constant in a size is too large (at most {MAX_CONSTANT})")
        if size.is_constant and size.constant.denominator == 1:
            return int(size.constant)
        return size


def _syntax_tree(source: object, what: str) -> ast.Module:
    if not isinstance(source, str):
        raise ParseError(f"{what} must be a string, got {type(source).__name__}")
    if len(source) > MAX_SOURCE_CHARS:
        raise ParseError(f"{what} is too long ({len(source)} characters; at most {MAX_SOURCE_CHARS})")
    try:
        # a malformed literal ("2kh") makes ast.parse warn as well as fail; the ParseError says it
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return ast.parse(source)
    except SyntaxError as error:
        raise ParseError(f"line {error.lineno}: syntax error: {error.msg}") from None
    except RecursionError:
        raise ParseError(
            f"{what} is nested too deeply for Python's parser (a pipeline of thousands of >> in one "
            f"statement? split it into several statements)"
        ) from None
    except (ValueError, MemoryError) as error:
        raise ParseError(f"{what} cannot be parsed: {type(error).__name__}") from None


def parse(source: str) -> Operator:
    """Read DSL source and return its operator or branching kernel (the one bound to ``op``, or the
    only one). A tensor bound to a name must be read again: a branch that is never joined into the
    result is an error, not silently dropped.

    Raises :class:`~kdsl.lang.errors.ParseError` (or another ``KdslError`` naming the dim or
    size) for anything that is not a valid kdsl program. Never executes the source.
    """
    tree = _syntax_tree(source, "DSL source")
    interpreter = _Interpreter(source)
    try:
        interpreter.run(tree)
    except RecursionError:
        raise ParseError("the program is nested too deeply") from None
    operators = [name for name in interpreter.order if isinstance(interpreter.env[name], Operator)]
    dangling = [
        name
        for name in interpreter.order
        if isinstance(interpreter.env[name], (Builder, Tensor)) and name not in interpreter.read
    ]
    unread = [
        name
        for name in interpreter.order
        if isinstance(interpreter.env[name], Input)
        and interpreter.env[name].name is not None
        and name not in interpreter.read
    ]
    if unread and operators:
        raise ParseError(
            f"the input {unread[0]} = {interpreter.env[unread[0]]!r:.200} is never used: join it into the result "
            f"or leave it out"
        )
    if dangling and operators:
        raise ParseError(
            f"the tensor {dangling[0]} = {interpreter.env[dangling[0]]!r:.200} is never used: a branch must be "
            f"joined into the result (Blend, Product, +, -, *) or left out"
        )
    if "op" in operators:
        return interpreter.env["op"]
    if "op" in interpreter.env:
        kind = type(interpreter.env["op"]).__name__
        raise ParseError(f"`op` is bound to a {kind}, not an operator; end it with >> Output(...)")
    if len(operators) == 1:
        return interpreter.env[operators[0]]
    if not operators:
        unfinished = [n for n in interpreter.order if isinstance(interpreter.env[n], (Builder, Tensor))]
        hint = f" ({unfinished[0]} is missing its >> Output(...))" if unfinished else ""
        raise ParseError("the program defines no operator; end it with `op = Input(...) >> ... >> Output(...)`" + hint)
    raise ParseError(f"the program defines several operators ({', '.join(operators)}); bind the one you mean to `op`")


def parse_size(text: str, variables: Mapping[str, str]) -> Size:
    """Read a size expression such as ``Cout/(G*s)``; ``variables`` maps each name to its kind.

    >>> str(parse_size("Cout/(G*s)", {"Cout": "primary", "G": "coefficient", "s": "coefficient"}))
    'Cout/(G*s)'
    """
    if not isinstance(text, str) or len(text) > 1000:
        raise ParseError(f"a size must be a short string, got {text!r:.80}")
    # Fast path for the commonest sizes, one variable: from_json reads one size per dim, and
    # ast.parse costs more than the rest of reading a dim. The result is what the slow path gives.
    kind = variables.get(text)
    if kind in KINDS:
        return Size.variable(text, kind)  # type: ignore[arg-type]
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            tree = ast.parse(text, mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        raise ParseError(f"cannot read the size {text!r}") from None
    interpreter = _Interpreter(text)
    # Only the variables the text mentions are made: from_json reads every size of an operator
    # against all its variables, and making all of them each time was quadratic.
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and node.id in variables and node.id not in interpreter.env:
            kind = variables[node.id]
            if kind not in KINDS:
                raise ParseError(f"variable {node.id!r} has the unknown kind {kind!r}")
            interpreter.env[node.id] = Size.variable(node.id, kind)
    try:
        value = interpreter._evaluate(tree.body)
    except RecursionError:
        raise ParseError(f"the size {text!r} is nested too deeply") from None
    if isinstance(value, bool) or not isinstance(value, (Size, int, Fraction)):
        raise ParseError(f"{text!r} is not a size")
    return Size.of(value)
