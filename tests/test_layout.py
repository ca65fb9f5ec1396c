"""The architecture as the tree shows it: packages depend downward only, no import circles (lazy
imports included), no project file imports a test helper, the import paths users rely on keep working."""

from __future__ import annotations

import ast
import importlib
import io
import sys
import tokenize
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("common", "tasks", "retriever", "reader", "atlas")
ATLAS_CORE = (
    "atlas.config",
    "atlas.model",
    "atlas.assembly",
    "atlas.run_index",
    "atlas.evaluate",
    "atlas.distributed",
    "atlas.index_api",
    "atlas.quiet",
    "atlas.loading",
    "atlas.real_size",
)
# The Python API (`atlas.Atlas`) sits on training (it fine-tunes with the recipe) and under every front end,
# which calls it; loading is core, below training, which loads through it too.
PYTHON_API = ("atlas.api",)
FRONT_ENDS = ("atlas.cli", "atlas.serve", "atlas.demo", "atlas.importing", "atlas.__main__")
# the floors of atlas/, bottom up: every module of it stands on one, so that a new one is placed on purpose
FLOORS = {"knnlm": ("atlas.knnlm",), "core": ATLAS_CORE, "training": ("atlas.training",), "api": PYTHON_API}
FLOORS["front ends"] = FRONT_ENDS

