"""The Python package's layout (DESIGN.md): the core imports and reads without the frameworks,
each adapter names the extra it needs, no import circle between the package's modules, and no
module or class past the size the design allows."""
import ast
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
PKG = os.path.join(HERE, "..", "..", "python", "ferry")

# a meta path finder that refuses the named modules (and their submodules), as if not installed
_BLOCK = r'''
import sys
class _Block:
    def __init__(self, names):
        self.names = [n for n in names.split(",") if n]
    def find_spec(self, name, path=None, target=None):
        for b in self.names:
            if name == b or name.startswith(b + "."):
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None
sys.meta_path.insert(0, _Block(sys.argv[1]))
'''


def _run(blocked, code, tmp_path):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([os.path.join(HERE, "..", "..", "python")] +
                                        [p for p in [env.get("PYTHONPATH")] if p])
    return subprocess.run([sys.executable, "-c", _BLOCK + code, ",".join(blocked)], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=300)


def test_the_core_imports_and_reads_without_torch_xarray_or_cupy(tmp_path):
    r = _run(["torch", "xarray", "cupy"], r'''
import numpy as np, ferry
np.save("x.npy", np.arange(12.0).reshape(3, 4))
assert (ferry.read("x.npy") == np.arange(12.0).reshape(3, 4)).all()
import ferry.checkpoint                     # imports torch only when it saves or loads
left = [m for m in ("torch", "xarray", "cupy") if m in sys.modules]
assert not left, left
print("ok")
''', tmp_path)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr


@pytest.mark.parametrize("module, blocked, extra", [
    ("ferry.torch", ["torch"], "ferry-io[torch]"),
    ("ferry.xarray", ["xarray"], "ferry-io[xarray]"),
    ("ferry.dali", ["nvidia.dali", "nvidia"], "ferry-io[dali]"),
])
def test_an_adapter_without_its_framework_names_the_extra(module, blocked, extra, tmp_path):
    r = _run(blocked, f'''
try:
    import {module}
except ImportError as e:
    print(e)
else:
    print("imported")
''', tmp_path)
    assert r.returncode == 0, r.stderr
    assert f"pip install {extra}" in r.stdout, r.stdout


def test_the_blocking_hook_blocks(tmp_path):
    """The tests above mean something: the hook does make an installed module unimportable."""
    r = _run(["numpy"], "import numpy", tmp_path)
    assert r.returncode != 0 and "No module named 'numpy'" in r.stderr


def _modules():
    out = {}
    for root, _, files in os.walk(PKG):
        for f in files:
            if f.endswith(".py"):
                p = os.path.join(root, f)
                rel = os.path.relpath(p, os.path.join(PKG, ".."))[:-3].replace(os.sep, ".")
                out[rel[:-len(".__init__")] if rel.endswith(".__init__") else rel] = p
    return out


def _top_level_imports(name, path, mods):
    """Package modules that `name` imports when it is imported (module level, not inside
    functions): relative and absolute `ferry...` imports, `from X import Y` naming a submodule."""
    tree = ast.parse(open(path).read())
    pkg = name if path.endswith("__init__.py") else name.rpartition(".")[0]
    found = set()
    nodes = list(tree.body)
    while nodes:
        n = nodes.pop()
        if isinstance(n, ast.If) and "TYPE_CHECKING" in ast.unparse(n.test):
            continue                # for type checkers only
        if isinstance(n, (ast.If, ast.Try)):
            nodes += n.body + n.orelse + getattr(n, "finalbody", []) + \
                [s for h in getattr(n, "handlers", []) for s in h.body]
            continue
        if isinstance(n, ast.Import):
            bases = [a.name for a in n.names]
            froms = []
        elif isinstance(n, ast.ImportFrom):
            if n.level:
                base = pkg
                for _ in range(n.level - 1):
                    base = base.rpartition(".")[0]
                base = base + ("." + n.module if n.module else "")
            else:
                base = n.module or ""
            bases = [base]
            froms = [base + "." + a.name for a in n.names]
        else:
            continue
        for b in bases + froms:
            if b in mods and b != name:
                found.add(b)
    return found


def _circle(graph):
    """An import circle in {module: modules it imports} as a list, or None."""
    state = {}

    def visit(m, stack):
        state[m] = 1
        for d in sorted(graph[m]):
            if d.startswith(m + "."):
                continue            # a package importing its own submodules: not a circle
            if state.get(d) == 1:
                if not m.startswith(d + "."):   # a submodule importing its parent: already loaded
                    return stack[stack.index(d):] + [d]
            elif d not in state:
                c = visit(d, stack + [d])
                if c:
                    return c
        state[m] = 2
        return None

    for m in sorted(graph):
        if m not in state:
            c = visit(m, [m])
            if c:
                return c
    return None


def test_no_import_circle():
    mods = _modules()
    graph = {m: _top_level_imports(m, p, mods) for m, p in mods.items()}
    assert {"ferry.torch.groups", "ferry.torch.state"} <= graph["ferry.torch.stream"]
    assert "ferry.xarray.store" in graph["ferry.xarray.backend"]
    assert _circle(graph) is None, " -> ".join(_circle(graph))


def test_the_circle_check_finds_a_circle(tmp_path):
    """The check above can fail: two modules importing each other are a circle."""
    (tmp_path / "a.py").write_text("from . import b\n")
    (tmp_path / "b.py").write_text("from .a import x\n")
    mods = {"p.a": str(tmp_path / "a.py"), "p.b": str(tmp_path / "b.py")}
    assert _top_level_imports("p.a", mods["p.a"], mods) == {"p.b"}
    assert _top_level_imports("p.b", mods["p.b"], mods) == {"p.a"}
    assert _circle({m: _top_level_imports(m, p, mods) for m, p in mods.items()}) == ["p.a", "p.b", "p.a"]
    assert _circle({"p": {"p.a"}, "p.a": {"p"}}) is None      # a package and its submodule


def test_no_module_over_800_lines_no_class_over_400():
    big = []
    for name, p in sorted(_modules().items()):
        text = open(p).read()
        n = text.count("\n")
        if n > 800:
            big.append(f"{name}: {n} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ClassDef) and node.end_lineno - node.lineno + 1 > 400:
                big.append(f"{name}.{node.name}: {node.end_lineno - node.lineno + 1} lines")
    assert not big, big
