"""A tiny Llama-architecture model generated locally: config + random weights (safetensors) + a BPE tokenizer
trained on a few KB of text, deterministic from a seed.  No hub download (the machines reach only the
package registries).  Its generations are nonsense; what a server does with it (scheduling, continuous
batching, queuing, streaming, token counts) is real.

    <server venv>/bin/python scripts/real_llm/make_tiny_model.py OUT_DIR [--seed 1]

Runs in the server's own virtualenv (``scripts/real_llm/setup.sh``: torch, transformers, tokenizers,
safetensors come with vLLM).  Writes OUT_DIR/{config.json, model.safetensors, tokenizer.json,
tokenizer_config.json, special_tokens_map.json, generation_config.json} and OUT_DIR/sie-model.json (the
seed and sizes: the cache key of ``setup.sh``).  About 3 MB: 4 layers of width 128, a 1024-token vocabulary.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

#: the tokenizer's training text (a few KB; fixed so the tokenizer is the same on every machine)
CORPUS = """\
A stream of requests arrives on a topic, and each request is answered exactly once. The scorer reads a
record, sends its prompt to a server, waits for the generated text, and writes the answer to the results
topic in the same transaction that commits the offset of the request. If the scorer dies before the
commit, nothing it wrote is visible, and the next owner of the partition reads the record again.
The server runs many generations at once. Each step of the engine adds one token to every running
sequence; a new request joins the running batch at the next step, and a finished one leaves it.
Throughput grows with the number of sequences in the batch until the machine is full; past that point a
request only waits longer in the queue. The time to the first token is the time a request waits plus the
time of its prefill; the time of the whole answer adds one step per generated token.
Quotas keep one caller from taking every slot. A token bucket holds one second of a caller's rate; a
request may be sent when its bucket holds a whole request, and the answer corrects the estimate by the
real count of prompt and completion tokens. A caller over its quota waits, or its request is refused.
Endpoints fail: a process is killed, a machine restarts, a connection is reset in the middle of a
stream. A failed endpoint is taken out of service for a while, and the request is sent again to another
one. An outage is never the request's fault, so it never becomes a dead letter.
The quick brown fox jumps over the lazy dog. Pack my box with five dozen liquor jugs. How vexingly quick
daft zebras jump. The five boxing wizards jump quickly. Sphinx of black quartz, judge my vow.
Numbers and names: zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen
fifteen sixteen seventeen eighteen nineteen twenty hundred thousand million; question answer prompt
completion token model version replica partition offset commit transaction abort retry backoff window.
{"id": "q1", "inputs": {"question": "what is the answer"}, "outputs": {"answer": "forty two"}}
"""

SIZES = {"hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 4, "num_attention_heads": 4,
         "num_key_value_heads": 2, "vocab_size": 1024, "max_position_embeddings": 1024}
SPECIAL = ["<unk>", "<s>", "</s>"]
CHAT_TEMPLATE = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
                 "{% if add_generation_prompt %}assistant: {% endif %}")


def train_tokenizer(out: Path, vocab_size: int) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS.splitlines() * 4, trainer=trainer)
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>",
        "unk_token": "<unk>", "model_max_length": SIZES["max_position_embeddings"], "add_bos_token": True,
        "chat_template": CHAT_TEMPLATE}, indent=1))
    (out / "special_tokens_map.json").write_text(json.dumps(
        {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}, indent=1))


def make_weights(out: Path, seed: int) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(**SIZES, bos_token_id=1, eos_token_id=2, pad_token_id=0, tie_word_embeddings=False,
                         rms_norm_eps=1e-5, rope_theta=10000.0, torch_dtype="float32")
    model = LlamaForCausalLM(config)
    with torch.no_grad():  # a wider spread than the default init: less repetitive nonsense
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.08)
    model.save_pretrained(str(out), safe_serialization=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    train_tokenizer(out, SIZES["vocab_size"])
    make_weights(out, args.seed)
    (out / "sie-model.json").write_text(json.dumps({"seed": args.seed, **SIZES}, indent=1))
    print(f"tiny model (seed {args.seed}) in {out}: " + ", ".join(sorted(p.name for p in out.iterdir())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
