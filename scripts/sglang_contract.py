"""Extract SGLang's request/launch contract from an sglang wheel, without importing it (no CUDA stack).

    pip download --no-deps sglang==<v> -d /tmp/sgl && python scripts/sglang_contract.py /tmp/sgl/sglang-<v>-*.whl

Reads, with ``ast`` only: ``ServerArgs``'s fields (0.5.x: the namespaces in ``arg_groups/fields/``) (its CLI flags are ``--`` + the field name with
``-`` for ``_``, as ``add_cli_args_from_dataclass`` makes them) plus the flags ``add_cli_args`` adds by hand;
the fields of ``GenerateReqInput`` (``/generate``'s body); ``SamplingParams``' fields (or ``__init__`` arguments)
(``sampling_params``); the fields of the OpenAI ``CompletionRequest``/``ChatCompletionRequest`` (with
their base classes) and of ``ResponseFormat``/``JsonSchemaResponseFormat`` (aliases included).
Writes ``tests/fixtures/sglang_contract.json``, which ``tests/streams/llm/test_sglang_contract.py`` checks
the adapter's launch command and request bodies against.

It also writes SGLang's ARGUMENT TABLE, ``schemas/json/sglang_server_args.json`` (package data: every node's spec
policy parses a spec's ``extra_args`` with it, ``sie.schemas.sglang_args``): each action of the parser
``sglang serve`` builds (option strings, destination, nargs) and the parser's own settings (``allow_abbrev``).
The table cannot come from ``ast``: ``add_cli_args_from_dataclass`` derives actions from type annotations at run
time.  So this step builds the real parser: sglang's argument modules import without a GPU (no CUDA, no kernels),
given a handful of small packages::

    python -m venv --system-site-packages /tmp/sglv && /tmp/sglv/bin/pip install --no-deps /tmp/sgl/sglang-<v>-*.whl \
        && /tmp/sglv/bin/pip install msgspec psutil pybase64 pillow pyzmq tqdm
    python scripts/sglang_contract.py /tmp/sgl/sglang-<v>-*.whl --parser-python /tmp/sglv/bin/python

(torch must be importable by that interpreter; the system site-packages provide it here.)
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import subprocess
import sys
import zipfile
from pathlib import Path

OUT = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "sglang_contract.json"
TABLE_OUT = Path(__file__).resolve().parent.parent / "schemas" / "json" / "sglang_server_args.json"
#: run by ``--parser-python``: the parser exactly as ``sglang.srt.server_args.prepare_server_args`` builds it
_DUMP_PARSER = r"""
import argparse, json, sys
from sglang.srt.server_args import ServerArgs
parser = argparse.ArgumentParser(prog="sglang serve")
ServerArgs.add_cli_args(parser)
def row(a):
    out = {"options": list(a.option_strings), "dest": a.dest, "nargs": a.nargs}
    if a.type is not None:
        out["type"] = getattr(a.type, "__name__", type(a.type).__name__)
    if a.choices is not None and all(isinstance(c, (str, int, float, bool)) for c in a.choices):
        out["choices"] = sorted(a.choices, key=str)
    return out
actions = [row(a) for a in parser._actions]
json.dump({"allow_abbrev": parser.allow_abbrev, "prefix_chars": parser.prefix_chars,
           "fromfile_prefix_chars": parser.fromfile_prefix_chars, "python": sys.version.split()[0],
           "actions": actions}, sys.stdout)
"""
FILES = {
    "server_args": "sglang/srt/server_args.py",
    "io_struct": "sglang/srt/managers/io_struct.py",
    "sampling": "sglang/srt/sampling/sampling_params.py",
    "openai": "sglang/srt/entrypoints/openai/protocol.py",
}


def classes(tree: ast.Module) -> dict[str, ast.ClassDef]:
    return {node.name: node for node in tree.body if isinstance(node, ast.ClassDef)}


def fields(all_classes: dict[str, ast.ClassDef], name: str) -> list[str]:
    """Annotated names of a class and its bases in the same module (aliases ``Field(alias=...)`` too)."""
    cls = all_classes[name]
    out: list[str] = []
    for base in cls.bases:
        if isinstance(base, ast.Name) and base.id in all_classes:
            out += fields(all_classes, base.id)
    for node in cls.body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and not node.target.id.startswith("_"):
            out.append(node.target.id)
            if isinstance(node.value, ast.Call):
                for kw in node.value.keywords:
                    if kw.arg == "alias" and isinstance(kw.value, ast.Constant):
                        out.append(str(kw.value.value))
    return out


def parser_table(python: str, version: str) -> dict:
    """SGLang's argument table, dumped by ``python`` (an interpreter that can import ``sglang.srt.server_args``)."""
    out = subprocess.run([python, "-c", _DUMP_PARSER], capture_output=True, text=True, cwd="/")
    if out.returncode != 0:
        raise SystemExit(f"--parser-python {python}: cannot build sglang's parser (see this script's docstring "
                         f"for the packages it needs):\n{out.stderr[-2000:]}")
    table = json.loads(out.stdout)
    return {"sglang_version": version, **table}


