"""The generated reference pages: the `atlas` command line (from its argparse parser), the recipe keys
(from the config dataclasses, each in the package that owns its section, and the comments beside their fields)
and the HTTP API (from the OpenAPI schema of `atlas serve`).

The docs build calls `generated_pages()` from `hooks.py`, so the site's pages are made from the code at every
build and cannot drift from it; git keeps a copy of each under docs/reference/ for readers of the repository,
and tests/test_docs.py checks that copy is current (`--write` renews it). A config key's description is the
comment above or beside its field in its section's dataclass, else for an index build setting (`index.spec`, …) the help
of its field in `retriever/index/settings.py` (which `atlas index build --help` shows too). `missing_descriptions()`
lists keys with none; tests/test_docs.py asserts there are none.

    python docs/_gen/reference.py --write    # renews docs/reference/{cli,config,http}.md, openapi.json and the figures
    python docs/_gen/reference.py --check    # lists config keys without a description
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import io
import os
import sys
import tokenize
import typing
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).parent))  # figures.py, beside this file
# where each section's dataclass is defined: the component that owns the settings
CONFIG_SOURCES = [
    ROOT / "atlas" / "config.py",
    ROOT / "reader" / "reader_config.py",
    ROOT / "retriever" / "retriever_config.py",
    ROOT / "retriever" / "index" / "settings.py",
]

if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


# ---------------------------------------------------------------------------------------------- the CLI


def _cell(text: str) -> str:
    """Text made safe for one cell of a Markdown table."""
    return " ".join(str(text).split()).replace("|", "\\|")


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _summaries(parser: argparse.ArgumentParser) -> dict[str, str]:
    """The one-line help each subcommand was registered with (`add_parser(name, help=...)`)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return {choice.dest: choice.help or "" for choice in action._choices_actions}
    return {}


def _option_rows(parser: argparse.ArgumentParser) -> list[str]:
    formatter = parser._get_formatter()
    rows = []
    for action in parser._actions:
        if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
            continue
        if action.option_strings:
            name = ", ".join(f"`{flag}`" for flag in action.option_strings)
            if action.nargs != 0:
                name += f" `{formatter._format_args(action, formatter._get_default_metavar_for_optional(action))}`"
        else:
            name = f"`{formatter._format_args(action, formatter._get_default_metavar_for_positional(action))}`"
        help_text = formatter._expand_help(action) if action.help and action.help != argparse.SUPPRESS else ""
        if action.help == argparse.SUPPRESS:
            continue
        default = action.default
        help_text = help_text.removesuffix(f" (default: {default})")
        shown = (
            ""
            if (default in (None, False, argparse.SUPPRESS, []) or not action.option_strings or action.nargs == 0)
            else f"`{default}`"
        )
        rows.append(f"| {name} | {_cell(shown)} | {_cell(help_text)} |")
    return rows


def cli_reference() -> str:
    """The CLI reference page: every command and subcommand with its usage and options."""
    from atlas.cli import build_parser

    root = build_parser()
    out = [
        "# Command line",
        "",
        (
            "Generated from the `atlas` argparse parser at every docs build (`docs/_gen/reference.py`); "
            "`atlas COMMAND --help` prints the same. Every command also takes `--verbose` anywhere on the "
            "line, and commands that load a recipe take dotted `KEY=VALUE` overrides of the "
            "[configuration](config.md)."
        ),
        "",
    ]

    def walk(parser: argparse.ArgumentParser, path: list[str], summary: str) -> None:
        depth = min(len(path), 3)
        if len(path) > 1:
            out.extend([f"{'#' * depth} `{' '.join(path)}`", ""])
            if summary:
                out.extend([_cell(summary), ""])
        if parser.description and (len(path) == 1 or parser.description != summary):
            out.extend([parser.description.strip(), ""])
        out.extend(["```text", parser.format_usage().strip(), "```", ""])
        rows = _option_rows(parser)
        if rows:
            out.extend(["| argument | default | meaning |", "|---|---|---|", *rows, ""])
        if parser.epilog and len(path) > 1:
            out.extend([parser.epilog.strip(), ""])
        summaries = _summaries(parser)
        for name, child in _subcommands(parser).items():
            walk(child, [*path, name], summaries.get(name, ""))

    columns = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = "80"  # argparse wraps usage lines at the terminal's width: fix it
    try:
        walk(root, ["atlas"], "")
    finally:
        if columns is None:
            os.environ.pop("COLUMNS")
        else:
            os.environ["COLUMNS"] = columns
    return "\n".join(out).rstrip() + "\n"


