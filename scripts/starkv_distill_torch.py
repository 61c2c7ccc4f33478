#!/usr/bin/env python3
"""STAR-KV knowledge distillation on a GPU with PyTorch, driven by `starling calibrate
--distill-backend torch` (which embeds this file, writes the job directory and reads back what
this script writes). Nothing here chooses ranks or writes checkpoints: Starling owns the
factors, the exact-budget projection and the checkpoint format; this script only trains.

Phases (one profile per invocation):
  thresholds  one alpha per key head and per value factor (alpha = sigmoid(theta)), the student's
              K/V weights U diag(sigma * tanh(relu(s (sigma_hat - alpha)))) R, loss mean
              KL(teacher || student) + mu (soft rank - target) / target, Adam on theta, dual
              ascent on mu -- the same objective as starling-starkv's CPU distiller
              (src/distill/train.rs), at scale. With the job's `budget` = "projected"
              instead, every step first shifts all threshold logits by one constant so the soft
              rank equals the target (bisection, no gradient), then steps on the KL's gradient
              with its component along the soft rank's gradient removed (the least-squares
              price, so Adam's per-parameter steps still trade KL against rank), learning rate
              cosine-decayed to a tenth: the dual ascent's own price swings the soft rank around
              the budget over hundreds of steps (0.5-1.45x on the H100).
  refine      the kept factors themselves (k_down/k_up per KV head, v_down/v_up), read from a
              checkpoint's projections.safetensors, trained on the same KL at fixed ranks.

The teacher is the original model (transformers' implementation, loaded from the same GGUF file
or HF directory Starling read); the student is the same model with the compressed layers'
k_proj / v_proj replaced. Every step prints one JSON line on stdout (Starling draws progress from
them); state is saved every `save_every` steps and when the time limit is reached, so running the
same job again resumes (exit status 75 means "paused, resumable").
"""

import argparse
import json
import math
import os
import sys
import time

EXIT_PAUSED = 75
STARTED = time.time()  # the time limit counts from here, model loading included
EXIT_BAD_JOB = 2


def fail(message, status=EXIT_BAD_JOB):
    print(f"starkv_distill_torch: {message}", file=sys.stderr)
    sys.exit(status)


try:
    import torch
    import torch.nn.functional as F
    from torch.utils.checkpoint import checkpoint
    from safetensors.torch import load_file, save_file
except ImportError as e:  # a clear message instead of a traceback
    fail(f"PyTorch and safetensors are needed ({e}); install them or use --distill-backend cpu")


def emit(record):
    print(json.dumps(record), flush=True)


def load_model(job, job_dir, device, dtype):
    """The teacher from the model Starling read. A GGUF file is dequantised once and kept in
    the job directory as a plain state dict (transformers cannot save a GGUF-loaded model), so
    later phases and profiles load in seconds instead of a minute."""
    from transformers import AutoModelForCausalLM

    path = job["model"]["path"]
    cache = os.path.join(job_dir, "teacher.pt")
    if path.endswith(".gguf") and os.path.isfile(cache):
        saved = torch.load(cache, map_location="cpu", weights_only=False, mmap=True)
        with torch.device(device):
            model = AutoModelForCausalLM.from_config(saved["config"], dtype=dtype)
        model.load_state_dict(saved["state"])
        del saved
    else:
        kwargs = {"gguf_file": os.path.basename(path)} if path.endswith(".gguf") else {}
        where = (os.path.dirname(path) or ".") if kwargs else path
        try:
            model = AutoModelForCausalLM.from_pretrained(where, dtype=dtype, **kwargs)
        except TypeError:  # transformers < 4.56 names it torch_dtype
            model = AutoModelForCausalLM.from_pretrained(where, torch_dtype=dtype, **kwargs)
        if kwargs:
            save_state(cache, {"config": model.config, "state": model.state_dict()})
    model.to(device).eval()
    model.requires_grad_(False)
    model.config.use_cache = False
    return model


