"""The models the tests train and trace."""

import torch
import torch.nn as nn


class TinyTransformer(nn.Module):
    """A one-block causal transformer: embedding, layer norm, attention with softmax,
    GELU MLP, language-model head."""

    def __init__(self, vocab=32, dim=16, heads=2, seq=8):
        super().__init__()
        self.heads = heads
        self.embedding = nn.Embedding(vocab, dim)
        self.position = nn.Parameter(torch.randn(seq, dim) * 0.02)
        self.norm1 = nn.LayerNorm(dim)
        self.query = nn.Linear(dim, dim)
        # No key bias: softmax ignores it, so its gradient is rounding noise that AdamW
        # would amplify into differences between any two devices.
        self.key = nn.Linear(dim, dim, bias=False)
        self.value = nn.Linear(dim, dim)
        self.out = nn.Linear(dim, dim)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))
        self.head = nn.Linear(dim, vocab)

    def forward(self, tokens):
        x = self.embedding(tokens) + self.position
        h = self.norm1(x)
        b, s, d = h.shape

        def split(t):
            return t.reshape(b, s, self.heads, d // self.heads).transpose(1, 2)

        q, k, v = split(self.query(h)), split(self.key(h)), split(self.value(h))
        scores = (q @ k.transpose(-2, -1)) / (d // self.heads) ** 0.5
        causal = torch.triu(torch.ones(s, s, dtype=torch.bool, device=h.device), 1)
        weights = scores.masked_fill(causal, float("-inf")).softmax(-1)
        x = x + self.out((weights @ v).transpose(1, 2).reshape(b, s, d))
        x = x + self.mlp(self.norm2(x))
        return self.head(x)


def batches(count, batch=4, seq=8, vocab=32, seed=1):
    generator = torch.Generator().manual_seed(seed)
    return [
        (torch.randint(0, vocab, (batch, seq), generator=generator), torch.randint(0, vocab, (batch, seq), generator=generator))
        for _ in range(count)
    ]


def relative_difference(a, b):
    return ((a - b).abs().max() / (a.abs().max() + 1e-12)).item()
