#!/usr/bin/env python3
"""PyTorch eager on a GPU, the peer of accrue's training on the device (scripts/gpu-check.sh
train): the same recipes written the way a PyTorch user writes them, timed the same way.

  mnist [DIR]           the MLP 784-512-256-128-10 (ReLU), Adam lr 1e-3, micro-batch 32 x 4
                        accumulation steps, the loss summed and divided by the window's samples,
                        the gradient norm clipped to 1 once per window, one epoch over a shuffled
                        order; the dataset on the GPU (accrue keeps it there too), normalised as
                        accrue does.
  g2p [DICT] [STEPS]    nanoGPT's model as accrue-g2p builds it (4 pre-LayerNorm blocks, width
                        128, 4 heads, exact GELU, the head tied to the token embedding), on
                        CMUdict's training split (accrue's hash split, letters and apostrophes):
                        windows of 128 sequences sorted by length, micro-batches of 32 padded to
                        their longest, the loss summed over the phoneme targets and divided by
                        the window's, clip 1, AdamW (lr 2e-3, weight decay 0.01) with 200 warmup
                        steps and cosine decay, STEPS optimizer steps (300).

Nothing inside a window reads the GPU back (the losses are summed on the device, as a careful
user does); the clock starts after a synchronisation and stops after one. Prints one line:
"train_seconds S samples_per_second R [tokens_per_second T] last_loss L".
"""
import math
import os
import struct
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


def synchronized_clock():
    torch.cuda.synchronize()
    return time.perf_counter()


def read_idx(path, magic):
    with open(path, "rb") as f:
        data = f.read()
    if struct.unpack(">I", data[:4])[0] != magic:
        raise SystemExit("not an IDX file: " + path)
    dims = struct.unpack(">" + "I" * (magic & 0xFF), data[4:4 + 4 * (magic & 0xFF)])
    body = torch.frombuffer(bytearray(data[4 + 4 * len(dims):]), dtype=torch.uint8)
    return body.view(*dims)


def mnist(folder):
    device = torch.device("cuda")
    images = read_idx(os.path.join(folder, "train-images-idx3-ubyte"), 0x803)
    labels = read_idx(os.path.join(folder, "train-labels-idx1-ubyte"), 0x801)
    x = ((images.view(-1, 784).float() / 255.0 - 0.1307) / 0.3081).to(device)
    y = labels.long().to(device)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 256), nn.ReLU(),
                          nn.Linear(256, 128), nn.ReLU(), nn.Linear(128, 10)).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    micro, k = 32, 4
    n = x.shape[0]
    order = torch.randperm(n, device=device)
    loss_sum = torch.zeros((), device=device)
    start = synchronized_clock()
    for w in range(0, n, micro * k):
        window = order[w:w + micro * k]
        for m in range(0, window.shape[0], micro):
            index = window[m:m + micro]
            loss = F.cross_entropy(model(x[index]), y[index], reduction="sum")
            (loss / window.shape[0]).backward()
            loss_sum += loss.detach()
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    seconds = synchronized_clock() - start
    print("train_seconds %.4f samples_per_second %.1f last_loss %.5f" %
          (seconds, n / seconds, loss_sum.item() / n))




def cmudict_training_sequences(path):
    """accrue's training split of CMUdict: (letters, phonemes) of each training entry."""
    entries = []
    for line in open(path, encoding="latin-1"):
        if line.startswith(";;;") or "  " not in line:
            continue
        word, pron = line.rstrip("\n").split("  ", 1)
        spelling = word.split("(")[0]
        if not spelling or any(not (c.isascii() and (c.isupper() or c == "'")) for c in spelling):
            continue
        h = 14695981039346656037
        for c in spelling.encode():
            h = ((h ^ c) * 1099511628211) % 2**64
        if h % 20 in (0, 1):
            continue
        entries.append((spelling, pron.split()))
    return entries


