"""A small transformer-like model trained with tensor or pipeline parallelism, from the job's layout.

    python -m hpc_train submit --site sandbox --nodes 2 --procs-per-node 2 --parallel dp=2,tp=2 examples/train_parallel.py
    python -m hpc_train submit --site sandbox --nodes 2 --procs-per-node 2 --parallel dp=2,pp=2 examples/train_parallel.py
    python examples/train_parallel.py            # one process: the reference the layouts must match

The script never chooses the layout. It asks the context: with tp > 1 it shards attention and MLP
(column-wise in, row-wise out); with pp > 1 it trains its pipeline stage of the layers. The batch
size is global: each data-parallel group reads batch/dp of it, so every layout computes the same
loss as the single process. Each rank writes ``<out>/rank<R>.json`` (losses per step, coordinates).
"""

import argparse
import json
import os
import socket

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

import hpc_train.runtime as rt
from hpc_train.runtime.engine.parallel import dp_all_reduce_mean

VOCAB, DIM, HEADS, SEQ = 32, 32, 4, 8


class Embed(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.tok = nn.Embedding(VOCAB, DIM)
        self.pos = nn.Parameter(0.02 * torch.randn(SEQ, DIM))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.tok(ids) + self.pos


class Block(nn.Module):
    """Causal self-attention and an MLP. Head count follows the local q width, so a tp shard runs its heads."""

    def __init__(self) -> None:
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(DIM), nn.LayerNorm(DIM)
        self.q, self.k, self.v, self.o = (nn.Linear(DIM, DIM) for _ in range(4))
        self.fc1, self.fc2 = nn.Linear(DIM, 4 * DIM), nn.Linear(4 * DIM, DIM)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        h = self.norm1(x)
        q, k, v = (proj(h).view(b, t, -1, DIM // HEADS).transpose(1, 2) for proj in (self.q, self.k, self.v))
        att = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, -1)
        x = x + self.o(att)
        return x + self.fc2(F.gelu(self.fc1(self.norm2(x))))


class Head(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm, self.out = nn.LayerNorm(DIM), nn.Linear(DIM, VOCAB)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.norm(x))


def layers(blocks: int) -> list[nn.Module]:
    return [Embed(), *(Block() for _ in range(blocks)), Head()]


def tp_plan(model: nn.Module) -> dict[str, str]:
    """Megatron-style: q, k, v and fc1 split by output columns, o and fc2 by input rows (one all-reduce each)."""
    plan = {}
    for name, module in model.named_modules():
        if isinstance(module, Block):
            plan.update({f"{name}.{p}": "colwise" for p in ("q", "k", "v", "fc1")})
            plan.update({f"{name}.{p}": "rowwise" for p in ("o", "fc2")})
    return plan


def loss_fn(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.reshape(-1, VOCAB).float(), targets.reshape(-1))


def dataset(n: int = 512) -> TensorDataset:
    """Sequences x[t+1] = (5 x[t] + c) mod VOCAB, c in {3, 7} per sequence (attention tells which): the same on every rank."""
    g = torch.Generator().manual_seed(1234)
    a = 5
    c = 3 + 4 * torch.randint(0, 2, (n, 1), generator=g)
    seq = [torch.randint(0, VOCAB, (n, 1), generator=g)]
    for _ in range(SEQ):
        seq.append((a * seq[-1] + c) % VOCAB)
    tokens = torch.cat(seq, dim=1)
    return TensorDataset(tokens[:, :-1], tokens[:, 1:])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--batch-size", type=int, default=16, help="global batch (split over dp)")
    parser.add_argument("--blocks", type=int, default=2)
    parser.add_argument("--microbatches", type=int, default=2)
    parser.add_argument("--schedule", default="gpipe", choices=["gpipe", "1f1b"])
    parser.add_argument(
        "--stop-at",
        type=int,
        default=0,
        help="in the job's first run, ask to stop at this step, as a preemption would (tests requeue)",
    )
    parser.add_argument("--out", default=os.environ.get("HPC_TRAIN_JOB_FOLDER", "."))
    args, _ = parser.parse_known_args()

    ctx = rt.init()
    par = ctx.parallel
    torch.manual_seed(0)  # every rank builds the same full model; each keeps its shard or stage
    parts = layers(args.blocks)
    pipe = None
    if par is not None and par.pp_size > 1:
        pipe = ctx.pipeline(parts, loss_fn, microbatches=args.microbatches, schedule=args.schedule)
        model = pipe.module
    else:
        model = nn.Sequential(*parts)
    if par is not None and par.tp_size > 1:
        model = ctx.tensor_parallel(model, tp_plan(model))
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    model, optimizer = ctx.prepare(model, optimizer)

    dp = par.dp_size if par is not None else ctx.world_size
    loader = ctx.loader(dataset(), batch_size=args.batch_size // dp)
    ckpt = ctx.checkpointer()
    step = start = ckpt.restore()
    losses: dict[int, float] = {}
    for xb, yb in ctx.batches(loader, start=step):
        if step >= args.steps:
            break
        xb, yb = xb.to(ctx.device), yb.to(ctx.device)
        if pipe is not None:
            loss = pipe.step(xb, yb)
        else:
            loss = loss_fn(model(xb), yb)
            ctx.backward(loss)
        ctx.step()
        step += 1
        loss = loss.detach().clone()
        losses[step] = (dp_all_reduce_mean(ctx, loss) if par is not None else ctx.all_reduce(loss, "mean")).item()
        ctx.print(f"step {step:4d}/{args.steps}  loss {losses[step]:.5f}")
        if args.stop_at and step == args.stop_at and ckpt.run == 1:
            ckpt.watcher.request(f"--stop-at {args.stop_at}")  # what a scheduler's warning signal does
        ckpt.step(step)
    ckpt.close()

    report = {
        "rank": ctx.rank,
        "world_size": ctx.world_size,
        "host": socket.gethostname(),
        "run": ckpt.run,
        "start": start,
        "losses": losses,
        "layout": str(par.layout) if par else None,
        "dp_rank": par.dp_rank if par else ctx.rank,
        "tp_rank": par.tp_rank if par else 0,
        "stage": par.stage if par else 0,
        "params": sum(getattr(p, "_local_tensor", p).numel() for p in ctx.unwrap(model).parameters()),
    }
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, f"rank{ctx.rank}.json"), "w") as f:
        json.dump(report, f)
    ctx.print(f"done: {len(losses)} steps from step {start}")
    ctx.shutdown()


if __name__ == "__main__":
    main()
