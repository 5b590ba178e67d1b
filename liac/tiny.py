"""A tiny trained checkpoint for the README quickstart and the text tests: a 2-layer Llama and its own tokenizer.

    python -m liac.tiny tiny-llama          # or scripts/make-tiny-checkpoint tiny-llama; ~15 s on two cores

The tokenizer is a byte-level BPE trained with the `tokenizers` library on `CORPUS` (a few paragraphs written for
this purpose, plus a handful of question/answer turns in the chat template's format); the model is trained on the
same text for a few hundred steps, on one CPU thread with a fixed seed, so the checkpoint (and what it writes) is
the same on every run of one machine. The directory then holds what any HF checkpoint holds: config.json,
model.safetensors, generation_config.json, tokenizer.json, tokenizer_config.json (with a chat template).

Uses transformers and tokenizers (core dependencies of liac).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import torch
import transformers
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

__all__ = ["CORPUS", "CHAT_TEMPLATE", "train_tokenizer", "make_tiny_checkpoint", "main"]

CORPUS = """\
The GPU is fast, but its memory is small. The CPU is slower, but its memory is large.
A large model does not fit in the memory of one GPU. Its weights must live somewhere else.
The old way moves the weights to the GPU over PCIe for every token. That is slow.
The new way computes some layers on the CPU, next to the weights, and sends only the activations.
The plan says which layer runs where, and where each weight lives.
The compiler writes the plan. The runtime reads the plan and runs it.
The plan is a YAML file. You can read it, check it in, and review it like code.
Each decoder layer has six sublayers: qkv, attention score, attention context, out proj, fc1 and fc2.
At a small batch, the CPU computes the feed-forward layers from its own memory.
At a large batch, the GPU computes everything, and the weights stream in while it works.
The integer program finds the best placement in seconds, and it proves that it is the best.
The cost model prices every sublayer on every device and every transfer between them.
The hardware profile says how fast the CPU, the GPU, the memory and the link are.
Once upon a time, a small model lived in a large computer.
It wanted to write stories, but it knew only a few words.
Every day it read the same page, and every day it learned a little more.
One morning it wrote its first sentence, and the sentence was about the GPU.
The end.
User: What does liac do?
Assistant: It compiles an offload plan and runs it on the CPU and the GPU.
User: Where do the weights live?
Assistant: In GPU memory when they fit, in CPU memory when they do not.
User: Why compute on the CPU?
Assistant: Because moving the weights over PCIe takes longer than computing next to them.
User: What is a plan?
Assistant: A YAML file that says which layer runs where.
"""

CHAT_TEMPLATE = ("{{ bos_token }}{% for message in messages %}{{ message['role'] | capitalize }}: "
                 "{{ message['content'] }}\n{% endfor %}{% if add_generation_prompt %}Assistant:{% endif %}")

_SPECIAL = ("<pad>", "<s>", "</s>")  # ids 0, 1, 2


def train_tokenizer(texts: list[str], vocab_size: int = 512):
    """A byte-level BPE tokenizer trained on `texts` with the `tokenizers` library, wrapped for transformers:
    '<s>' starts every encoded text, '</s>' ends a sequence, '<pad>' pads; the chat template is CHAT_TEMPLATE."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(_SPECIAL), show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(texts, trainer=trainer)
    tokenizer.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    wrapped = PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token="<s>", eos_token="</s>",
                                      pad_token="<pad>")
    wrapped.chat_template = CHAT_TEMPLATE
    return wrapped


def _documents() -> list[str]:
    """The corpus as training documents: each line, and each question with its answer."""
    lines = CORPUS.splitlines()
    docs = [line for line in lines if not line.startswith(("User:", "Assistant:"))]
    docs += [f"{q}\n{a}" for q, a in zip(lines, lines[1:]) if q.startswith("User:") and a.startswith("Assistant:")]
    return docs


def make_tiny_checkpoint(out: str | os.PathLike, steps: int = 300, seed: int = 0, hidden_size: int = 96,
                         layers: int = 2, log=None) -> Path:
    """Train the tokenizer and a tiny Llama on CORPUS and save both to `out` (safetensors); returns `out`."""
    out = Path(out)
    tokenizer = train_tokenizer(CORPUS.splitlines())
    eos = tokenizer.eos_token_id
    rows = [tokenizer(doc)["input_ids"] + [eos] for doc in _documents()]
    width = max(len(r) for r in rows)
    ids = torch.tensor([r + [tokenizer.pad_token_id] * (width - len(r)) for r in rows])
    labels = torch.tensor([r + [-100] * (width - len(r)) for r in rows])  # padding is not learned
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=hidden_size, intermediate_size=hidden_size * 3,
                         num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=256, rms_norm_eps=1e-5, rope_theta=10000.0,
                         tie_word_embeddings=False, bos_token_id=tokenizer.bos_token_id, eos_token_id=eos,
                         pad_token_id=tokenizer.pad_token_id)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # one thread: the same sums in the same order on every machine with this torch
    try:
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
        optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.0)
        schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, steps)
        generator = torch.Generator().manual_seed(seed)
        began = time.perf_counter()
        for step in range(steps):
            pick = torch.randperm(len(rows), generator=generator)[:16]
            loss = model(input_ids=ids[pick], labels=labels[pick]).loss
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            schedule.step()
            if log is not None and (step % 100 == 0 or step == steps - 1):
                log(f"step {step + 1}/{steps}: loss {loss.item():.3f} ({time.perf_counter() - began:.0f} s)")
    finally:
        torch.set_num_threads(threads)
    model.generation_config = GenerationConfig(bos_token_id=config.bos_token_id, eos_token_id=eos,
                                               pad_token_id=config.pad_token_id)
    progress_bars = transformers.utils.logging.is_progress_bar_enabled()
    transformers.utils.logging.disable_progress_bar()  # the steps above are the progress
    try:
        model.save_pretrained(out, safe_serialization=True)
    finally:
        if progress_bars:
            transformers.utils.logging.enable_progress_bar()
    tokenizer.save_pretrained(out)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="make-tiny-checkpoint", description=__doc__.splitlines()[0])
    parser.add_argument("out", help="directory to write the checkpoint into")
    parser.add_argument("--steps", type=int, default=300, help="training steps (default 300)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the weights and the batches (default 0)")
    args = parser.parse_args(argv)
    began = time.perf_counter()
    make_tiny_checkpoint(args.out, steps=args.steps, seed=args.seed, log=lambda line: print(line, file=sys.stderr))
    print(f"wrote {args.out} in {time.perf_counter() - began:.0f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
