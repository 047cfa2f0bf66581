"""Wire protocols of LLM servers: one request in, text and token counts out.

Three protocols, chosen by ``spec.backend.config.protocol``:

* ``sglang`` (default): SGLang's native ``POST /generate``
  ``{"text", "sampling_params": {"max_new_tokens", "temperature", "json_schema"}, "rid", "stream": false}``
  -> ``{"text", "meta_info": {"prompt_tokens", "completion_tokens", ...}}``;
* ``openai-completions``: ``POST /v1/completions`` ``{"model", "prompt", "max_tokens", "temperature"}``
  -> ``{"choices": [{"text"}], "usage": {"prompt_tokens", "completion_tokens"}}`` (vLLM, SGLang,
  llama.cpp server, TGI);
* ``openai-chat``: ``POST /v1/chat/completions`` with one user message and, for JSON output,
  ``response_format: {"type": "json_schema", ...}`` -> ``choices[0].message.content`` and ``usage``.

Structured output: the JSON schema generated from ``spec.outputSchema`` is sent as SGLang's
``sampling_params.json_schema`` and as OpenAI chat's ``response_format``; the completions endpoint has
no standard field for it (servers differ: vLLM ``guided_json``, SGLang ``json_schema``), so extra body
fields come from ``config.extra_body`` there.

The mapping from the generated text to the result's ``outputs`` (``LLMMapping``) is the one the
batch-path SGLang backend documents: ``output_mode`` ``json`` (parse, cast each declared field) or
``text`` (the one string field gets the text); fields named like token counts are filled from them.
**Streaming** (``config.stream: true``): the request asks for server-sent events and ``StreamReader``
reads them line by line, so the dispatcher can time the first token.  SGLang's ``/generate`` with
``"stream": true`` answers ``data: {...}`` events, each the same object as the non-streamed answer with
the text *so far* (cumulative: SGLang's default; a server started with ``--incremental-streaming-output``
sends deltas and is not supported) and ``meta_info`` so far, then ``data: [DONE]``.  The OpenAI-compatible
endpoints answer ``data: {"choices": [{"text"}]}`` (completions) or ``{"choices": [{"delta":
{"content"}}]}`` (chat) chunks holding *deltas*, and with ``stream_options: {"include_usage": true}`` a
last chunk whose ``usage`` holds the token counts, then ``data: [DONE]``.  The result is the same
``Generation`` as without streaming, built when ``[DONE]`` arrives; a stream that ends before it is an
incomplete answer (the dispatcher treats it as the server's failure and sends the request again).

Nothing here does I/O: ``sie.streams.llm.dispatch`` sends what ``Protocol.request`` builds.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

META_FIELDS = ("prompt_tokens", "completion_tokens", "cached_tokens", "finish_reason", "e2e_latency")
_JSON_TYPES = {"float": "number", "int": "integer", "bool": "boolean", "string": "string"}
PROTOCOLS = ("sglang", "openai-completions", "openai-chat")
_SSE_BLANKS = " \t\r\n"


class BadOutput(Exception):
    """The server answered, but the answer cannot be this request's result (a dead letter, not an outage)."""


@dataclass(frozen=True)
class Generation:
    """What one request produced: the text and its token counts (None where the server did not say)."""

    text: str
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    meta: Mapping[str, Any] | None = None


def output_json_schema(fields: Sequence[tuple[str, str]],
                       ranges: Mapping[str, Sequence[float]] | None = None) -> dict[str, Any]:
    """JSON schema of the output fields (``(name, type)``) for constrained decoding."""
    properties: dict[str, Any] = {}
    for name, type_name in fields:
        if name in META_FIELDS:
            continue
        prop: dict[str, Any] = {"type": _JSON_TYPES.get(type_name, "string")}
        bounds = (ranges or {}).get(name)
        if bounds is not None and type_name in ("int", "float"):
            prop["minimum"], prop["maximum"] = bounds[0], bounds[1]
        properties[name] = prop
    return {"type": "object", "properties": properties, "required": list(properties)}


def cast_output(value: Any, type_name: str, name: str) -> Any:
    """A generated value read as its output field's type (``BadOutput`` naming the field when it cannot be)."""
    try:
        if type_name == "float":
            return float(value)
        if type_name == "int":
            return int(value)
        if type_name == "bool":
            if isinstance(value, str):
                return value.strip().lower() in ("true", "1", "yes")
            return bool(value)
        return value if isinstance(value, str) else json.dumps(value)
    except (TypeError, ValueError) as exc:
        raise BadOutput(f"outputs.{name}: cannot read {str(value)[:80]!r} as {type_name}") from exc


