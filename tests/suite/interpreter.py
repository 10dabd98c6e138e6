"""Triton's interpreter, made cheaper for the suite without changing what it computes.

Every call of a nested `@triton.jit` function inside an interpreted program (the kernels'
helpers, and triton.language's own `tl.sum`, `tl.max`, ...) first patches the language modules
its function's module sees: an `inspect.getmembers` scan of up to four modules, about a third
of the interpreter's time on the suite's kernels, whose helpers run once per tile. Those
patches are never undone (only a launch's own are), so after the first call from a module the
scan finds everything patched and changes nothing. `call_device_functions_directly` keeps the
first scan for each module and skips the rest. It applies only to an interpreter whose device
call has the shape this was written against (Triton 3.9's); any other is left as it is.

The interpreter also maps a Triton type to its NumPy storage type (`_get_np_dtype`) on nearly
every operation, building a table of twenty NumPy types each time: about a tenth of its time on
the suite's kernels. `_remember_numpy_types` keeps each answer: the function depends on its
argument alone.

A reduction with a combine function of its own (the kernels' NaN-propagating max, `_nan_max`)
falls back to a loop in Python over every element, a sixth of the interpreter's time. Where the
combine function's source is exactly that max, `_reduce_nan_max_in_numpy` folds the same
np.maximum along the axis in the same order
(np.maximum.accumulate) for float32: the same values, NaN payloads and signed zeros, as
tests/test_suite_interpreter.py checks against the loop.
"""

import ast
import inspect
import os
import sys
import textwrap

import numpy as np

_settled = False


def call_device_functions_directly() -> bool:
    """Apply the shortcut once Triton's interpreter is imported; True if it is in place.
    Cheap to call before every test: it settles after the first call that finds Triton."""
    global _settled
    if _settled:
        return _applied()
    module = sys.modules.get("triton.runtime.interpreter")
    if module is None or os.environ.get("TRITON_INTERPRET") != "1":
        return False
    _settled = True
    cls = getattr(module, "InterpretedFunction", None)
    error = getattr(module, "InterpreterError", None)
    try:
        source = inspect.getsource(cls.__call__)
    except (AttributeError, OSError, TypeError):
        return False
    if error is None or "_patch_lang(self.fn)" not in source or "self.rewrite()" not in source:
        return False

    original = cls.__call__
    scanned: set[int] = set()  # id() of the module globals whose language modules are patched

    def __call__(self, *args, **kwargs):
        key = id(self.fn.__globals__)
        if key not in scanned:
            scanned.add(key)
            return original(self, *args, **kwargs)
        fn = self.rewrite()
        try:
            return fn(*args, **kwargs)
        except Exception as e:  # as the interpreter reports a failing device function
            raise error(repr(e)) from e

    __call__.direct = True
    cls.__call__ = __call__
    _remember_numpy_types(module)
    _reduce_nan_max_in_numpy(module)
    return True


def _remember_numpy_types(module) -> None:
    """Replace `module._get_np_dtype` (a pure function of a Triton type) by a memo of it."""
    original = getattr(module, "_get_np_dtype", None)
    if original is None or getattr(original, "remembered", False):
        return
    known: dict = {}

    def _get_np_dtype(tt_dtype):
        try:
            return known[tt_dtype]
        except KeyError:
            found = known[tt_dtype] = original(tt_dtype)
            return found
        except TypeError:  # a type that cannot be a key
            return original(tt_dtype)

    _get_np_dtype.remembered = True
    _get_np_dtype.original = original
    module._get_np_dtype = _get_np_dtype


def _applied() -> bool:
    module = sys.modules.get("triton.runtime.interpreter")
    return bool(module) and getattr(module.InterpretedFunction.__call__, "direct", False)


def _is_nan_max(combine_fn) -> bool:
    """Whether a combine function's source is `return tl.maximum(a, b, propagate_nan=
    tl.PropagateNan.ALL)` over its two parameters in order (the kernels' `_nan_max`): decided
    from the source, so an edited body (a planted bug, say) takes the interpreter's own loop."""
    known = _nan_max_verdicts.get(id(combine_fn))
    if known is None:
        try:
            source = inspect.getsource(getattr(combine_fn, "fn", combine_fn))
        except (OSError, TypeError):
            source = None
        # The function is kept with its verdict, so that its id is not reused by another.
        known = _nan_max_verdicts[id(combine_fn)] = (combine_fn, source is not None and _nan_max_shape(source))
    return known[1]


_nan_max_verdicts: dict[int, tuple] = {}


def _nan_max_shape(source: str) -> bool:
    try:
        (fn,) = ast.parse(textwrap.dedent(source)).body
    except (SyntaxError, ValueError):
        return False
    if not isinstance(fn, ast.FunctionDef) or len(fn.body) != 1 or not isinstance(fn.body[0], ast.Return):
        return False
    params = [a.arg for a in fn.args.args]
    expected = f"tl.maximum({', '.join(params)}, propagate_nan=tl.PropagateNan.ALL)"
    return len(params) == 2 and ast.unparse(fn.body[0].value) == expected


def _reduce_nan_max_in_numpy(module) -> None:
    """Reduce with a NaN-propagating max (np.maximum in the interpreter) by folding np.maximum
    along the axis in NumPy, in the order the interpreter's element loop folds it."""
    ops = getattr(module, "ReduceOps", None)
    if ops is None or not hasattr(ops, "generic_reduce") or getattr(ops.apply_impl, "vectorised", False):
        return
    original = ops.apply_impl

    def apply_impl(self, input):
        if len(input) != 1 or self.axis is None or self.keep_dims or not _is_nan_max(self.combine_fn):
            return original(self, input)
        (arg,) = input
        data = arg.handle.data
        if data.dtype != np.float32:
            return original(self, input)
        folded = np.maximum.accumulate(data, axis=self.axis)
        out = np.array(folded.take(data.shape[self.axis] - 1, axis=self.axis))
        # The loop stores every partial result through a Python float, which quiets a signalling
        # NaN (sets its quiet bit, keeps its payload): so does this.
        out.view(np.uint32)[np.isnan(out)] |= np.uint32(0x00400000)
        return [self.to_tensor(out, arg.dtype)]

    apply_impl.vectorised = True
    apply_impl.original = original
    ops.apply_impl = apply_impl
