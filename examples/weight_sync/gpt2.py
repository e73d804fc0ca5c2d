"""The weight-sync example's model and layouts (docs/weight_sync.md).

A GPT-2-small-shaped transformer built with torch.nn (12 layers, d_model
768, 12 heads, MLP 3072, a vocabulary of 50304: 50257 padded to a multiple
of 64, as Megatron pads it; about 124 M parameters, random weights: nothing
is downloaded), with separate q, k and v projections as a trainer keeps
them.

Trainers hold row chunks of every parameter (dim 0 cut in `trainers`
chunks, as torch.chunk and FSDP cut it). Readers are a tensor-parallel
inference engine of degree `tp`: each holds q, k and v fused into one qkv
of its heads (column-parallel), its columns of the attention output and of
the MLP's second layer (row-parallel), its rows of the MLP's first layer
and of the vocabulary, and the rest whole.

Checksums: a bilinear form of a box of a parameter with weights fixed by
the global indices (`box_checksum`), so that the trainers' partial sums
over their row chunks add up to exactly what a reader computes over its
box: each reader checks every box it holds against the trainers'.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Dict, List, Sequence, Tuple

import torch


@dataclass(frozen=True)
class Shape:
    layers: int = 12
    d_model: int = 768
    heads: int = 12
    mlp: int = 3072
    vocab: int = 50304
    context: int = 1024


GPT2_SMALL = Shape()
# A smaller model of the same structure, for tests.
TINY = Shape(layers=2, d_model=256, heads=4, mlp=1024, vocab=4096,
             context=256)


class Block(torch.nn.Module):
    def __init__(self, s: Shape, device: str = "cpu") -> None:
        super().__init__()
        d = {"device": device}
        self.ln_1 = torch.nn.LayerNorm(s.d_model, **d)
        self.q = torch.nn.Linear(s.d_model, s.d_model, **d)
        self.k = torch.nn.Linear(s.d_model, s.d_model, **d)
        self.v = torch.nn.Linear(s.d_model, s.d_model, **d)
        self.o = torch.nn.Linear(s.d_model, s.d_model, **d)
        self.ln_2 = torch.nn.LayerNorm(s.d_model, **d)
        self.fc1 = torch.nn.Linear(s.d_model, s.mlp, **d)
        self.fc2 = torch.nn.Linear(s.mlp, s.d_model, **d)
        self.heads = s.heads

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        h = self.ln_1(x)
        q, k, v = (p(h).view(b, t, self.heads, c // self.heads).transpose(1, 2)
                   for p in (self.q, self.k, self.v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(c // self.heads)
        mask = torch.ones(t, t, dtype=torch.bool).tril()
        att = att.masked_fill(~mask, float("-inf")).softmax(-1)
        x = x + self.o((att @ v).transpose(1, 2).reshape(b, t, c))
        return x + self.fc2(torch.nn.functional.gelu(self.fc1(self.ln_2(x))))


class GPT2(torch.nn.Module):
    def __init__(self, s: Shape = GPT2_SMALL, device: str = "cpu") -> None:
        super().__init__()
        self.wte = torch.nn.Embedding(s.vocab, s.d_model, device=device)
        self.wpe = torch.nn.Embedding(s.context, s.d_model, device=device)
        self.blocks = torch.nn.ModuleList(Block(s, device)
                                          for _ in range(s.layers))
        self.ln_f = torch.nn.LayerNorm(s.d_model, device=device)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.wte(tokens) + self.wpe(torch.arange(tokens.shape[1]))
        for block in self.blocks:
            x = block(x)
        return self.ln_f(x) @ self.wte.weight.t()


def shapes(s: Shape = GPT2_SMALL) -> Dict[str, Tuple[int, ...]]:
    """Every parameter's name and full shape, without building the model's
    memory twice."""
    model = GPT2(s, device="meta")
    return {name: tuple(p.shape) for name, p in model.state_dict().items()}


def row_chunk(shape: Sequence[int], parts: int, index: int
              ) -> Tuple[int, int]:
    """(first row, rows) of chunk `index` of `parts` along dim 0, as
    torch.chunk cuts it (and ChunkShardingSpec lays it out)."""
    step = -(-shape[0] // parts)
    begin = min(shape[0], index * step)
    return begin, max(0, min(step, shape[0] - begin))


# One box of a parameter in a reader's out: (param, offsets, sizes, out
# name, out offsets).
Box = Tuple[str, Tuple[int, ...], Tuple[int, ...], str, Tuple[int, ...]]


def reader_boxes(s: Shape, tp: int, r: int) -> List[Box]:
    """The boxes reader `r` of a TP=`tp` engine holds, and where each goes
    in its outs (qkv fused)."""
    boxes: List[Box] = []
    for name, shape in shapes(s).items():
        block = name.startswith("blocks.")
        leaf = name.split(".")[-2] if block else name.split(".")[0]
        kind = name.split(".")[-1]
        prefix = ".".join(name.split(".")[:2]) + "." if block else ""
        if leaf in ("q", "k", "v"):
            part = shape[0] // tp
            where = "qkv".index(leaf) * part
            offsets = (r * part,) + (0,) * (len(shape) - 1)
            sizes = (part,) + tuple(shape[1:])
            boxes.append((name, offsets, sizes, f"{prefix}qkv.{kind}",
                          (where,) + (0,) * (len(shape) - 1)))
        elif leaf in ("fc1", "wte"):  # rows: column-parallel, vocab-parallel
            part = shape[0] // tp
            boxes.append((name, (r * part,) + (0,) * (len(shape) - 1),
                          (part,) + tuple(shape[1:]), name,
                          (0,) * len(shape)))
        elif leaf in ("o", "fc2") and kind == "weight":  # row-parallel
            part = shape[1] // tp
            boxes.append((name, (0, r * part), (shape[0], part), name, (0, 0)))
        else:
            boxes.append((name, (0,) * len(shape), tuple(shape), name,
                          (0,) * len(shape)))
    return boxes


def reader_outs(boxes: List[Box], dtype: torch.dtype = torch.float32
                ) -> Dict[str, torch.Tensor]:
    """The reader's tensors, one per out name, sized to hold its boxes."""
    extent: Dict[str, List[int]] = {}
    for _, _, sizes, out, at in boxes:
        end = [a + n for a, n in zip(at, sizes)]
        if out in extent:
            extent[out] = [max(x, y) for x, y in zip(extent[out], end)]
        else:
            extent[out] = end
    return {out: torch.empty(e, dtype=dtype) for out, e in extent.items()}