class LLMMapping:
    """Request inputs -> prompt, generated text -> ``outputs`` (module docstring)."""

    def __init__(self, fields: Sequence[tuple[str, str]], config: Mapping[str, Any]) -> None:
        self.fields = tuple(fields)
        own = [(n, t) for n, t in self.fields if n not in META_FIELDS]  # token counts etc. come from the server
        strings = [n for n, t in own if t == "string"]
        default_mode = "text" if len(own) == 1 and len(strings) == 1 else "json"
        self.mode = str(config.get("output_mode") or default_mode)
        if self.mode not in ("json", "text"):
            raise ValueError(f"spec.backend.config.output_mode: must be 'json' or 'text' (got {self.mode!r})")
        if self.mode == "text" and len(strings) != 1:
            raise ValueError(f"spec.backend.config.output_mode: 'text' needs exactly one string output field "
                             f"(got {strings})")
        self.text_field = strings[0] if self.mode == "text" else None
        self.template = config.get("prompt_template")
        self.schema = output_json_schema(self.fields, config.get("output_ranges")) if self.mode == "json" else None

    def prompt(self, inputs: Mapping[str, Any]) -> str:
        if not self.template:
            return json.dumps(dict(inputs), sort_keys=True)
        try:
            return str(self.template).format(**inputs)
        except (KeyError, IndexError, ValueError, AttributeError) as exc:
            raise BadOutput(f"spec.backend.config.prompt_template: {type(exc).__name__} {str(exc)[:80]} "
                            f"with this request's inputs") from None

    def outputs(self, gen: Generation) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.mode == "text":
            out[self.text_field or ""] = gen.text
        else:
            try:
                parsed = json.loads(gen.text)
            except json.JSONDecodeError:
                raise BadOutput(f"generated text is not JSON for the output schema: {gen.text[:120]!r}") from None
            if not isinstance(parsed, dict):
                raise BadOutput(f"generated JSON is not an object: {gen.text[:120]!r}")
            for name, type_name in self.fields:
                if name in parsed and name not in META_FIELDS:
                    out[name] = cast_output(parsed[name], type_name, name)
        meta = {"prompt_tokens": gen.prompt_tokens, "completion_tokens": gen.completion_tokens, **(gen.meta or {})}
        for name, type_name in self.fields:
            if name in META_FIELDS and name not in out and meta.get(name) is not None:
                out[name] = cast_output(meta[name], type_name, name)
        return out


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


class Protocol:
    """One server protocol: ``request`` builds (path, body); ``parse`` reads the answer or raises ``BadOutput``."""

    def __init__(self, name: str, mapping: LLMMapping, config: Mapping[str, Any]) -> None:
        if name not in PROTOCOLS:
            raise ValueError(f"spec.backend.config.protocol: must be one of {', '.join(PROTOCOLS)} (got {name!r})")
        self.name = name
        self.mapping = mapping
        sampling = {"max_new_tokens": 128, "temperature": 0.0, **dict(config.get("sampling_params") or {})}
        self.max_tokens = int(sampling["max_new_tokens"])
        self.temperature = float(sampling["temperature"])
        self.sampling = sampling
        if name == "sglang" and mapping.schema is not None and "regex" not in sampling and "json_schema" not in sampling:
            sampling["json_schema"] = json.dumps(mapping.schema)
        self.model = str(config.get("served_model_name") or config.get("model") or "default")
        self.extra_body = dict(config.get("extra_body") or {})
        self.stream = config.get("stream") is True

    @property
    def path(self) -> str:
        return {"sglang": "/generate", "openai-completions": "/v1/completions",
                "openai-chat": "/v1/chat/completions"}[self.name]

    def request(self, prompt: str, rid: str) -> dict[str, Any]:
        """The JSON body of one request for ``prompt``; ``rid`` is stable per Kafka record (logs, dedup)."""
        if self.name == "sglang":
            return {"text": prompt, "sampling_params": self.sampling, "stream": self.stream, "rid": rid}
        body: dict[str, Any] = {"model": self.model, "max_tokens": self.max_tokens, "temperature": self.temperature,
                                **self.extra_body}
        if self.stream:
            body["stream"] = True
            body["stream_options"] = {"include_usage": True}
        if self.name == "openai-completions":
            body["prompt"] = prompt
        else:
            body["messages"] = [{"role": "user", "content": prompt}]
            if self.mapping.schema is not None and "response_format" not in body:
                body["response_format"] = {"type": "json_schema",
                                           "json_schema": {"name": "outputs", "schema": self.mapping.schema}}
        return body

    def parse(self, doc: Any) -> Generation:
        if not isinstance(doc, dict):
            raise BadOutput(f"{self.path} answered {type(doc).__name__}, not a JSON object")
        if self.name == "sglang":
            text = doc.get("text")
            meta_info = doc.get("meta_info")
            meta: dict[str, Any] = meta_info if isinstance(meta_info, dict) else {}
            if not isinstance(text, str):
                raise BadOutput(f"{self.path} answered no 'text'")
            return Generation(text, _int(meta.get("prompt_tokens")), _int(meta.get("completion_tokens")),
                              {k: meta[k] for k in META_FIELDS if k in meta})
        choices = doc.get("choices")
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
            raise BadOutput(f"{self.path} answered no choices")
        first = choices[0]
        if self.name == "openai-completions":
            text = first.get("text")
        else:
            message = first.get("message")
            text = message.get("content") if isinstance(message, dict) else None
        if not isinstance(text, str):
            raise BadOutput(f"{self.path} answered a choice without text")
        usage_doc = doc.get("usage")
        usage: dict[str, Any] = usage_doc if isinstance(usage_doc, dict) else {}
        meta = {"finish_reason": first["finish_reason"]} if first.get("finish_reason") is not None else {}
        return Generation(text, _int(usage.get("prompt_tokens")), _int(usage.get("completion_tokens")), meta)


