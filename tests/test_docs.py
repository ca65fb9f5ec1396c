"""Docs that cannot rot: the guides' ```bash blocks run, and every `atlas` flag the docs name exists.

A guide marks a block as runnable by fencing it ```bash; ```console blocks show commands on the
reader's own files and are only checked for their flags. Each guide's runnable blocks run in order,
in a fresh folder that holds the repository's `atlas/` and `configs/` (so that paths read as they do
from the repository's root), with this environment's `atlas` first on the PATH.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = sorted([*(ROOT / "docs").rglob("*.md"), ROOT / "README.md"])
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.MULTILINE | re.DOTALL)


def blocks(page: Path, languages: tuple[str, ...]) -> list[str]:
    """The code blocks of `page` fenced with one of `languages`, in order."""
    return [body for language, body in FENCE.findall(page.read_text()) if language in languages]


RUNNABLE = [page for page in PAGES if page.name != "README.md" and blocks(page, ("bash",))]
# Guides whose blocks start many `atlas` processes (each importing torch): the slow tier runs them; the fast tier
# checks their command lines against the parser (`test_every_atlas_flag_in_the_docs_exists`)
SLOW_GUIDES = {"corpus.md", "evaluate.md", "own-data.md", "python-api.md"}


@pytest.mark.parametrize(
    "page",
    [pytest.param(page, marks=pytest.mark.slow) if page.name in SLOW_GUIDES else page for page in RUNNABLE],
    ids=[str(p.relative_to(ROOT)) for p in RUNNABLE],
)
def test_the_runnable_blocks_of_a_guide_run(page, tmp_path):
    for name in ("atlas", "configs"):
        (tmp_path / name).symlink_to(ROOT / name)
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
    }
    for number, block in enumerate(blocks(page, ("bash",)), 1):
        done = subprocess.run(
            ["bash", "-e", "-o", "pipefail", "-c", block],
            check=False,
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert done.returncode == 0, (
            f"{page.name}, runnable block {number} failed:\n{block}\n"
            f"--- stdout\n{done.stdout[-3000:]}\n--- stderr\n{done.stderr[-3000:]}"
        )


def _commands(text: str) -> list[list[str]]:
    """`atlas …` command lines of a shell block (continuation lines joined, comments dropped)."""
    lines, commands = text.replace("\\\n", " ").splitlines(), []
    for line in lines:
        line = line.split(" #", 1)[0].strip().lstrip("!").strip()
        if line.startswith("atlas "):
            try:
                commands.append(shlex.split(line))
            except ValueError:  # an unbalanced quote in prose-like lines: nothing to check
                continue
    return commands


def _flags_of(parser) -> set[str]:
    return {flag for action in parser._actions for flag in action.option_strings}


def _subparsers(parser) -> dict:
    import argparse

    return next((a.choices for a in parser._actions if isinstance(a, argparse._SubParsersAction)), {})


def test_every_atlas_flag_in_the_docs_exists():
    from atlas.cli import build_parser

    root, missing, checked = build_parser(), [], 0
    for page in PAGES:
        for block in blocks(page, ("bash", "console", "sh", "")):
            for words in _commands(block):
                parser, path = root, ["atlas"]
                for word in words[1:]:
                    if word in _subparsers(parser):
                        parser = _subparsers(parser)[word]
                        path.append(word)
                    else:
                        break
                if len(path) == 1:
                    continue
                for word in words[1:]:
                    flag = word.split("=", 1)[0]
                    if flag.startswith("--") and flag != "--verbose":
                        checked += 1
                        if flag not in _flags_of(parser):
                            missing.append(f"{page.relative_to(ROOT)}: {' '.join(path)} {flag}")
    assert checked > 20 and missing == []


def _generator(name: str):
    """A module of docs/_gen/ (the docs build's generators), imported by path."""
    import importlib

    sys.path.insert(0, str(ROOT / "docs" / "_gen"))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(str(ROOT / "docs" / "_gen"))


def test_every_recipe_key_has_a_description():
    missing = _generator("reference").missing_descriptions()
    assert missing == [], (
        "recipe keys without a description: give each a comment beside its field in atlas/config.py (an index "
        f"build setting: its help in retriever/index/settings.py): {missing}"
    )


def test_the_generated_references_kept_in_git_are_current():
    """The site regenerates them at every build; the copies under docs/reference/ must say the same."""
    stale = [
        uri
        for uri, text in _generator("reference").generated_pages().items()
        if not (ROOT / "docs" / uri).is_file() or (ROOT / "docs" / uri).read_text(encoding="utf-8") != text
    ]
    assert stale == [], f"out of date: {stale}; renew them with `python docs/_gen/reference.py --write`"


def test_every_figure_the_results_pages_show_is_drawn_from_data():
    figures = _generator("figures")
    shown = {
        match
        for page in (ROOT / "docs").rglob("*.md")
        for match in re.findall(r"\]\((?:\.\./)*(?:results/)?img/([\w-]+)\.svg\)", page.read_text())
    }
    assert shown and shown <= set(figures.FIGURES), f"figures with no drawing function: {shown - set(figures.FIGURES)}"
    for name in shown:
        assert (ROOT / "docs" / "results" / "img" / f"{name}.svg").is_file(), (
            "renew with docs/_gen/reference.py --write"
        )


def test_the_mermaid_diagrams_are_drawn_offline_by_the_mermaid_the_site_ships():
    """Material loads mermaid.js from unpkg.com unless the page already defines a global `mermaid`:
    offline, every ```mermaid diagram would show as its source. The site ships mermaid itself (mkdocs.yml's
    extra_javascript); each page's diagrams must reach Material as <pre class="mermaid"> and be of a kind the
    shipped build draws."""
    import glob
    import html
    import importlib

    import markdown
    import material
    import yaml

    class Loader(yaml.SafeLoader):
        pass

    def python_name(loader, suffix, node):
        module, _, attribute = suffix.rpartition(".")
        return getattr(importlib.import_module(module), attribute)

    Loader.add_multi_constructor("tag:yaml.org,2002:python/name:", python_name)
    Loader.add_multi_constructor("!", lambda loader, suffix, node: None)  # !ENV, !relative: not needed here
    config = yaml.load((ROOT / "mkdocs.yml").read_text(), Loader=Loader)
    docs = ROOT / config.get("docs_dir", "docs")

    # Material's own loader: the global it uses when defined, and the major version of mermaid it expects
    (bundle,) = glob.glob(str(Path(material.__file__).parent / "templates/assets/javascripts/bundle.*.min.js"))
    bundle = Path(bundle).read_text(encoding="utf-8")
    assert 'typeof mermaid=="undefined"' in bundle, (
        "this Material no longer takes a global `mermaid` when one is defined: check how it loads mermaid now"
    )
    major = re.search(r"unpkg\.com/mermaid@(\d+)", bundle).group(1)

    # a script that runs before DOMContentLoaded (when Material draws the diagrams) and defines `mermaid`
    shipped = []
    for entry in config.get("extra_javascript", []):
        path = entry if isinstance(entry, str) else entry.get("path", "")
        attributes = {} if isinstance(entry, str) else entry
        script = docs / path
        if "://" in path or not script.is_file():
            continue
        text = script.read_text(encoding="utf-8")
        if re.search(r"""globalThis\[?["'.]?mermaid["']?\]?\s*=""", text[-2000:]):
            assert not (attributes.get("async") or attributes.get("defer") or attributes.get("type") == "module"), (
                f"{path} must be a plain script, run before Material looks for `mermaid`"
            )
            shipped.append((path, text))
    assert len(shipped) == 1, "mkdocs.yml's extra_javascript must list one local copy of mermaid (a file under docs/)"
    path, text = shipped[0]
    version = re.search(r'\{version:"((\d+)\.\d+\.\d+[^"]*)"\}', text)  # what mermaid's getVersion() returns
    assert version and version.group(2) == major, f"{path}: mermaid {major}.x expected by Material, not {version}"

    # each diagram of the pages, converted as the site converts it, and of a kind the shipped mermaid draws
    extensions, extension_configs = [], {}
    for item in config["markdown_extensions"]:
        name, options = next(iter(item.items())) if isinstance(item, dict) else (item, None)
        extensions.append(name)
        extension_configs[name] = options or {}
    diagrams = 0
    for page in sorted(docs.rglob("*.md")):
        for source in blocks(page, ("mermaid",)):
            diagrams += 1
            converted = markdown.Markdown(extensions=extensions, extension_configs=extension_configs).convert(
                f"```mermaid\n{source}```\n"
            )
            drawn = re.fullmatch(r'<pre class="([^"]*)"><code>(.*)</code></pre>', converted, re.DOTALL)
            assert drawn and "mermaid" in drawn.group(1).split(), (
                f'{page.relative_to(ROOT)}: a ```mermaid fence must become <pre class="mermaid"> (what Material '
                f"draws; pymdownx.superfences' custom_fences with fence_code_format), not {converted[:120]!r}"
            )
            assert html.unescape(drawn.group(2)).strip() == source.strip()
            kind = source.split()[0]
            detected = re.search(r"/\^\\s\*" + re.escape(kind) + r"\b", text) is not None  # its detector
            assert detected, (
                f"{page.relative_to(ROOT)}: the mermaid the site ships ({path}) does not draw `{kind}` diagrams"
            )
    assert diagrams > 0