def main(wheel: str, parser_python: str | None = None) -> int:
    version = re.search(r"sglang-([^-]+)-", Path(wheel).name)
    with zipfile.ZipFile(wheel) as z:
        trees = {k: ast.parse(z.read(v).decode()) for k, v in FILES.items()}
        # 0.5.x: ServerArgs' fields live in namespaces under arg_groups/fields/ (``A[T, Arg(...)]``)
        groups = [ast.parse(z.read(n).decode()) for n in z.namelist()
                  if n.startswith("sglang/srt/arg_groups/fields/") and n.endswith(".py")]
    server = classes(trees["server_args"])
    flags = {"--" + f.replace("_", "-") for f in fields(server, "ServerArgs")}
    for tree in groups:
        for cls in classes(tree).values():
            for node in cls.body:
                if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
                    continue
                cli_name = None
                for call in ast.walk(node.annotation):  # Arg(cli_name=..., aliases=[...])
                    for kw in getattr(call, "keywords", []) if isinstance(call, ast.Call) else []:
                        if kw.arg == "cli_name" and isinstance(kw.value, ast.Constant):
                            cli_name = str(kw.value.value)
                        if kw.arg == "aliases" and isinstance(kw.value, (ast.List, ast.Tuple)):
                            flags.update(str(e.value) for e in kw.value.elts if isinstance(e, ast.Constant))
                flags.add(cli_name or "--" + node.target.id.replace("_", "-"))
    for node in ast.walk(server["ServerArgs"]):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "add_argument":
            flags.update(a.value for a in node.args if isinstance(a, ast.Constant) and str(a.value).startswith("-"))
    sampling_cls = classes(trees["sampling"])["SamplingParams"]
    sampling_init = next((n for n in sampling_cls.body if isinstance(n, ast.FunctionDef) and n.name == "__init__"),
                         None)
    if sampling_init is not None:  # older versions: a plain class with __init__ arguments
        sampling = [a.arg for a in sampling_init.args.args + sampling_init.args.kwonlyargs if a.arg != "self"]
    else:  # 0.5.x: a msgspec.Struct, its fields are the arguments
        sampling = fields(classes(trees["sampling"]), "SamplingParams")
    openai = classes(trees["openai"])
    contract = {
        "sglang_version": version.group(1) if version else "unknown",
        "server_flags": sorted(flags),
        "generate_fields": sorted(fields(classes(trees["io_struct"]), "GenerateReqInput")),
        "sampling_params": sorted(sampling),
        "completion_fields": sorted(fields(openai, "CompletionRequest")),
        "chat_fields": sorted(fields(openai, "ChatCompletionRequest")),
        "response_format_fields": sorted(fields(openai, "ResponseFormat")),
        "json_schema_format_fields": sorted(fields(openai, "JsonSchemaResponseFormat")),
    }
    OUT.write_text(json.dumps(contract, indent=1) + "\n", encoding="utf-8")
    if parser_python:
        table = parser_table(parser_python, contract["sglang_version"])
        head = json.dumps({k: v for k, v in table.items() if k != "actions"}, indent=1)[:-2]
        rows = ",\n  ".join(json.dumps(a) for a in table["actions"])  # one action per line: reviewable diffs
        TABLE_OUT.write_text(f'{head},\n "actions": [\n  {rows}\n ]\n}}\n', encoding="utf-8")
        print(f"{TABLE_OUT}: {len(table['actions'])} actions of sglang {table['sglang_version']}'s parser")
    print(f"{OUT}: sglang {contract['sglang_version']}, {len(flags)} flags, "
          f"{len(contract['generate_fields'])} /generate fields")
    return 0


if __name__ == "__main__":
    cli = argparse.ArgumentParser(description="Pin SGLang's request/launch contract and its argument table.")
    cli.add_argument("wheel")
    cli.add_argument("--parser-python", help="an interpreter that imports sglang.srt.server_args (see the docstring)")
    ns = cli.parse_args()
    sys.exit(main(ns.wheel, ns.parser_python))
