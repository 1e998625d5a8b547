#!/usr/bin/env python3
"""Trains the TinyLoop demo model with PyTorch and exports it as a dense FP16 .tinyloop file.

The network is exactly the architecture of docs/architecture.md (pre-norm blocks, RMSNorm, rotate-half RoPE with
positions from 0 in each window, causal softmax attention scaled by 1/sqrt(head_dim), SwiGLU MLP, `pre` unique blocks
then one block applied `loops` times with shared weights, final RMSNorm, head tied to the embedding), so the file it
writes scores the same in the library as here. Tokens are bytes (vocab 256).

Training: random windows of --seq bytes from train.txt, AdamW (weight decay on matrices only), linear warm-up then
cosine decay to 10%, bfloat16 autocast with FP32 master weights, gradient clipping at 1.0. The learning-rate schedule
runs on progress = max(step / --steps, elapsed / --time-limit), so a slower machine ends the schedule properly
instead of being cut mid-way; the steps actually done are written to the log and into the file's metadata. Every
--eval-every steps the mean loss on fixed windows of valid.txt is measured; the best state is exported.

Output: a .tinyloop (safetensors) file with F16 dense linears (`<b>attn_qkv.weight` …, out-major like nn.Linear),
norms and the embedding; `tinyloop quantize` turns it into the INT4 model. Recipe: scripts/train-demo.sh and
docs/quality.md.

Usage: tools/gpu/train_demo.py --data DIR --out FILE [--steps N] [--time-limit MIN] [--seed S] ...
"""

import argparse
import json
import math
import pathlib
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


def rmsnorm(x, gain, eps):
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * gain).to(x.dtype)


