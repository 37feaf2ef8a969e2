"""The kernel is a few components with one job each, not one large class.

``Kernel`` (``_kernel/_runtime.py``) holds its components -- ``AddressBook``,
``SendPath``, ``InboundServer``, ``ChildWatch`` -- and each component that
calls back into the kernel names what it calls in a ``typing.Protocol`` (its
owner protocol), which mypy checks ``Kernel`` against (tests/launch/test_types.py).
These tests pin the shape: no class of ``_kernel`` grows past
:data:`MAX_CLASS_LINES` code lines, the kernel's per-message methods stay
small enough to read (:data:`MAX_COMPLEXITY`), each component keeps its own
state and reaches the kernel only through a Protocol, and the kernel's
attributes the layers above read still answer.
"""

from __future__ import annotations

import ast
import inspect
import pathlib
import typing

import pytest

import monarch_core._kernel as kernel_pkg
from monarch_core._kernel import _accept, _addresses, _runtime, _sending
from monarch_core._kernel._runtime import Kernel
from monarch_core._plugins import registry

KERNEL_DIR = pathlib.Path(kernel_pkg.__file__).parent
#: Code lines (no blank lines, comments or docstrings) a class of ``_kernel`` may have.
MAX_CLASS_LINES = 350
#: Cyclomatic complexity a function of the kernel's own modules may have.
MAX_COMPLEXITY = 15
#: The modules the kernel's split made (another engineer owns ``_outbound``, ``_inbound``, ...).
SPLIT_MODULES = (_runtime, _sending, _accept, _addresses)


def _docstring_lines(tree: ast.AST) -> set[int]:
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) \
                    and isinstance(first.value.value, str):
                lines.update(range(first.lineno, (first.end_lineno or first.lineno) + 1))
    return lines


def _class_sizes(path: pathlib.Path) -> dict[str, int]:
    src = path.read_text()
    text = src.splitlines()
    tree = ast.parse(src)
    docs = _docstring_lines(tree)
    sizes = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            sizes[f"{path.name}:{node.name}"] = sum(
                1 for i in range(node.lineno, (node.end_lineno or node.lineno) + 1)
                if text[i - 1].strip() and not text[i - 1].strip().startswith("#") and i not in docs
            )
    return sizes


def _complexity(fn: ast.AST) -> int:
    n = 1
    for node in ast.walk(fn):
        if isinstance(node, (ast.If, ast.IfExp, ast.For, ast.AsyncFor, ast.While, ast.ExceptHandler,
                             ast.Assert, ast.comprehension, ast.match_case)):
            n += 1
        elif isinstance(node, ast.BoolOp):
            n += len(node.values) - 1
    return n


def test_no_class_of_the_kernel_package_exceeds_the_size_limit() -> None:
    sizes: dict[str, int] = {}
    for path in sorted(KERNEL_DIR.glob("*.py")):
        sizes.update(_class_sizes(path))
    assert "_runtime.py:Kernel" in sizes, sorted(sizes)
    big = {name: n for name, n in sizes.items() if n > MAX_CLASS_LINES}
    assert not big, (f"classes over {MAX_CLASS_LINES} code lines: {big}; split the class into components "
                     "it holds (see docs/architecture.md, the kernel's rows)")


@pytest.mark.parametrize("module", SPLIT_MODULES, ids=lambda m: m.__name__.rsplit(".", 1)[1])
def test_the_kernel_methods_stay_below_the_complexity_limit(module: typing.Any) -> None:
    tree = ast.parse(pathlib.Path(module.__file__).read_text())
    found = {}
    for cls in [tree, *[n for n in tree.body if isinstance(n, ast.ClassDef)]]:
        for fn in getattr(cls, "body", []):
            if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                found[f"{getattr(cls, 'name', '')}.{fn.name}"] = _complexity(fn)
    assert "Kernel.send" in found or module is not _runtime
    over = {name: cc for name, cc in found.items() if cc > MAX_COMPLEXITY}
    assert not over, f"cyclomatic complexity over {MAX_COMPLEXITY}: {over}; extract the cold branches"


@pytest.mark.parametrize(
    ("component", "owner_protocol"),
    [(_sending.SendPath, _sending.SendOwner), (_accept.InboundServer, _accept.AcceptOwner)],
)
def test_each_component_reaches_its_owner_through_a_protocol(component: type, owner_protocol: type) -> None:
    hints = typing.get_type_hints(component.__init__)
    assert hints["owner"] is owner_protocol
    assert getattr(owner_protocol, "_is_protocol", False), f"{owner_protocol.__name__} is not a typing.Protocol"
    assert not issubclass(Kernel, component) and not issubclass(component, Kernel)  # held, not inherited


def test_the_kernel_holds_one_of_each_component_and_keeps_the_attributes_other_layers_read() -> None:
    k = Kernel(proc_id="k", name="k", transport=registry().transport("ipc"), bind_spec="ipc://unused")
    assert isinstance(k._book, _addresses.AddressBook)
    assert isinstance(k._sender, _sending.SendPath)
    assert isinstance(k._server, _accept.InboundServer)
    # state the layers above, the benchmarks and the tests read on the kernel (plain or through a property)
    for name in ("actors", "ports", "dead", "events", "agent", "tree_tables",
                 "proc_id", "address", "delivery_timeout", "send_window_msgs", "send_window_bytes",
                 "_outbound", "_tx", "_windows", "_addresses", "_poller", "_ackers"):
        assert hasattr(k, name), name
    for name in ("send", "route", "route_actor", "call_soon", "start_task", "add_port", "remove_port",
                 "proc_failed", "wait_dead", "learn_address", "expect_proc", "flush", "ack_at_once",
                 "settle_acks", "acks_at_once", "end_session", "inbound_poller", "peers", "last_error",
                 "send_window", "expect_reply", "reply_done", "adopt_child", "children", "transport_for"):
        assert inspect.isroutine(getattr(k, name)), name
    # one state, read through the kernel: what the components hold is what the kernel shows
    k._book.learn("p", "ipc://p")
    assert k._addresses["p"] == "ipc://p"
    assert k._outbound is k._sender.sessions and k._tx is k._sender.tx and k._windows is k._sender.windows
    assert k._ackers is k._server.ackers
