#!/usr/bin/env python3
"""NVIDIA kvpress's answers to the exact prompts of a Starling NIAH run.

`starling bench niah --dump-prompts` writes prompts.json: every cell's prompt token ids, how many
of its last tokens are the question and the chat template's tail (`question_tokens`), the
protocol, max_new_tokens and the end-of-sequence ids. This script loads the same GGUF with HF
transformers and, for every method label (`none`, `snapkv@0.75`, ...), does what kvpress's
`KVPressTextGenerationPipeline` does: the context is prefilled with the press active (compressed
once), then the question is run uncompressed at the context's original positions and the answer
is decoded greedily. The split is the one Starling used: under `context-question` the context is
everything before the question tokens; under `whole-prompt` it is the whole prompt but its last
token. The KV bytes the cache tensors hold at the end are recorded per cell (kvpress's scorer
presses gather the kept rows, so the tensors really shrink). `starling bench niah
--compare-kvpress` then scores these answers with Starling's scorer and draws both systems.

All cells of one context length have the same length (the haystack is cut to an exact token
count), so they run as one batch. A press that fails is recorded per cell (`error`) rather than
stopping the run; the JSON is rewritten after every batch, so a run cut short keeps what it did.

usage: niah_kvpress.py MODEL_DIR GGUF_NAME PROMPTS_JSON OUT_JSON --methods none,snapkv@0.75,...
       [--dtype bfloat16] [--device cuda] [--batch 11]
Run where torch + transformers + gguf + kvpress are installed (the GPU machine: see
scripts/device/niah_kvpress.sh, which carries the kvpress wheel).
"""
import argparse
import contextlib
import importlib
import importlib.util
import json
import os
import sys
import time
import traceback
import types

import torch
import transformers
from transformers import AutoModelForCausalLM, AutoTokenizer, DynamicCache

# Starling's method names → (kvpress module, press class, extra constructor arguments). kvpress's
# own defaults otherwise (SnapKV: window 64, kernel 5; StreamingLLM: 4 sinks).
PRESSES = {
    "keydiff": ("keydiff_press", "KeyDiffPress", {}),
    "knorm": ("knorm_press", "KnormPress", {}),
    "streaming_llm": ("streaming_llm_press", "StreamingLLMPress", {}),
    "snapkv": ("snapkv_press", "SnapKVPress", {}),
    "tova": ("tova_press", "TOVAPress", {}),
    "random": ("random_press", "RandomPress", {}),
}


def shim_transformers():
    """Names kvpress imports from transformers that this version may lack: stand-in classes, so
    the import works and `isinstance` checks against them are simply false."""
    for name in ["QuantizedCache", "Gemma3ForConditionalGeneration", "Phi3ForCausalLM",
                 "MistralForCausalLM", "Qwen3ForCausalLM", "Gemma3PreTrainedModel"]:
        if not hasattr(transformers, name):
            setattr(transformers, name, type(name, (), {}))


def import_press_classes():
    """The press classes, from the kvpress package if it imports, else from its press modules
    alone (kvpress/__init__ imports every press, some needing datasets or hub access)."""
    shim_transformers()
    try:
        import kvpress  # noqa: F401

        source = "kvpress"
    except Exception as e:  # pragma: no cover - depends on the installed versions
        print(f"import kvpress failed ({e!r}); importing the press modules alone", flush=True)
        spec = importlib.util.find_spec("kvpress")
        if spec is None or not spec.submodule_search_locations:
            raise RuntimeError("kvpress is not installed") from e
        for name in [m for m in sys.modules if m == "kvpress" or m.startswith("kvpress.")]:
            del sys.modules[name]
        package = types.ModuleType("kvpress")
        package.__path__ = list(spec.submodule_search_locations)
        sys.modules["kvpress"] = package
        source = "kvpress press modules"
    classes = {}
    for method, (module, cls, extra) in PRESSES.items():
        try:
            classes[method] = (getattr(importlib.import_module(f"kvpress.presses.{module}"), cls), extra)
        except Exception as e:  # pragma: no cover
            print(f"kvpress {cls}: import failed: {e!r}", flush=True)
            classes[method] = (None, repr(e))
    return classes, source