def _weights(begin: int, count: int, salt: int) -> torch.Tensor:
    """Fixed weights in [0.5, 1.5) for global indices begin..begin+count."""
    index = torch.arange(begin, begin + count, dtype=torch.float64)
    return torch.remainder(index * salt, 1009.0) / 1009.0 + 0.5


def box_checksum(values: torch.Tensor, offsets: Sequence[int]) -> float:
    """a(rows) . values . b(cols) in float64, rows and columns numbered
    globally from `offsets`: additive over disjoint boxes of a parameter."""
    if values.dim() == 1:
        values = values.reshape(-1, 1)
        offsets = (offsets[0], 0)
    rows, cols = values.shape
    a = _weights(offsets[0], rows, 7919)
    b = _weights(offsets[1], cols, 104729)
    return float(a @ (values.to(torch.float64) @ b))


def intersect(a_offsets: Sequence[int], a_sizes: Sequence[int],
              b_offsets: Sequence[int], b_sizes: Sequence[int]
              ) -> Tuple[Tuple[int, ...], Tuple[int, ...]] | None:
    """The common box of two boxes (offsets, sizes), or None."""
    lo = [max(x, y) for x, y in zip(a_offsets, b_offsets)]
    hi = [min(x + n, y + m) for x, n, y, m in
          zip(a_offsets, a_sizes, b_offsets, b_sizes)]
    if any(h <= l for l, h in zip(lo, hi)):
        return None
    return tuple(lo), tuple(h - l for l, h in zip(lo, hi))