# ------------------------------------------------------------------------------------ the configuration


def _field_comments() -> dict[str, str]:
    """`Class.field` → the comment lines right above the field, then the comment on its own line."""
    found = {}
    for path in CONFIG_SOURCES:
        found.update(_field_comments_of(path.read_text(encoding="utf-8")))
    return found


def _field_comments_of(source: str) -> dict[str, str]:
    comments: dict[int, str] = {}
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            comments[token.start[0]] = token.string.lstrip("#").strip()
    lines = source.splitlines()
    found = {}
    for node in ast.parse(source).body:
        if not isinstance(node, ast.ClassDef):
            continue
        for statement in node.body:
            if not (isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name)):
                continue
            above, line = [], statement.lineno - 1
            while line >= 1 and line in comments and lines[line - 1].lstrip().startswith("#"):
                above.insert(0, comments[line])
                line -= 1
            beside = (
                comments.get(statement.lineno) if not lines[statement.lineno - 1].lstrip().startswith("#") else None
            )
            text = " ".join([*above, *([beside] if beside else [])]).strip()
            if text:
                found[f"{node.name}.{statement.target.id}"] = text
    return found


def _type_text(tp) -> str:
    if dataclasses.is_dataclass(tp):  # a section within a section (`retriever.loss`): a name, or a name and options
        return "str \\| mapping"
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is typing.Literal:
        return " \\| ".join(repr(a).replace("'", '"') for a in args)
    if origin in (typing.Union, __import__("types").UnionType):
        return " \\| ".join(_type_text(a) for a in args)
    if origin in (list, dict):
        return f"{origin.__name__}[{', '.join(_type_text(a) for a in args)}]"
    if tp is type(None):
        return "null"
    return getattr(tp, "__name__", str(tp).replace("typing.", ""))


def _default_text(f: dataclasses.Field) -> str:
    if f.default is not dataclasses.MISSING:
        value = f.default
    elif f.default_factory is not dataclasses.MISSING:
        value = f.default_factory()
    else:
        return "required"
    if dataclasses.is_dataclass(value):
        from atlas.config import config_to_dict

        value = config_to_dict(value)  # as a recipe writes it
    return (
        "`"
        + (
            yaml.safe_dump(value, default_flow_style=True).strip().removesuffix("...").strip()
            if value is not None
            else "null"
        )
        + "`"
    )


def config_keys() -> list[tuple[str, str, str, str]]:
    """(dotted key, type, default, description or "") for every key of a recipe, in schema order."""
    from atlas.config import AtlasConfig
    from retriever.index.settings import IndexSettings

    comments = _field_comments()
    index_settings = {f.name: f.metadata["help"] for f in dataclasses.fields(IndexSettings)}
    rows = []
    for section in dataclasses.fields(AtlasConfig):
        cls = typing.get_type_hints(AtlasConfig)[section.name]
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            key = f"{section.name}.{f.name}"
            setting = index_settings.get(f.name, "") if section.name == "index" else ""
            description = comments.get(f"{cls.__name__}.{f.name}") or (
                setting and setting[0].upper() + setting[1:] + "."
            )
            rows.append((key, _type_text(hints[f.name]), _default_text(f), description))
    return rows


def missing_descriptions() -> list[str]:
    """The recipe keys with no description."""
    return [key for key, _, _, description in config_keys() if not description]


def _task_options() -> list[str]:
    import tasks  # noqa: F401  (registers every task)
    from tasks.base import TASKS

    out = []
    for name in sorted(TASKS):
        options = TASKS[name].default_options
        if not options:
            continue
        out.append(
            f"- `{name}`: "
            + ", ".join(
                f"`{option}` (`{yaml.safe_dump(value, default_flow_style=True).strip().removesuffix('...').strip()}`)"
                for option, value in options.items()
            )
        )
    return out


def _loss_options() -> list[str]:
    from retriever.losses import RETRIEVER_LOSSES

    out = []
    for name in sorted(RETRIEVER_LOSSES):
        cls = RETRIEVER_LOSSES[name]
        if not cls.default_options:
            continue
        out.append(
            f"- `{name}`: "
            + ", ".join(
                f"`{option}` (`{value}`"
                + (
                    f"; one of {', '.join(f'`{c}`' for c in cls.option_choices[option])}"
                    if option in cls.option_choices
                    else ""
                )
                + ")"
                for option, value in cls.default_options.items()
            )
        )
    return out