def rope_tables(seq, head_dim, theta, device):
    # Angles in float64 then rounded, like the library (docs/architecture.md).
    i = torch.arange(head_dim // 2, dtype=torch.float64, device=device)
    inv = theta ** (-2.0 * i / head_dim)
    angle = torch.arange(seq, dtype=torch.float64, device=device)[:, None] * inv[None, :]
    return torch.cos(angle).float(), torch.sin(angle).float()


def rope(x, cos, sin):
    """x [B, T, H, hd]; rotate-half: the pair (x[i], x[i + hd/2]) by the position's angle i."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half].float(), x[..., half:].float()
    c, s = cos[None, :, None, :], sin[None, :, None, :]
    return torch.cat([x1 * c - x2 * s, x1 * s + x2 * c], dim=-1).to(x.dtype)


class Block(nn.Module):
    def __init__(self, cfg, residual_std):
        super().__init__()
        d, a, f = cfg["d_model"], cfg["n_heads"] * cfg["head_dim"], cfg["ffn"]
        self.cfg = cfg
        self.attn_norm = nn.Parameter(torch.ones(d))
        self.mlp_norm = nn.Parameter(torch.ones(d))
        self.attn_qkv = nn.Linear(d, 3 * a, bias=False)
        self.attn_out = nn.Linear(a, d, bias=False)
        self.mlp_gate = nn.Linear(d, f, bias=False)
        self.mlp_up = nn.Linear(d, f, bias=False)
        self.mlp_down = nn.Linear(f, d, bias=False)
        for lin in (self.attn_qkv, self.mlp_gate, self.mlp_up):
            nn.init.normal_(lin.weight, std=0.02)
        # Output projections start small so that the many residual additions of the loop stay bounded.
        for lin in (self.attn_out, self.mlp_down):
            nn.init.normal_(lin.weight, std=residual_std)

    def forward(self, x, cos, sin):
        cfg = self.cfg
        b, t, _ = x.shape
        h, hd, eps = cfg["n_heads"], cfg["head_dim"], cfg["norm_eps"]
        qkv = self.attn_qkv(rmsnorm(x, self.attn_norm, eps)).view(b, t, 3, h, hd)
        q, k, v = qkv.unbind(2)
        q, k = rope(q, cos, sin), rope(k, cos, sin)
        o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
        x = x + self.attn_out(o.transpose(1, 2).reshape(b, t, h * hd))
        u = rmsnorm(x, self.mlp_norm, eps)
        return x + self.mlp_down(F.silu(self.mlp_gate(u)) * self.mlp_up(u))


class TinyLoop(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        applications = cfg["pre"] + cfg["loops"]
        residual_std = 0.02 / math.sqrt(2 * applications)
        self.embed = nn.Embedding(cfg["vocab"], cfg["d_model"])
        nn.init.normal_(self.embed.weight, std=0.02)
        self.pre = nn.ModuleList(Block(cfg, residual_std) for _ in range(cfg["pre"]))
        self.loop = Block(cfg, residual_std)
        self.final_norm = nn.Parameter(torch.ones(cfg["d_model"]))

    def forward(self, tokens, cos, sin):
        x = self.embed(tokens)
        for block in self.pre:
            x = block(x, cos, sin)
        for _ in range(self.cfg["loops"]):
            x = self.loop(x, cos, sin)
        h = rmsnorm(x, self.final_norm, self.cfg["norm_eps"])
        return h @ self.embed.weight.t().to(h.dtype)  # tied head

    def loss(self, batch, cos, sin):
        logits = self(batch[:, :-1], cos, sin)
        return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1))


def tinyloop_tensors(model):
    """The .tinyloop tensor names of docs/format.md, as contiguous FP16 CPU tensors."""
    out = {"embed.weight": model.embed.weight, "final_norm.weight": model.final_norm}
    blocks = [(f"pre.{i}.", b) for i, b in enumerate(model.pre)] + [("loop.", model.loop)]
    for prefix, block in blocks:
        out[prefix + "attn_norm.weight"] = block.attn_norm
        out[prefix + "mlp_norm.weight"] = block.mlp_norm
        for name in ("attn_qkv", "attn_out", "mlp_gate", "mlp_up", "mlp_down"):
            out[f"{prefix}{name}.weight"] = getattr(block, name).weight
    tensors = {}
    for name, t in out.items():
        t16 = t.detach().to(torch.float16)
        if not torch.isfinite(t16).all():
            raise RuntimeError(f"{name} does not fit FP16")
        tensors[name] = t16.cpu().contiguous()
    return tensors


def load_bytes(path, device):
    data = pathlib.Path(path).read_bytes()
    return torch.frombuffer(bytearray(data), dtype=torch.uint8).to(device=device, dtype=torch.long)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", required=True, help="folder with train.txt and valid.txt (tools/demo_data.py)")
    p.add_argument("--out", required=True, help="the dense FP16 .tinyloop to write")
    p.add_argument("--d-model", type=int, default=512)
    p.add_argument("--n-heads", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--ffn", type=int, default=1536)
    p.add_argument("--pre", type=int, default=2)
    p.add_argument("--loops", type=int, default=4)
    p.add_argument("--seq", type=int, default=512, help="training window = the model's max_seq")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--steps", type=int, default=1800)
    p.add_argument("--time-limit", type=float, default=5.0, help="minutes; the schedule ends by then")
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--warmup", type=int, default=150)
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--eval-every", type=int, default=200)
    p.add_argument("--eval-windows", type=int, default=64)
    p.add_argument("--seed", type=int, default=1234)
    args = p.parse_args()

    if not torch.cuda.is_available():
        sys.exit("train_demo.py: needs a CUDA GPU")
    device = torch.device("cuda")
    torch.manual_seed(args.seed)
    cfg = {"d_model": args.d_model, "n_heads": args.n_heads, "head_dim": args.head_dim, "ffn": args.ffn,
           "vocab": 256, "pre": args.pre, "loops": args.loops, "max_seq": args.seq, "group_size": 0, "bits": 4,
           "rope_theta": 10000.0, "norm_eps": 1e-5}
    train = load_bytes(pathlib.Path(args.data) / "train.txt", device)
    valid = load_bytes(pathlib.Path(args.data) / "valid.txt", device)
    model = TinyLoop(cfg).to(device)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"config {json.dumps(cfg)}\nparameters {n_params}  train {train.numel()} bytes  valid {valid.numel()} bytes",
          flush=True)

    matrices = [p for p in model.parameters() if p.dim() == 2]
    vectors = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": matrices, "weight_decay": args.weight_decay},
                             {"params": vectors, "weight_decay": 0.0}], lr=args.lr, betas=(0.9, 0.95), fused=True)
    cos, sin = rope_tables(args.seq, args.head_dim, cfg["rope_theta"], device)
    gen = torch.Generator(device=device).manual_seed(args.seed)
    window = torch.arange(args.seq + 1, device=device)
    # Fixed, evenly spaced validation windows: the same ones at every evaluation.
    valid_starts = torch.linspace(0, valid.numel() - args.seq - 2, args.eval_windows, device=device).long()
    valid_batch = valid[valid_starts[:, None] + window[None, :]]

    def evaluate():
        model.eval()
        with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
            losses = [model.loss(valid_batch[i:i + 16], cos, sin).item() for i in range(0, len(valid_batch), 16)]
        model.train()
        return sum(losses) / len(losses)

    best, best_state, best_step = float("inf"), None, 0
    start, step, limit_s = time.time(), 0, args.time_limit * 60
    while True:
        progress = max(step / args.steps, (time.time() - start) / limit_s)
        if progress >= 1.0:
            break
        if step < args.warmup:
            lr = args.lr * (step + 1) / args.warmup
        else:
            lr = args.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))
        for group in opt.param_groups:
            group["lr"] = lr
        starts = torch.randint(0, train.numel() - args.seq - 1, (args.batch,), device=device, generator=gen)
        batch = train[starts[:, None] + window[None, :]]
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model.loss(batch, cos, sin)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        if step % args.eval_every == 0 or step == 1:
            v = evaluate()
            print(f"step {step:5d}  {time.time() - start:6.1f} s  lr {lr:.2e}  train {loss.item():.4f}  "
                  f"valid {v:.4f} nats/byte", flush=True)
            if v < best:
                best, best_step = v, step
                best_state = {k: t.detach().clone() for k, t in model.state_dict().items()}
    v = evaluate()
    print(f"end   {step:5d}  {time.time() - start:6.1f} s  valid {v:.4f} nats/byte", flush=True)
    if v <= best:
        best, best_step = v, step
    else:
        model.load_state_dict(best_state)
    print(f"exporting step {best_step} (valid {best:.4f} nats/byte, perplexity {math.exp(best):.4f})", flush=True)

    from safetensors.torch import save_file
    training = {"steps_done": step, "exported_step": best_step, "valid_nats_per_byte": round(best, 6),
                "args": vars(args), "torch": torch.__version__, "gpu": torch.cuda.get_device_name()}
    metadata = {"format": "tinyloop", "format_version": "1", "config": json.dumps(cfg),
                "training": json.dumps(training)}
    save_file(tinyloop_tensors(model), args.out, metadata=metadata)
    print(f"wrote {args.out}", flush=True)


if __name__ == "__main__":
    main()