def compat_hook(press):
    """Wraps the press's forward hook so it finds what kvpress expects in the attention call's
    keyword arguments, whichever transformers version passes them: the hidden states, a cache
    position (the prefill starts from an empty cache), and the RoPE (cos, sin)."""
    original = press.forward_hook

    def hook(module, args, kwargs, output):
        kw = dict(kwargs)
        hidden = kw.get("hidden_states", args[0] if args else None)
        kw["hidden_states"] = hidden
        q_len = hidden.shape[1]
        if kw.get("cache_position") is None:
            kw["cache_position"] = torch.arange(q_len, device=hidden.device)
        if kw.get("position_embeddings") is None:
            pos = kw.get("position_ids")
            if pos is None:
                pos = kw["cache_position"].unsqueeze(0)
            kw["position_embeddings"] = module.rotary_emb(hidden, pos)
        return original(module, args, kw, output)

    press.forward_hook = hook
    return press


def ensure_rotary(model):
    """kvpress points every attention layer at the decoder's shared rotary embedding; newer
    transformers keep one per attention layer instead."""
    inner = model.model
    if not hasattr(inner, "rotary_emb"):
        inner.rotary_emb = inner.layers[0].self_attn.rotary_emb


def cache_layers(cache):
    """(keys, values) per layer of a DynamicCache, old or new API."""
    if hasattr(cache, "layers"):
        return [(layer.keys, layer.values) for layer in cache.layers]
    return list(zip(cache.key_cache, cache.value_cache))


def held(cache, row):
    """Bytes and the largest token count the cache tensors hold for batch row `row`."""
    total, tokens = 0, 0
    for k, v in cache_layers(cache):
        if k is None or k.numel() == 0:
            continue
        total += (k[row].numel() + v[row].numel()) * k.element_size()
        tokens = max(tokens, k.shape[-2])
    return total, tokens


def parse_method(label):
    if "@" not in label:
        return label, 0.0
    name, ratio = label.split("@", 1)
    return name, float(ratio)


