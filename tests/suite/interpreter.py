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
"""

import inspect
import os
import sys

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