def config_reference() -> str:
    """The configuration reference page: every recipe key with its type, default and description."""
    from atlas.config import AtlasConfig

    out = [
        "# Configuration",
        "",
        (
            "Generated at every docs build from the config dataclasses, each defined by the component that reads it "
            "(`reader/reader_config.py`, `retriever/retriever_config.py`, `retriever/index/settings.py`, the rest in "
            "`atlas/config.py`; `docs/_gen/reference.py`): "
            "every key a recipe may set, its type, its default and what it does. "
            "A recipe is a YAML mapping with one section per component; any key can be overridden on the "
            "command line as `section.key=value` (the value is read as YAML: `training.lr=4e-5`, "
            "`task.train_data=[a.jsonl,b.jsonl]`, `index.path=null`). Unknown keys, wrong types and unknown "
            "registry names are refused with the key and the file or override they came from. Types are strict "
            "(`10`, not `'10'` or `10.0`, for an int; `true`/`false` for a bool), with two exceptions for YAML: a "
            "float may be written as a string (`lr: '4e-5'`) and a string as a number (`output_dir: 2024`); a "
            "section left empty keeps its defaults."
        ),
        "",
        (
            "A recipe may start from another: a top-level `base: OTHER.yaml` (a path relative to the file "
            "that names it) loads OTHER first (itself with its own `base`, if any) and lays the file's keys "
            "over it: mappings merge key by key, any other value, a list included, replaces the base's. A "
            "`base` cycle or a missing base file is refused naming the file. Overrides apply after the whole "
            "chain, and the config a run saves is the resolved one, without `base`. `configs/small/` and "
            "`configs/reader-stages/` state only what differs from their parent this way "
            "(`configs/README.md` lists every recipe)."
        ),
        "",
        "```yaml",
        "# configs/small/nq-64shot.yaml, abridged: the paper's recipe, on a CPU",
        "base: ../nq-64shot.yaml   # task qa, 64 shots, loss pdist, ... come from there",
        "retriever: {model: minilm, n_context: 20}",
        "index: {corpus: runs/corpus-nq824, spec: Flat}",
        "reader: {model: atlas/demo/atlas-reader, n_context: 5}",
        "task: {train_data: [...], eval_data: [...]}",
        "training: {steps: 100, batch_size: 4, output_dir: runs/small-nq-64shot}",
        "```",
        "",
    ]
    rows = config_keys()
    for section in dataclasses.fields(AtlasConfig):
        cls = typing.get_type_hints(AtlasConfig)[section.name]
        out.extend(
            [
                f"## `{section.name}`",
                "",
                (cls.__doc__ or "").strip(),
                "",
                "| key | type | default | description |",
                "|---|---|---|---|",
            ]
        )
        for key, type_text, default, description in rows:
            if key.startswith(section.name + "."):
                out.append(f"| `{key}` | {type_text} | {_cell(default)} | {_cell(description)} |")
        out.append("")
        if section.name == "retriever":
            out.extend(
                [
                    "### `retriever.loss` options by loss",
                    "",
                    (
                        "A loss takes its options beside its name, `retriever.loss: {name: emdr, granularity: "
                        "token}` (or `retriever.loss.granularity=token` on the command line); the plain "
                        "`retriever.loss: emdr` means its defaults. Options by loss (value: its default; an "
                        "unknown option is refused naming the valid ones):"
                    ),
                    "",
                    *_loss_options(),
                    "",
                ]
            )
        if section.name == "task":
            out.extend(
                [
                    "### `task.options` by task",
                    "",
                    (
                        "Each task accepts the options below under `task.options` (value: its default; a "
                        "value must have the default's type, and an unknown option is refused naming the "
                        "valid ones)."
                    ),
                    "",
                    *_task_options(),
                    "",
                ]
            )
    return "\n".join(out).rstrip() + "\n"


# ----------------------------------------------------------------------------------------- the HTTP API


def openapi_schema() -> dict:
    """The OpenAPI schema of `atlas serve`, from the app itself (a stand-in service: no model is loaded)."""
    import types

    from atlas.serve.app import create_app

    stand_in = types.SimpleNamespace(answer=lambda *args: None, model_executor=None)
    return create_app(stand_in, allow_edits=True, token="a-stand-in-token-0123").openapi()


