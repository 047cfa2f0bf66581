"""Extract SGLang's request/launch contract from an sglang wheel, without importing it (no CUDA stack).

    pip download --no-deps sglang==<v> -d /tmp/sgl && python scripts/sglang_contract.py /tmp/sgl/sglang-<v>-*.whl

Reads, with ``ast`` only: ``ServerArgs``'s fields (0.5.x: the namespaces in ``arg_groups/fields/``) (its CLI flags are ``--`` + the field name with
``-`` for ``_``, as ``add_cli_args_from_dataclass`` makes them) plus the flags ``add_cli_args`` adds by hand;
the fields of ``GenerateReqInput`` (``/generate``'s body); ``SamplingParams``' fields (or ``__init__`` arguments)
(``sampling_params``); the fields of the OpenAI ``CompletionRequest``/``ChatCompletionRequest`` (with
their base classes) and of ``ResponseFormat``/``JsonSchemaResponseFormat`` (aliases included).
Writes ``tests/fixtures/sglang_contract.json``, which ``tests/streams/llm/test_sglang_contract.py`` checks
the adapter's launch command and request bodies against.
"""

from __future__ import annotations

import ast
import json
import re
import sys
import zipfile
from pathlib import Path

OUT = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "sglang_contract.json"
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


def main(wheel: str) -> int:
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
    print(f"{OUT}: sglang {contract['sglang_version']}, {len(flags)} flags, "
          f"{len(contract['generate_fields'])} /generate fields")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