class StudentProjection(torch.nn.Module):
    """k_proj / v_proj of a compressed layer: the original projection (the teacher) unless a
    student weight is set for the step; the bias is the original's either way (STAR-KV keeps
    biases uncompressed)."""

    def __init__(self, original):
        super().__init__()
        self.original = original
        self.student_weight = None

    def forward(self, x):
        if self.student_weight is None:
            return self.original(x)
        return F.linear(x, self.student_weight.to(x.dtype), self.original.bias)


def attach_students(model, job):
    layers = model.model.layers
    projections = {}
    for layer in job["compressed_layers"]:
        attn = layers[layer].self_attn
        if not isinstance(attn.k_proj, StudentProjection):
            attn.k_proj = StudentProjection(attn.k_proj)
            attn.v_proj = StudentProjection(attn.v_proj)
        projections[layer] = (attn.k_proj, attn.v_proj)
    return projections


def set_student(projections, weights):
    for layer, (k, v) in projections.items():
        if weights is None:
            k.student_weight = None
            v.student_weight = None
        else:
            k.student_weight, v.student_weight = weights[layer]


def to_halves(job, rows):
    """A key head's rows [head_dim, ...] from Starling's order to transformers' (halves)."""
    if not job["model"]["key_rows_interleaved"]:
        return rows
    hd = rows.shape[0]
    return rows.reshape(hd // 2, 2, *rows.shape[1:]).transpose(0, 1).reshape(rows.shape)


def to_starling(job, rows):
    """The inverse of to_halves."""
    if not job["model"]["key_rows_interleaved"]:
        return rows
    hd = rows.shape[0]
    return rows.reshape(2, hd // 2, *rows.shape[1:]).transpose(0, 1).reshape(rows.shape)


def load_factors(job_dir, job, device):
    """Per compressed layer: key u [H, hd, k], sigma [H, k], r [H, k, hidden], scaled [H, k];
    value u [kv, k], sigma [k], r [k, hidden], scaled [k] (float32)."""
    raw = load_file(os.path.join(job_dir, job["factors_file"]))
    heads = job["shape"]["num_kv_heads"]
    factors = {}
    for layer in job["compressed_layers"]:
        def get(name):
            key = f"layers.{layer}.{name}"
            if key not in raw:
                fail(f"{job['factors_file']} lacks {key}")
            return raw[key].to(device=device, dtype=torch.float32)

        ku = torch.stack([to_halves(job, get(f"k_u.{h}")) for h in range(heads)])
        ks = torch.stack([get(f"k_sigma.{h}") for h in range(heads)])
        kr = torch.stack([get(f"k_r.{h}") for h in range(heads)])
        vu, vs, vr = get("v_u"), get("v_sigma"), get("v_r")
        factors[layer] = {
            "key": (ku, ks, kr, ks / ks[:, :1].clamp_min(1e-30)),
            "value": (vu, vs, vr, vs / vs[:1].clamp_min(1e-30)),
        }
    return factors


def check_factors(model, job, factors, tolerance):
    """The factors must reproduce this model's K/V weights: a checkpoint is only valid for the
    weights it was calibrated on (and a layout mismatch would train nonsense)."""
    layers = model.model.layers
    worst = 0.0
    for layer in job["compressed_layers"]:
        attn = layers[layer].self_attn
        ku, ks, kr, _ = factors[layer]["key"]
        vu, vs, vr, _ = factors[layer]["value"]
        key = ((ku * ks[:, None, :]) @ kr).reshape(-1, kr.shape[-1])
        value = (vu * vs[None, :]) @ vr
        for name, mine, theirs in (
            ("k_proj", key, attn.k_proj.original.weight),
            ("v_proj", value, attn.v_proj.original.weight),
        ):
            theirs = theirs.float()
            if mine.shape != theirs.shape:
                fail(f"layer {layer} {name}: factors give {tuple(mine.shape)}, the model has {tuple(theirs.shape)}")
            err = (mine - theirs).norm().item() / max(theirs.norm().item(), 1e-30)
            worst = max(worst, err)
            if err > tolerance:
                fail(
                    f"layer {layer} {name}: the factors reproduce the model's weights only to a "
                    f"relative error of {err:.3g} (> {tolerance}); were they computed from another model?"
                )
    return worst


class Windows:
    """The calibration tokens cut into windows; step i of the run uses windows
    order[i*batch:(i+1)*batch], the order a seeded permutation per epoch (or the identity)."""

    def __init__(self, job_dir, job):
        import numpy as np

        ids = np.fromfile(os.path.join(job_dir, job["tokens_file"]), dtype="<u4")
        w = job["window_tokens"]
        count = len(ids) // w
        if count < job["batch_windows"]:
            fail(f"{len(ids)} calibration tokens hold {count} windows of {w}; a step needs {job['batch_windows']}")
        self.ids = torch.from_numpy(ids[: count * w].astype("int64")).view(count, w)
        self.count = count
        self.batch = job["batch_windows"]
        self.shuffle = job["shuffle"]
        self.seed = job["seed"]
        self._epoch = None
        self._order = None

    def step(self, step):
        first = step * self.batch
        out = []
        for j in range(first, first + self.batch):
            epoch, index = divmod(j, self.count)
            if epoch != self._epoch:
                if self.shuffle:
                    g = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
                    self._order = torch.randperm(self.count, generator=g)
                else:
                    self._order = torch.arange(self.count)
                self._epoch = epoch
            out.append(int(self._order[index]))
        return out, self.ids[out]


def final_hidden(model, ids):
    return model.model(input_ids=ids).last_hidden_state


def _kl_chunk(head, student, teacher):
    t = F.log_softmax(head(teacher).float(), dim=-1)
    s = F.log_softmax(head(student).float(), dim=-1)
    return (t.exp() * (t - s)).sum()


def mean_kl(model, ids, chunk_tokens):
    """Mean KL(teacher || student) per position over the batch; logits are made chunk by chunk
    (and remade in the backward) so a vocabulary of 150k never holds a whole window's logits."""
    with torch.no_grad():
        saved = [(k.student_weight, v.student_weight) for k, v in model._star_projections.values()]
        set_student(model._star_projections, None)
        teacher = final_hidden(model, ids)
        for (k, v), (kw, vw) in zip(model._star_projections.values(), saved):
            k.student_weight, v.student_weight = kw, vw
    student = final_hidden(model, ids)
    head = model.lm_head
    flat_s = student.reshape(-1, student.shape[-1])
    flat_t = teacher.reshape(-1, teacher.shape[-1])
    total = 0.0
    for start in range(0, flat_s.shape[0], chunk_tokens):
        end = start + chunk_tokens
        total = total + checkpoint(_kl_chunk, head, flat_s[start:end], flat_t[start:end], use_reentrant=False)
    return total / flat_s.shape[0]


def soft_values(sigma, scaled, alpha, sharpness):
    return sigma * torch.tanh(torch.relu(sharpness * (scaled - alpha)))


def threshold_weights(factors, alphas, heads, sharpness):
    weights, soft_rank, index = {}, 0.0, 0
    for layer, f in factors.items():
        ku, ks, kr, kscaled = f["key"]
        vu, vs, vr, vscaled = f["value"]
        ka = alphas[index:index + heads].unsqueeze(1)
        va = alphas[index + heads]
        index += heads + 1
        key = ((ku * soft_values(ks, kscaled, ka, sharpness)[:, None, :]) @ kr).reshape(-1, kr.shape[-1])
        value = (vu * soft_values(vs, vscaled, va, sharpness)[None, :]) @ vr
        weights[layer] = (key, value)
        soft_rank = soft_rank + torch.sigmoid(sharpness * (kscaled - ka)).sum() + torch.sigmoid(sharpness * (vscaled - va)).sum()
    return weights, soft_rank


def spectra_table(factors, heads):
    """Every threshold's scaled singular values, one row each in the order of the alphas
    (per layer: its key heads, then its value factor), padded with -inf (which counts 0)."""
    rows = []
    for f in factors.values():
        rows.extend(f["key"][3][h] for h in range(heads))
        rows.append(f["value"][3])
    table = torch.full((len(rows), max(r.numel() for r in rows)), float("-inf"), dtype=torch.float64)
    for i, r in enumerate(rows):
        table[i, : r.numel()] = r.detach().double().cpu()
    return table


def budget_shift(table, theta, sharpness, target, iterations=60):
    """The constant b for which the soft rank of alpha = sigmoid(theta + b) equals `target`
    (the soft rank falls as b rises); clamped to [-30, 30] where the target is out of reach."""
    theta = theta.detach().double().cpu().unsqueeze(1)

    def soft(b):
        return float(torch.sigmoid(sharpness * (table - torch.sigmoid(theta + b))).sum())

    lo, hi = -30.0, 30.0
    if soft(lo) <= target:
        return lo
    if soft(hi) >= target:
        return hi
    for _ in range(iterations):
        mid = 0.5 * (lo + hi)
        if soft(mid) > target:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)


def hard_rank(factors, alphas, heads):
    total, index = 0, 0
    for f in factors.values():
        kscaled, vscaled = f["key"][3], f["value"][3]
        total += int((kscaled > alphas[index:index + heads].unsqueeze(1)).sum())
        total += int((vscaled > alphas[index + heads]).sum())
        index += heads + 1
    return total


def save_state(path, state):
    tmp = path + ".partial"
    torch.save(state, tmp)
    os.replace(tmp, path)


def end_step(args, phase, step, steps_total, tokens_per_step, record, state_path, state):
    """After a step: its JSON line, the state saved every `save_every` steps, at the end and at
    the time limit, and a resumable exit (EXIT_PAUSED) when the limit is reached early.
    `state` is a function returning what to save (called only when saving)."""
    emit({"phase": phase, "steps": steps_total, "tokens_seen": (step + 1) * tokens_per_step, **record})
    done = step + 1 == steps_total
    out_of_time = args.time_limit_s > 0 and time.time() - STARTED > args.time_limit_s
    if done or out_of_time or (step + 1) % args.save_every == 0:
        save_state(state_path, state())
    if out_of_time and not done:
        print(f"paused after {phase} step {step + 1} of {steps_total}: run the same command again to resume", file=sys.stderr)
        sys.exit(EXIT_PAUSED)


def run_thresholds(args, job, profile, model, factors, windows, out_dir):
    cfg = job["thresholds"]
    heads = job["shape"]["num_kv_heads"]
    device = next(model.parameters()).device
    target = float(max(profile["target_elements"], 1))
    steps_total = math.ceil(cfg["tokens"] / (windows.batch * job["window_tokens"]))
    init = torch.tensor(profile["initial_alphas"], dtype=torch.float64).clamp(1e-4, 1 - 1e-4)
    theta = torch.nn.Parameter(torch.logit(init).to(device=device, dtype=torch.float32))
    adam = torch.optim.Adam([theta], lr=cfg["learning_rate"], betas=(0.9, 0.999), eps=1e-8)
    multiplier, start, records = cfg["initial_multiplier"], 0, []
    state_path = os.path.join(out_dir, "thresholds.state.pt")
    if os.path.exists(state_path):
        state = torch.load(state_path, map_location=device)
        theta.data.copy_(state["theta"])
        adam.load_state_dict(state["adam"])
        multiplier, start, records = state["multiplier"], state["step"], state["records"]
    projected = cfg.get("budget", "dual") == "projected"
    table = spectra_table(factors, heads) if projected else None
    base_lr = cfg["learning_rate"]
    for step in range(start, steps_total):
        t0 = time.time()
        window_ids, ids = windows.step(step)
        shift = budget_shift(table, theta, cfg["sharpness"], target) if projected else 0.0
        alphas = torch.sigmoid(theta + shift)
        weights, soft_rank = threshold_weights(factors, alphas, heads, cfg["sharpness"])
        set_student(model._star_projections, weights)
        kl = mean_kl(model, ids.to(device), args.chunk_tokens)
        if projected:
            # At the budget by construction: the KL alone, at a step size decayed to a tenth.
            for g in adam.param_groups:
                g["lr"] = base_lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * step / max(steps_total, 1))))
            loss = kl
        else:
            loss = kl + (soft_rank - target) * (multiplier / target)
        adam.zero_grad(set_to_none=True)
        if projected:
            # The KL's gradient with its component along the soft rank's gradient removed (the
            # least-squares price): every threshold's step then trades its KL benefit against
            # its rank cost, as the dual's price does, without a price of its own to swing.
            (normal,) = torch.autograd.grad(soft_rank, theta, retain_graph=True)
        loss.backward()
        if projected:
            g = theta.grad
            theta.grad = g - (g * normal).sum() / normal.pow(2).sum().clamp_min(1e-30) * normal
        kl_value, soft_value = kl.detach().item(), soft_rank.detach().item()
        if not (math.isfinite(kl_value) and math.isfinite(soft_value)) or not torch.isfinite(theta.grad).all():
            fail(f"step {step}: non-finite loss or threshold gradient", status=1)
        record = {
            "step": step,
            "window": window_ids[0],
            "kl": kl_value,
            "soft_rank": soft_value,
            "hard_rank": hard_rank(factors, alphas.detach(), heads),
            "multiplier": multiplier,
            "shift": shift,
            "elapsed_ms": 0,
        }
        adam.step()
        if projected:
            with torch.no_grad():
                theta.add_(shift)  # folded in, so the next step's shift stays small
        else:
            multiplier = max(0.0, multiplier + cfg["dual_rate"] * (soft_value - target) / target)
        if device.type == "cuda":
            torch.cuda.synchronize()
        record["elapsed_ms"] = int(1000 * (time.time() - t0))
        records.append(record)
        end_step(args, "thresholds", step, steps_total, windows.batch * job["window_tokens"], record, state_path,
                 lambda: {"theta": theta.detach(), "adam": adam.state_dict(), "multiplier": multiplier, "step": step + 1, "records": records})
    set_student(model._star_projections, None)
    shift = budget_shift(table, theta, cfg["sharpness"], target) if projected else 0.0
    result = {
        "alphas": torch.sigmoid(theta.detach() + shift).double().tolist(),
        "multiplier": multiplier,
        "steps": records,
        "windows": windows.count,
        "window_tokens": job["window_tokens"],
        "batch_windows": windows.batch,
        "tokens_seen": len(records) * windows.batch * job["window_tokens"],
    }
    with open(os.path.join(out_dir, "thresholds.json"), "w") as f:
        json.dump(result, f)