# (who, what it must not import): `who` and `what` are module names or prefixes of them
FORBIDDEN = [
    ("common", ("tasks", "retriever", "reader", "atlas")),
    ("tasks", ("retriever", "reader", "atlas")),
    ("retriever", ("reader", "atlas")),
    ("reader", ("retriever", "atlas")),
    # the index engine stores and searches vectors: it takes a retriever object, never the modules that make one
    ("retriever.index", ("retriever.encoder", "retriever.losses", "retriever.retrieval_eval")),
    ("atlas.knnlm", ("atlas.config", "atlas.model", "atlas.assembly", "atlas.evaluate", "atlas.training", *FRONT_ENDS)),
    *[(core, ("atlas.training", *FRONT_ENDS)) for core in ATLAS_CORE],
    ("atlas.training", (*PYTHON_API, *FRONT_ENDS)),
    *[(api, FRONT_ENDS) for api in PYTHON_API],
]


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _within(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def project_imports() -> dict[str, set[str]]:
    """Every project module → the project modules it imports anywhere in its body (lazy imports too)."""
    modules = {_module_name(p): p for package in PACKAGES for p in (ROOT / package).rglob("*.py")}
    return {name: _imports_of(path, set(modules)) for name, path in modules.items()}


def _imports_of(path: Path, modules: set[str]) -> set[str]:
    """The modules a file imports anywhere in its body; `from a import b` counts as module a.b when
    `modules` has one, else as a."""
    imported = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                imported.add(f"{node.module}.{alias.name}" if f"{node.module}.{alias.name}" in modules else node.module)
        elif isinstance(node, ast.Import):
            imported.update(alias.name for alias in node.names)
    return imported


GRAPH = project_imports()


def test_the_parser_sees_the_whole_project():
    assert {"atlas.model", "atlas.training.loop", "atlas.cli", "reader.fid", "retriever.index", "tasks.base"} <= set(
        GRAPH
    )


def test_every_module_of_atlas_stands_on_one_floor():
    floors_of = {
        module: [floor for floor, prefixes in FLOORS.items() if any(_within(module, p) for p in prefixes)]
        for module in GRAPH
        if _within(module, "atlas") and module != "atlas"
    }
    assert {module: floors for module, floors in floors_of.items() if len(floors) != 1} == {}


@pytest.mark.parametrize(("who", "forbidden"), FORBIDDEN, ids=[w for w, _ in FORBIDDEN])
def test_packages_depend_downward_only(who, forbidden):
    offending = sorted(
        f"{module} imports {target}"
        for module, targets in GRAPH.items()
        if _within(module, who)
        for target in targets
        if any(_within(target, f) for f in forbidden)
    )
    assert offending == []


def test_every_project_import_names_an_existing_module():
    # lazy imports inside functions are not run by the suite's import of a module: a moved module
    # would otherwise be found only when that function runs (bench/ scripts included)
    benches = {f"bench.{p.stem}": p for p in (ROOT / "bench").glob("*.py")}
    importers = {**GRAPH, **{name: _imports_of(path, set(GRAPH)) for name, path in benches.items()}}
    missing = sorted(
        f"{module} imports {target}"
        for module, targets in importers.items()
        for target in targets
        if target.split(".")[0] in PACKAGES and target not in GRAPH
    )
    assert missing == []


def test_only_the_entry_point_imports_the_command_line():
    # the command line is a caller of the library: nothing else (the benches included) reaches into it
    benches = {f"bench.{p.stem}": _imports_of(p, set(GRAPH)) for p in (ROOT / "bench").glob("*.py")}
    importers = sorted(
        m
        for m, targets in {**GRAPH, **benches}.items()
        if not _within(m, "atlas.cli") and any(_within(t, "atlas.cli") for t in targets)
    )
    assert importers == ["atlas.__main__"]


def test_no_project_file_imports_a_test_helper():
    assert (
        sorted(m for m, targets in GRAPH.items() if any(_within(t, "tests") or _within(t, "conftest") for t in targets))
        == []
    )


def test_no_import_circles():
    local = {m: {t for t in targets if t in GRAPH and t != m} for m, targets in GRAPH.items()}
    # a module that imports `pkg.sub` also imports `pkg` (its __init__) first
    for module, targets in local.items():
        targets.update(
            p for t in list(targets) for p in _parents(t) if p in local and p != module and not _within(module, p)
        )
    index, low, stack, on_stack, circles, counter = {}, {}, [], set(), [], [0]

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(local[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for module in sorted(local):
        if module not in index:
            visit(module)
    assert circles == []


def _parents(name: str) -> list[str]:
    parts = name.split(".")
    return [".".join(parts[:n]) for n in range(1, len(parts))]


def test_a_circle_is_found_when_there_is_one(monkeypatch):
    # the check above must be able to fail: give it a graph with a circle through a lazy import
    rerank = "retriever.index.rerank"
    monkeypatch.setitem(GRAPH, rerank, GRAPH[rerank] | {"retriever.index.passage_index"})
    with pytest.raises(AssertionError):
        test_no_import_circles()


@pytest.mark.parametrize(
    "package",
    [
        "atlas",
        "atlas.cli",
        "atlas.training",
        "atlas.knnlm",
        "atlas.serve",
        "atlas.importing",
        "atlas.demo",
        "reader",
        "retriever",
        "tasks",
        "common",
    ],
)
def test_each_package_says_what_lives_there(package):
    doc = importlib.import_module(package).__doc__
    assert doc and len(doc.strip().splitlines()) >= 2


@pytest.mark.parametrize(
    ("module", "name"),
    [
        ("atlas", "Atlas"),
        ("atlas", "Index"),
        ("atlas", "Answer"),
        ("atlas.model", "AtlasModel"),
        ("reader.fid", "FiDReader"),
        ("retriever.index", "PassageIndex"),
        ("retriever.index", "EncoderMismatchError"),
    ],
)
def test_import_paths_users_rely_on_keep_working(module, name):
    assert isinstance(getattr(importlib.import_module(module), name), type)


def _module_constants(path: Path) -> set[str]:
    return {
        target.id
        for node in ast.parse(path.read_text()).body
        if isinstance(node, ast.Assign)
        for target in node.targets
        if isinstance(target, ast.Name)
    }


@pytest.mark.parametrize("constant", ["IGNORE_INDEX", "BERT_FAMILY", "MINILM"])
def test_shared_constants_are_defined_once(constant):
    # retriever and reader may not import each other: what both need lives once, in common/modeling.py
    defining = sorted(
        str(p.relative_to(ROOT))
        for package in PACKAGES
        for p in (ROOT / package).rglob("*.py")
        if constant in _module_constants(p)
    )
    assert defining == ["common/modeling.py"]


def test_a_task_is_named_once_by_its_registration():
    named_twice = sorted(
        f"{p.name}:{node.name}"
        for p in (ROOT / "tasks").rglob("*.py")
        for node in ast.walk(ast.parse(p.read_text()))
        if isinstance(node, ast.ClassDef)
        and any(isinstance(d, ast.Call) and getattr(d.func, "id", "") == "register_task" for d in node.decorator_list)
        and "name"
        in {t.id for s in node.body if isinstance(s, ast.Assign) for t in s.targets if isinstance(t, ast.Name)}
    )
    assert named_twice == []


def _long_functions_without_a_reason(limit: int = 80) -> list[str]:
    """Library functions over `limit` lines whose body does not open with a `# long: why` comment."""
    found = []
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            source = path.read_text()
            lines = source.splitlines()
            for node in ast.walk(ast.parse(source)):
                if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    continue
                if node.end_lineno - node.lineno + 1 <= limit:
                    continue
                body = node.body
                docstring = isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant)
                first = body[1] if docstring and len(body) > 1 else body[0]
                top = lines[(body[0].end_lineno if docstring else node.lineno) : first.lineno]
                if not any(line.strip().startswith("# long: ") for line in top):
                    found.append(f"{path.relative_to(ROOT)}:{node.name} ({node.end_lineno - node.lineno + 1} lines)")
    return sorted(found)


def test_no_library_function_is_long_without_a_reason_at_its_top():
    # a function reads top to bottom in one screen or two; a longer one says why at its top
    assert _long_functions_without_a_reason() == []


def test_the_length_check_finds_a_long_function(tmp_path, monkeypatch):
    """The check above can fail: a 90-line function without the comment is reported, with it it is not."""
    package = tmp_path / "tasks"
    package.mkdir()
    body = "".join(f"    x{i} = {i}\n" for i in range(90))
    (package / "long.py").write_text(f'def long():\n    """Doc."""\n{body}')
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    assert _long_functions_without_a_reason() == ["tasks/long.py:long (92 lines)"]
    (package / "long.py").write_text(f'def long():\n    """Doc."""\n    # long: a reason\n{body}')
    assert _long_functions_without_a_reason() == []


def _local_imports_without_a_reason() -> list[str]:
    """Imports inside library functions with no comment on their line or the line above (a run of imports
    shares the comment of its first), in a module whose first 30 lines have no `# Lazy imports:` comment."""
    found = []
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            source = path.read_text()
            if any(line.startswith("# Lazy imports:") for line in source.splitlines()[:30]):
                continue
            commented = {
                token.start[0]
                for token in tokenize.generate_tokens(io.StringIO(source).readline)
                if token.type == tokenize.COMMENT
            }
            for node in ast.walk(ast.parse(source)):
                if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    continue
                blocks = [getattr(n, f, None) for n in ast.walk(node) for f in ("body", "orelse", "finalbody")]
                for body in (b for b in blocks if isinstance(b, list)):
                    for i, statement in enumerate(body):
                        if not isinstance(statement, (ast.Import, ast.ImportFrom)):
                            continue
                        first = i
                        while first > 0 and isinstance(body[first - 1], (ast.Import, ast.ImportFrom)):
                            first -= 1
                        if not commented & set(range(body[first].lineno - 1, statement.end_lineno + 1)):
                            found.append(f"{path.relative_to(ROOT)}:{statement.lineno}")
    return sorted(set(found))


def test_every_local_import_says_why():
    # an import inside a function is for a heavy or optional dependency, or against an import circle:
    # a comment beside it says which (or, for a command-line module, one `# Lazy imports:` comment at its top)
    assert _local_imports_without_a_reason() == []


def test_the_local_import_check_finds_an_unexplained_import(tmp_path, monkeypatch):
    """The check above can fail: a local import without a comment is reported; with one, or with the
    module's `# Lazy imports:` comment, it is not."""
    package = tmp_path / "tasks"
    package.mkdir()
    (package / "lazy.py").write_text('"""Doc."""\n\n\ndef lazy():\n    import json\n\n    return json\n')
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    assert _local_imports_without_a_reason() == ["tasks/lazy.py:5"]
    (package / "lazy.py").write_text(
        '"""Doc."""\n\n\ndef lazy():\n    import json  # heavy: a reason\n\n    return json\n'
    )
    assert _local_imports_without_a_reason() == []
    (package / "lazy.py").write_text(
        '"""Doc."""\n\n# Lazy imports: a reason\n\n\ndef lazy():\n    import json\n\n    return json\n'
    )
    assert _local_imports_without_a_reason() == []


def _manifest_key_reads(paths: list[Path]) -> list[str]:
    """`FILE:LINE` of each subscript with a string key, and each `.get("key")`, on an object named `manifest` (a
    name, or an attribute such as `index.manifest`)."""

    def is_manifest(node: ast.AST) -> bool:
        return (isinstance(node, ast.Name) and node.id == "manifest") or (
            isinstance(node, ast.Attribute) and node.attr == "manifest"
        )

    def is_key(node: ast.AST) -> bool:
        return isinstance(node, ast.Constant) and isinstance(node.value, str)

    found = []
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            subscript = isinstance(node, ast.Subscript) and is_manifest(node.value) and is_key(node.slice)
            get = (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "get"
                and is_manifest(node.func.value)
                and bool(node.args)
                and is_key(node.args[0])
            )
            if subscript or get:
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    return sorted(found)


def test_only_the_manifest_module_reads_manifest_keys():
    # a file format has one owner: the index's manifest keys are known to retriever/index/manifest.py alone (and
    # each other manifest is a typed record of its own); everything else reads a `Manifest`'s attributes
    owner = ROOT / "retriever" / "index" / "manifest.py"
    paths = [p for package in (*PACKAGES, "bench") for p in (ROOT / package).rglob("*.py") if p != owner]
    assert _manifest_key_reads(paths) == []


def test_the_manifest_key_check_finds_a_key_read(tmp_path, monkeypatch):
    """The check above can fail: a subscript or a `.get` of a key on a manifest is reported."""
    (tmp_path / "reads.py").write_text(
        'n = index.manifest["count"]\nspec = manifest.get("spec")\nok = manifest.count + other["count"]\n'
    )
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    assert _manifest_key_reads([tmp_path / "reads.py"]) == ["reads.py:1", "reads.py:2"]


def test_no_two_library_modules_share_a_file_name():
    # a file name says what its module holds and is used once (`__init__.py` and `__main__.py` aside), so that a
    # name in a traceback, an import or a review points at one file
    paths = [p for package in PACKAGES for p in (ROOT / package).rglob("*.py") if not p.name.startswith("__")]
    by_name: dict[str, list[str]] = {}
    for path in paths:
        by_name.setdefault(path.name, []).append(str(path.relative_to(ROOT)))
    assert {name: where for name, where in by_name.items() if len(where) > 1} == {}