class Block(nn.Module):
    def __init__(self, c, heads):
        super().__init__()
        self.heads = heads
        self.ln_1, self.ln_2 = nn.LayerNorm(c), nn.LayerNorm(c)
        self.c_attn, self.c_proj = nn.Linear(c, 3 * c), nn.Linear(c, c)
        self.c_fc, self.mlp_proj = nn.Linear(c, 4 * c), nn.Linear(4 * c, c)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(c, dim=2)
        q, k, v = (a.view(b, t, self.heads, c // self.heads).transpose(1, 2) for a in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.c_proj(y.transpose(1, 2).contiguous().view(b, t, c))
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x))))


class GPT(nn.Module):
    def __init__(self, vocab, context, c=128, layers=4, heads=4):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, c), nn.Embedding(context, c)
        self.blocks = nn.ModuleList(Block(c, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(c)

    def forward(self, idx):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
        for block in self.blocks:
            x = block(x)
        return F.linear(self.ln_f(x), self.wte.weight)  # the tied head


def g2p(path, steps):
    device = torch.device("cuda")
    entries = cmudict_training_sequences(path)
    letters = sorted({c for s, _ in entries for c in s})
    phonemes = sorted({p for _, ps in entries for p in ps})
    eos, sep = 0, 1
    token = {c: 2 + i for i, c in enumerate(letters)}
    token.update({p: 2 + len(letters) + i for i, p in enumerate(phonemes)})
    vocab = 2 + len(letters) + len(phonemes)
    sequences = [[token[c] for c in s] + [sep] + [token[p] for p in ps] + [eos]
                 for s, ps in entries]
    context = max(len(s) for s in sequences) - 1
    torch.manual_seed(0)
    model = GPT(vocab, context).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=0.01)
    warmup = 200

    def lr_at(step):
        if step < warmup:
            return 2e-3 * (step + 1) / warmup
        return 2e-3 * 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, steps - warmup)))

    micro, k = 32, 4
    generator = torch.Generator().manual_seed(0)
    order = torch.randperm(len(sequences), generator=generator).tolist()
    tokens = 0
    loss_sum = torch.zeros((), device=device)
    start = synchronized_clock()
    for step in range(steps):
        window = sorted(order[step * micro * k:(step + 1) * micro * k],
                        key=lambda i: len(sequences[i]))
        targets = sum(len(sequences[i]) - sequences[i].index(sep) - 1 for i in window)
        for m in range(0, len(window), micro):
            seqs = [sequences[i] for i in window[m:m + micro]]
            t = max(len(s) for s in seqs) - 1
            inputs = torch.full((len(seqs), t), eos, dtype=torch.long)
            labels = torch.full((len(seqs), t), -100, dtype=torch.long)
            for r, s in enumerate(seqs):
                inputs[r, :len(s) - 1] = torch.tensor(s[:-1])
                at = s.index(sep)
                labels[r, at:len(s) - 1] = torch.tensor(s[at + 1:])
                tokens += len(s) - 1
            inputs = inputs.pin_memory().to(device, non_blocking=True)
            labels = labels.pin_memory().to(device, non_blocking=True)
            logits = model(inputs)
            loss = F.cross_entropy(logits.view(-1, vocab), labels.view(-1), reduction="sum")
            (loss / targets).backward()
            loss_sum += loss.detach()
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    seconds = synchronized_clock() - start
    print("train_seconds %.4f samples_per_second %.1f tokens_per_second %.1f last_loss %.5f" %
          (seconds, steps * micro * k / seconds, tokens / seconds, loss_sum.item() / steps))


def main():
    if len(sys.argv) < 2 or sys.argv[1] not in ("mnist", "g2p"):
        raise SystemExit("usage: torch_cuda.py mnist [DIR] | g2p [DICT] [STEPS]")
    if not torch.cuda.is_available():
        raise SystemExit("torch_cuda.py: PyTorch sees no CUDA device")
    if sys.argv[1] == "mnist":
        mnist(sys.argv[2] if len(sys.argv) > 2 else "data/mnist")
    else:
        g2p(sys.argv[2] if len(sys.argv) > 2 else "data/cmudict/dict.txt",
            int(sys.argv[3]) if len(sys.argv) > 3 else 300)


if __name__ == "__main__":
    main()