def run_refine(args, job, profile, model, windows, out_dir, checkpoint_dir):
    cfg = job["refine"]
    heads = job["shape"]["num_kv_heads"]
    device = next(model.parameters()).device
    raw = load_file(os.path.join(checkpoint_dir, "projections.safetensors"))
    names = sorted(raw)
    def start(name):
        t = raw[name].to(device=device, dtype=torch.float32)
        return to_halves(job, t) if ".k_up." in name else t

    params = {n: torch.nn.Parameter(start(n)) for n in names}
    groups = [{"params": [p], "lr": cfg["learning_rate"] * float(p.detach().pow(2).mean().sqrt())} for p in params.values()]
    for g in groups:
        g["base_lr"] = g["lr"]
    adam = torch.optim.Adam(groups, betas=(0.9, 0.999), eps=1e-8)
    steps_total = math.ceil(cfg["tokens"] / (windows.batch * job["window_tokens"]))
    start, records = 0, []
    state_path = os.path.join(out_dir, "refine.state.pt")
    if os.path.exists(state_path):
        state = torch.load(state_path, map_location=device)
        for n in names:
            params[n].data.copy_(state["params"][n])
        adam.load_state_dict(state["adam"])
        start, records = state["step"], state["records"]
    layers = sorted({int(n.split(".")[1]) for n in names})
    for step in range(start, steps_total):
        t0 = time.time()
        # Cosine decay to a tenth of the step size: late steps polish, they do not wander.
        scale = 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * step / max(steps_total, 1)))
        for g in adam.param_groups:
            g["lr"] = g["base_lr"] * scale
        weights = {}
        for layer in layers:
            key = torch.cat([params[f"layers.{layer}.k_up.{h}"] @ params[f"layers.{layer}.k_down.{h}"] for h in range(heads)])
            value = params[f"layers.{layer}.v_up"] @ params[f"layers.{layer}.v_down"]
            weights[layer] = (key, value)
        window_ids, ids = windows.step(step)
        set_student(model._star_projections, weights)
        kl = mean_kl(model, ids.to(device), args.chunk_tokens)
        adam.zero_grad(set_to_none=True)
        kl.backward()
        kl_value = kl.detach().item()
        if not math.isfinite(kl_value) or any(not torch.isfinite(p.grad).all() for p in params.values() if p.grad is not None):
            fail(f"refine step {step}: non-finite loss or gradient", status=1)
        adam.step()
        if device.type == "cuda":
            torch.cuda.synchronize()
        record = {"step": step, "window": window_ids[0], "kl": kl_value, "elapsed_ms": int(1000 * (time.time() - t0))}
        records.append(record)
        end_step(args, "refine", step, steps_total, windows.batch * job["window_tokens"], record, state_path,
                 lambda: {"params": {n: p.detach() for n, p in params.items()}, "adam": adam.state_dict(), "step": step + 1, "records": records})
    set_student(model._star_projections, None)
    def finish(name, p):
        t = p.detach().float()
        return (to_starling(job, t) if ".k_up." in name else t).contiguous().cpu()

    save_file({n: finish(n, p) for n, p in params.items()}, os.path.join(out_dir, "refined.safetensors"))
    result = {
        "steps": records,
        "windows": windows.count,
        "window_tokens": job["window_tokens"],
        "batch_windows": windows.batch,
        "tokens_seen": len(records) * windows.batch * job["window_tokens"],
        "learning_rate": cfg["learning_rate"],
    }
    with open(os.path.join(out_dir, "refine.json"), "w") as f:
        json.dump(result, f)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("phase", choices=["thresholds", "refine"])
    parser.add_argument("--job", required=True, help="the job directory Starling wrote")
    parser.add_argument("--profile", required=True)
    parser.add_argument("--checkpoint", help="refine: the checkpoint directory whose projections are refined")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", choices=["bfloat16", "float32"], default=None)
    parser.add_argument("--chunk-tokens", type=int, default=1024)
    parser.add_argument("--save-every", type=int, default=25)
    parser.add_argument("--time-limit-s", type=float, default=0.0, help="pause (resumably) after this long; 0: no limit")
    args = parser.parse_args()

    with open(os.path.join(args.job, "job.json")) as f:
        job = json.load(f)
    if job.get("format") != 1:
        fail(f"job format {job.get('format')} is not 1: this script and the starling binary differ")
    profile = next((p for p in job["profiles"] if p["name"] == args.profile), None)
    if profile is None:
        fail(f"profile {args.profile} is not in the job ({[p['name'] for p in job['profiles']]})")
    device = torch.device(args.device)
    dtype_name = args.dtype or ("bfloat16" if device.type == "cuda" else "float32")
    dtype = getattr(torch, dtype_name)
    torch.manual_seed(job["seed"])
    t0 = time.time()
    model = load_model(job, args.job, device, dtype)
    model._star_projections = attach_students(model, job)
    factors = load_factors(args.job, job, device)
    worst = check_factors(model, job, factors, tolerance=job["factor_tolerance"])
    emit({"phase": "loaded", "seconds": round(time.time() - t0, 1), "factor_error": worst, "device": str(device), "dtype": dtype_name})
    windows = Windows(args.job, job)
    out_dir = os.path.join(args.job, args.profile)
    os.makedirs(out_dir, exist_ok=True)
    if args.phase == "thresholds":
        run_thresholds(args, job, profile, model, factors, windows, out_dir)
    else:
        if not args.checkpoint:
            fail("refine needs --checkpoint")
        run_refine(args, job, profile, model, windows, out_dir, args.checkpoint)


if __name__ == "__main__":
    main()
