"""A small causal transformer over characters: pre-norm blocks, causal attention, a tied output head."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard


class Block(nn.Module):
    """Causal self-attention then an MLP, each on a layer-normed input and added back to the residual."""

    def __init__(self, width: int, heads: int, dropout: float) -> None:
        super().__init__()
        self.heads = heads
        self.attention_norm = nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width)
        self.attention_out = nn.Linear(width, width)
        self.mlp_norm = nn.LayerNorm(width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, width = x.shape
        q, k, v = self.qkv(self.attention_norm(x)).view(batch, length, 3, self.heads, -1).transpose(1, 3).unbind(2)
        attended = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (batch, heads, length, head width)
        x = x + self.dropout(self.attention_out(attended.transpose(1, 2).reshape(batch, length, width)))
        return x + self.dropout(self.mlp(self.mlp_norm(x)))


class CharTransformer(nn.Module):
    """``model(tokens)`` gives next-character logits, shape (batch, length, vocabulary), for ``length <= context``.

    Each position sees only itself and the positions before it, so the padding after a short
    document changes none of that document's logits.
    """

    def __init__(self, vocabulary: int, context: int, width: int, depth: int, heads: int, dropout: float) -> None:
        super().__init__()
        if width % heads:
            raise ValueError(f"width {width} is not a multiple of heads {heads}; choose a width heads divide")
        self.context = context
        self.token_embedding = nn.Embedding(vocabulary, width)
        self.position_embedding = nn.Embedding(context, width)
        self.blocks = nn.Sequential(*(Block(width, heads, dropout) for _ in range(depth)))
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocabulary, bias=False)
        self.head.weight = self.token_embedding.weight  # tied: one matrix reads and writes characters
        self.dropout = nn.Dropout(dropout)
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, std=0.02)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        x = self.dropout(self.token_embedding(tokens) + self.position_embedding(positions))
        return self.head(self.norm(self.blocks(x)))


def shard(model: CharTransformer, device_type: str, world_size: int, *, bf16: bool) -> None:
    """Shard ``model`` over all ranks with FSDP2: each block, then the root (the embeddings, the tied head and the
    last norm), so a forward gathers one block's weights at a time. With ``bf16`` it computes in bf16 and
    reduces gradients in float32, keeping float32 weights and optimizer state."""
    mesh = init_device_mesh(device_type, (world_size,))
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if bf16 else MixedPrecisionPolicy()
    for block in model.blocks:
        fully_shard(block, mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy)