def _schema_type(schema: dict) -> str:
    if "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[-1]
        return f"[{name}](#{name.lower()})"
    if "anyOf" in schema:
        return " or ".join(_schema_type(s) for s in schema["anyOf"])
    if schema.get("type") == "array":
        return f"array of {_schema_type(schema.get('items', {}))}"
    if "additionalProperties" in schema and isinstance(schema["additionalProperties"], dict):
        return f"object of {_schema_type(schema['additionalProperties'])}"
    return schema.get("type", "any")


def _limits(schema: dict) -> str:
    found = []
    for option in (schema, *schema.get("anyOf", [])):
        for key, label in (
            ("minLength", "min length"),
            ("maxLength", "max length"),
            ("minimum", "≥"),
            ("maximum", "≤"),
            ("minItems", "min items"),
            ("maxItems", "max items"),
        ):
            if key in option:
                value = option[key]
                found.append(f"{label} {int(value) if float(value).is_integer() else value}")
    return ", ".join(found)


def http_reference() -> str:
    """The HTTP API page: every endpoint and every schema of the server's own OpenAPI document."""
    schema = openapi_schema()
    out = [
        "# HTTP API",
        "",
        (
            "Generated from the OpenAPI schema of `atlas serve` (`atlas/serve/app.py`, `atlas/serve/schemas.py`) at "
            "every docs build (`docs/_gen/reference.py`); a running server serves the same document at "
            "`/openapi.json`, and the whole schema is [openapi.json](openapi.json). "
            "How to start a server, its page and edits: [Serve](../guides/serve.md); what it guards against: "
            "[Serve safely](../guides/security.md)."
        ),
        "",
        f"{schema['info'].get('summary', '')}",
        "",
        "## Endpoints",
        "",
    ]
    for path, methods in schema["paths"].items():
        for method, op in methods.items():
            out.extend([f"### `{method.upper()} {path}`", "", op.get("description") or op.get("summary", ""), ""])
            body = op.get("requestBody", {}).get("content", {}).get("application/json", {}).get("schema")
            if body:
                out.extend([f"Body: {_schema_type(body)}.", ""])
            for parameter in op.get("parameters", []):
                out.extend(
                    [
                        f"Path parameter `{parameter['name']}`: {_schema_type(parameter.get('schema', {}))}"
                        + (f" ({_limits(parameter['schema'])})" if _limits(parameter.get("schema", {})) else "")
                        + ".",
                        "",
                    ]
                )
            out.extend(["| status | meaning | body |", "|---|---|---|"])
            for status, response in op.get("responses", {}).items():
                returned = response.get("content", {}).get("application/json", {}).get("schema", {})
                out.append(
                    f"| {status} | {_cell(response.get('description', ''))} | "
                    f"{_schema_type(returned) if returned else ''} |"
                )
            out.append("")
    out.extend(["## Schemas", ""])
    for name, component in sorted(schema["components"]["schemas"].items()):
        out.extend([f"### {name}", "", _cell(component.get("description", "")), ""])
        properties = component.get("properties", {})
        if properties:
            required = set(component.get("required", []))
            out.extend(["| field | type | required | limits | description |", "|---|---|---|---|---|"])
            for field_name, field_schema in properties.items():
                out.append(
                    f"| `{field_name}` | {_schema_type(field_schema)} | {'yes' if field_name in required else ''} "
                    f"| {_cell(_limits(field_schema))} | {_cell(field_schema.get('description', ''))} |"
                )
            out.append("")
    return "\n".join(out).rstrip() + "\n"


def generated_pages() -> dict[str, str]:
    """docs-relative path → content of every generated reference file."""
    import json

    return {
        "reference/cli.md": cli_reference(),
        "reference/config.md": config_reference(),
        "reference/http.md": http_reference(),
        "reference/openapi.json": json.dumps(openapi_schema(), indent=2, ensure_ascii=False) + "\n",
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--write",
        action="store_true",
        help="write the reference pages and the figures into docs/ (the copies git keeps)",
    )
    parser.add_argument(
        "--check",
        action="store_true",
        help="list config keys without a description",
    )
    args = parser.parse_args()
    if args.check:
        missing = missing_descriptions()
        print("missing:", missing)
        raise SystemExit(1 if missing else 0)
    if not args.write:
        parser.error("say --write or --check")
    import figures

    docs = ROOT / "docs"
    written = {**generated_pages(), **{f"results/img/{name}.svg": svg for name, svg in figures.draw_all().items()}}
    for uri, text in written.items():
        (docs / uri).parent.mkdir(parents=True, exist_ok=True)
        (docs / uri).write_text(text, encoding="utf-8")
        print(docs / uri)


if __name__ == "__main__":
    main()