def sse_lines(chunks: Iterable[bytes]) -> Iterator[str]:
    """The lines of a server-sent-events body as it arrives in ``chunks``: split ONLY at CR, LF or CRLF
    (the event-stream grammar), never at the other characters ``str.splitlines()`` and httpx's
    ``iter_lines`` split at (U+0085, U+2028, U+2029, U+000B, U+000C, U+001C..U+001E).  Generated text may
    carry those raw inside a JSON string (vLLM sends U+0085 unescaped: valid JSON), and cutting there made a
    valid event look like two broken ones.  Split on bytes, then decode each line: CR and LF never occur
    inside a UTF-8 multi-byte sequence, so a chunk boundary inside a character is harmless; a CR at the end
    of one chunk and an LF at the start of the next are one line end."""
    buf = b""
    skip_lf = False  # the previous chunk ended in CR: an LF opening this one belongs to it (CRLF)
    for chunk in chunks:
        if not chunk:
            continue
        if skip_lf and chunk[:1] == b"\n":
            chunk = chunk[1:]
        skip_lf = False
        buf += chunk
        start = 0
        while True:
            cr, lf = buf.find(b"\r", start), buf.find(b"\n", start)
            if cr < 0 and lf < 0:
                break
            end = lf if cr < 0 or 0 <= lf < cr else cr
            yield buf[start:end].decode("utf-8", errors="replace")
            if buf[end:end + 1] == b"\r":
                if end + 1 == len(buf):
                    skip_lf, start = True, end + 1
                    break
                start = end + 2 if buf[end + 1:end + 2] == b"\n" else end + 1
            else:
                start = end + 1
        buf = buf[start:]
    if buf:
        yield buf.decode("utf-8", errors="replace")


class StreamReader:
    """One streamed answer, fed its lines in order (module docstring): ``feed`` says whether the line
    carried generated text (the first such line is the first token); ``result`` once ``done``."""

    def __init__(self, protocol: Protocol) -> None:
        self._p = protocol
        self.done = False
        self._text: list[str] = []
        self._last: dict[str, Any] = {}  # sglang: the latest event (cumulative)
        self._usage: dict[str, Any] = {}
        self._finish: Any = None

    def feed(self, line: str) -> bool:
        # one line of the stream (``sse_lines``); only ASCII blanks are trimmed: str.strip() would also eat
        # U+0085/U+2028/U+2029, which are the generated text's own characters when they end a JSON string
        line = line.strip(_SSE_BLANKS)
        if not line.startswith("data:"):
            return False  # blank separators, comments, "event:" lines
        data = line[5:].strip(_SSE_BLANKS)
        if data == "[DONE]":
            self.done = True
            return False
        try:
            doc = json.loads(data)
        except ValueError:
            raise BadOutput(f"{self._p.path} streamed an event that is not JSON: {data[:120]!r}") from None
        if not isinstance(doc, dict):
            raise BadOutput(f"{self._p.path} streamed {type(doc).__name__}, not a JSON object")
        if doc.get("error") is not None:  # the server gave up on this request mid-stream (an error event)
            raise BadOutput(f"{self._p.path} streamed an error: {str(doc['error'])[:300]}")
        if self._p.name == "sglang":
            before = len(self._last.get("text") or "")
            self._last = doc
            text = doc.get("text")
            return isinstance(text, str) and len(text) > before
        if isinstance(doc.get("usage"), dict):
            self._usage = doc["usage"]
        choices = doc.get("choices")
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
            return False  # the usage chunk has no choices
        first = choices[0]
        if first.get("finish_reason") is not None:
            self._finish = first["finish_reason"]
        if self._p.name == "openai-completions":
            piece = first.get("text")
        else:
            delta = first.get("delta")
            piece = delta.get("content") if isinstance(delta, dict) else None
        if isinstance(piece, str) and piece:
            self._text.append(piece)
            return True
        return False

    def result(self) -> Generation:
        if self._p.name == "sglang":
            return self._p.parse(self._last)
        usage = self._usage
        meta = {"finish_reason": self._finish} if self._finish is not None else {}
        return Generation("".join(self._text), _int(usage.get("prompt_tokens")),
                          _int(usage.get("completion_tokens")), meta)
