"""The same GPT training step as pretrain_gpt in PyTorch 2.x, eager or torch.compile, fp32 or bf16
autocast: the baseline of benchmarks/compare_pytorch2.sh on the CPU, and of the GPU check's
gpt2_step on a GPU (device cuda: the step is the global batch as micro-batches of MICRO sequences
with gradient accumulation, as pretrain_gpt runs it; timed with torch.cuda.synchronize()). GPT-2 architecture
(pre-LayerNorm, GeLU tanh, learned positions, tied embeddings), AdamW (PyTorch's default foreach
implementation), gradient clipping, causal attention through F.scaled_dot_product_attention.
Prints one line: tokens/s (median of the timed steps).

usage: PYTHONPATH=$TORCH2_DIR python3 pytorch2_gpt_step.py LAYERS HIDDEN HEADS VOCAB SEQ BATCH STEPS THREADS
                                                        eager|compile fp32|bf16 [cpu|cuda [MICRO]]
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
        x = self.wte(tokens) + self.wpe(torch.arange(s, device=tokens.device))
        for block in self.blocks:
            x = block(x)
        logits = self.ln_f(x) @ self.wte.weight.t()  # tied output layer
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1))


def main():
    layers, h, heads, vocab, seq, batch, steps, threads = (int(a) for a in sys.argv[1:9])
    mode, precision = sys.argv[9], sys.argv[10]
    device = sys.argv[11] if len(sys.argv) > 11 else "cpu"
    micro = int(sys.argv[12]) if len(sys.argv) > 12 else batch
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    model = GPT(layers, h, heads, vocab, seq).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1)
    tokens = torch.randint(0, vocab, (batch, seq + 1), device=device)
    fwd = torch.compile(model) if mode == "compile" else model

    def loss_of(x, y):
        if precision == "bf16":
            with torch.autocast(device, dtype=torch.bfloat16):
                return fwd(x, y)
        return fwd(x, y)

    def sync():
        if device == "cuda":
            torch.cuda.synchronize()

    times = []
    warmup = 3 if mode == "compile" else 2
    for step in range(steps + warmup):
        sync()
        start = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        for m in range(0, batch, micro):
            loss = loss_of(tokens[m : m + micro, :-1], tokens[m : m + micro, 1:]) * (min(micro, batch - m) / batch)
            loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sync()
        if step >= warmup:
            times.append(time.perf_counter() - start)
    print(f"{batch * seq / statistics.median(times):.1f}")


if __name__ == "__main__":
    main()
