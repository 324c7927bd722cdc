"""The same GPT training step as pretrain_gpt in PyTorch 2.x on the CPU, eager or torch.compile,
fp32 or bf16 autocast: the baseline of benchmarks/compare_pytorch2.sh. GPT-2 architecture
(pre-LayerNorm, GeLU tanh, learned positions, tied embeddings), AdamW (PyTorch's default foreach
implementation), gradient clipping, causal attention through F.scaled_dot_product_attention.
Prints one line: tokens/s (median of the timed steps).

usage: PYTHONPATH=$TORCH2_DIR python3 pytorch2_gpt_step.py LAYERS HIDDEN HEADS VOCAB SEQ BATCH STEPS THREADS
                                                        eager|compile fp32|bf16
"""
import statistics
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, h, heads):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(h)
        self.qkv = nn.Linear(h, 3 * h)
        self.proj = nn.Linear(h, h)
        self.ln2 = nn.LayerNorm(h)
        self.fc1 = nn.Linear(h, 4 * h)
        self.fc2 = nn.Linear(4 * h, h)

    def forward(self, x):
        b, s, h = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(h, dim=2)
        q, k, v = (t.view(b, s, self.heads, h // self.heads).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, s, h)
        x = x + self.proj(y)
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, layers, h, heads, vocab, seq):
        super().__init__()
        self.wte = nn.Embedding(vocab, h)
        self.wpe = nn.Embedding(seq, h)
        self.blocks = nn.ModuleList(Block(h, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(h)

    def forward(self, tokens, targets):
        s = tokens.shape[1]
        x = self.wte(tokens) + self.wpe(torch.arange(s))
        for block in self.blocks:
            x = block(x)
        logits = self.ln_f(x) @ self.wte.weight.t()  # tied output layer
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1))


def main():
    layers, h, heads, vocab, seq, batch, steps, threads = (int(a) for a in sys.argv[1:9])
    mode, precision = sys.argv[9], sys.argv[10]
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    model = GPT(layers, h, heads, vocab, seq)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1)
    tokens = torch.randint(0, vocab, (batch, seq + 1))
    fwd = torch.compile(model) if mode == "compile" else model

    def loss_of(x, y):
        if precision == "bf16":
            with torch.autocast("cpu", dtype=torch.bfloat16):
                return fwd(x, y)
        return fwd(x, y)

    times = []
    warmup = 3 if mode == "compile" else 2
    for step in range(steps + warmup):
        start = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = loss_of(tokens[:, :-1], tokens[:, 1:])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step >= warmup:
            times.append(time.perf_counter() - start)
    print(f"{batch * seq / statistics.median(times):.1f}")


if __name__ == "__main__":
    main()