def answer_batch(model, tok, ids, context_len, press, max_new, eos):
    """kvpress's pipeline on a batch of equal-length prompts: compressed prefill of the context,
    uncompressed question at its original positions, greedy decode. Returns (answers, ids,
    bytes held, tokens held) per row."""
    device = model.device
    batch = torch.tensor(ids, device=device)
    context, question = batch[:, :context_len], batch[:, context_len:]
    cache = DynamicCache()
    with torch.no_grad():
        with press(model) if press is not None else contextlib.nullcontext():
            model.model(input_ids=context, past_key_values=cache, use_cache=True)
        positions = torch.arange(context_len, batch.shape[1], device=device).unsqueeze(0)
        positions = positions.expand(batch.shape[0], -1)
        out = model(input_ids=question, past_key_values=cache, position_ids=positions,
                    use_cache=True)
        next_ids = out.logits[:, -1].argmax(-1)
        generated = [next_ids]
        position = positions[:, -1:] + 1
        for step in range(max_new - 1):
            done = torch.stack(generated, 1)
            if all(any(int(t) in eos for t in row) for row in done.tolist()):
                break
            out = model(input_ids=generated[-1].unsqueeze(1), past_key_values=cache,
                        position_ids=position + step, use_cache=True)
            generated.append(out.logits[:, -1].argmax(-1))
    rows = torch.stack(generated, 1).tolist()
    results = []
    for r, row in enumerate(rows):
        for i, t in enumerate(row):
            if t in eos:
                row = row[:i]
                break
        nbytes, ntokens = held(cache, r)
        results.append((tok.decode(row, skip_special_tokens=True), row, nbytes, ntokens))
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model_dir")
    parser.add_argument("gguf_file")
    parser.add_argument("prompts")
    parser.add_argument("output")
    parser.add_argument("--methods", required=True, help="comma-separated: none,snapkv@0.75,...")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--batch", type=int, default=11, help="cells per forward pass")
    args = parser.parse_args()

    with open(args.prompts) as f:
        dump = json.load(f)
    eos = set(int(t) for t in dump["eos_token_ids"])
    max_new = int(dump["max_new_tokens"])
    protocol = dump.get("protocol", "whole-prompt")
    classes, source = import_press_classes()
    tok = AutoTokenizer.from_pretrained(args.model_dir, gguf_file=args.gguf_file)
    model = AutoModelForCausalLM.from_pretrained(
        args.model_dir, gguf_file=args.gguf_file, dtype=getattr(torch, args.dtype)
    ).to(args.device).eval()
    ensure_rotary(model)

    # Earlier output of the same prompts (a run split over several calls) is kept.
    cells = []
    if os.path.exists(args.output):
        with open(args.output) as f:
            cells = json.load(f).get("cells", [])
    done = {(c["method"], c["context_tokens"], c["depth_percent"]) for c in cells}
    presses_used = {}

    def write():
        doc = {
            "generator": {
                "script": "scripts/niah_kvpress.py",
                "kvpress": _version("kvpress"),
                "imported_from": source,
                "transformers": transformers.__version__,
                "torch": torch.__version__,
                "dtype": args.dtype,
                "device": args.device,
                "gguf_file": args.gguf_file,
                "protocol": protocol,
                "presses": presses_used,
                "max_new_tokens": max_new,
            },
            "cells": cells,
        }
        with open(args.output + ".tmp", "w") as f:
            json.dump(doc, f, indent=1)
        os.replace(args.output + ".tmp", args.output)

    started = time.time()
    for label in [m.strip() for m in args.methods.split(",") if m.strip()]:
        name, ratio = parse_method(label)
        press, failure = None, None
        if name != "none" and ratio > 0:
            cls, extra = classes.get(name, (None, f"no kvpress press for method {name}"))
            if cls is None:
                failure = f"press unavailable: {extra}"
            else:
                try:
                    press = compat_hook(cls(compression_ratio=ratio, **extra))
                    presses_used[label] = repr(press)
                except Exception as e:
                    failure = f"{cls.__name__}({ratio}): {e!r}"
        by_context = {}
        for cell in dump["cells"]:
            if (label, cell["context_tokens"], cell["depth_percent"]) not in done:
                by_context.setdefault(cell["context_tokens"], []).append(cell)
        for n, group in by_context.items():
            for i in range(0, len(group), args.batch):
                chunk = group[i : i + args.batch]
                q = chunk[0].get("question_tokens", 0) if protocol == "context-question" else 1
                context_len = len(chunk[0]["prompt_ids"]) - max(q, 1)
                results, error = None, failure
                if error is None:
                    try:
                        results = answer_batch(model, tok, [c["prompt_ids"] for c in chunk],
                                               context_len, press, max_new, eos)
                    except Exception as e:
                        error = f"{type(e).__name__}: {e}"
                        traceback.print_exc()
                        torch.cuda.empty_cache() if torch.cuda.is_available() else None
                for j, cell in enumerate(chunk):
                    answer, ids, nbytes, ntokens = results[j] if results else ("", [], 0, 0)
                    cells.append({
                        "method": label,
                        "context_tokens": cell["context_tokens"],
                        "depth_percent": cell["depth_percent"],
                        "prompt_tokens": len(cell["prompt_ids"]),
                        "answer": answer,
                        "output_ids": ids,
                        "kv_bytes_held": nbytes,
                        "kv_tokens_held": ntokens,
                        "error": error,
                    })
                first = cells[-len(chunk)]
                print(f"[{label}] {n} tokens x {len(chunk)} cells: "
                      f"{(first['error'] or repr(first['answer'][:60]))} "
                      f"(KV {first['kv_tokens_held']} tokens, {time.time() - started:.0f} s)",
                      flush=True)
                write()
    write()
    print(f"{len(cells)} answers written to {args.output}")


def _version(name):
    try:
        from importlib.metadata import version

        return version(name)
    except Exception:
        return None


if __name__ == "__main__":
    main()
