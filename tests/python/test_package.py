"""The package as a type checker and an installer see it: py.typed and the
native module's stub beside it, the stub naming exactly what the module
binds, and every public function and method annotated."""

import ast
import inspect
import os

import pytest

import tessera
from tessera import _tessera

HERE = os.path.dirname(tessera.__file__)


def _stub():
    with open(os.path.join(HERE, "_tessera.pyi")) as f:
        return ast.parse(f.read())


def _public(names):
    return {n for n in names if not n.startswith("_")}


def test_typed_package_files():
    assert os.path.exists(os.path.join(HERE, "py.typed"))
    assert os.path.exists(os.path.join(HERE, "_tessera.pyi"))


def test_stub_names_what_the_module_binds():
    stub = _stub()
    functions = {n.name for n in stub.body if isinstance(n, ast.FunctionDef)}
    classes = {n.name: n for n in stub.body if isinstance(n, ast.ClassDef)}
    bound = _public(dir(_tessera))
    assert functions | set(classes) == bound
    for name, node in classes.items():
        members = {n.name for n in node.body if isinstance(n, ast.FunctionDef)}
        assert _public(members) == _public(dir(getattr(_tessera, name))), name


def _annotated(function, where):
    signature = inspect.signature(function)
    missing = [p.name for p in signature.parameters.values()
               if p.name not in ("self", "cls") and
               p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD) and
               p.annotation is inspect.Parameter.empty]
    assert not missing, f"{where}: parameters without a type: {missing}"
    assert signature.return_annotation is not inspect.Signature.empty, (
        f"{where}: no return type")


def _check_module(module):
    for name in module.__all__:
        value = getattr(module, name)
        if inspect.isfunction(value):
            _annotated(value, f"{module.__name__}.{name}")
        elif inspect.isclass(value) and value.__module__.split(".")[0] == (
                "tessera"):
            if value.__module__ in ("tessera.errors", "tessera._tessera"):
                continue  # exceptions; the native classes have the stub
            for attr, member in vars(value).items():
                if attr.startswith("_") and attr not in ("__init__",):
                    continue
                if isinstance(member, property):
                    member = member.fget
                if inspect.isfunction(member):
                    _annotated(member, f"{value.__name__}.{attr}")


def test_public_api_is_annotated():
    _check_module(tessera)
    _check_module(tessera._tensor)


def test_torch_api_is_annotated():
    pytest.importorskip("torch", reason="torch is not installed")
    import tessera.torch

    _check_module(tessera.torch)
