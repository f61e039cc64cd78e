"""A character-level LSTM language model trained with fusetree's autodiff (the seed's workload).

One-hot characters -> LSTM (hidden H) -> output projection -> softmax cross-entropy, trained with
AdamW and global-norm gradient clipping on random windows of a text file; prints the loss with a
progress bar and samples text at the end.

    python examples/char_lstm.py --device cpu --steps 200
    python examples/char_lstm.py --device cuda --mode graph --hidden 512 --batch 128 --seq 64

``--mode eager`` runs the step as ordinary lazy fusetree code, ``jit`` traces the whole step
(forward over T steps, BPTT, clipping, AdamW) once and replays its launches, ``graph`` replays it
as one CUDA graph. The default text is five of Shakespeare's sonnets (public domain), shipped in
examples/data.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import fusetree as ft

DEFAULT_TEXT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "sonnets.txt")
NAMES = ("Wx", "Wh", "b", "Wy", "by")


def lstm_cell(gates, c, xp):
    """gates (B, 4H) -> (h, c): the elementwise part of one LSTM step (gate order i, f, o, g)."""
    H = c.shape[1]
    i = xp.sigmoid(gates[:, :H])
    f = xp.sigmoid(gates[:, H : 2 * H])
    o = xp.sigmoid(gates[:, 2 * H : 3 * H])
    g = xp.tanh(gates[:, 3 * H :])
    c2 = f * c + i * g
    return o * xp.tanh(c2), c2


def init_params(rng: np.random.Generator, vocab: int, hidden: int) -> dict[str, np.ndarray]:
    """Uniform(-1/sqrt(H), 1/sqrt(H)) like torch.nn.LSTM, float32; forget-gate bias 1."""
    k = 1.0 / math.sqrt(hidden)
    p = {
        "Wx": rng.uniform(-k, k, (vocab, 4 * hidden)),
        "Wh": rng.uniform(-k, k, (hidden, 4 * hidden)),
        "b": rng.uniform(-k, k, (4 * hidden,)),
        "Wy": rng.uniform(-k, k, (hidden, vocab)),
        "by": np.zeros(vocab),
    }
    p["b"][hidden : 2 * hidden] += 1.0
    return {n: v.astype(np.float32) for n, v in p.items()}


def loss_fn(params, X, Y):
    """Mean cross-entropy of next-character predictions. X, Y: (T, B, V) one-hot float32.

    The input projection of all T steps is one GEMM up front; each step is one recurrent GEMM and
    one fused cell kernel, which writes h straight into its slot of ``Hs`` (read back as the next
    step's GEMM operand); the output projection and the softmax cross-entropy run once over all T
    steps. The backward pass mirrors it (see fusetree.frontend.autodiff)."""
    T, B, V = X.shape
    H = params["Wh"].shape[0]
    h = ft.zeros((B, H), dtype=np.float32, device=X.device)
    c = ft.zeros((B, H), dtype=np.float32, device=X.device)
    Hs = ft.empty((T, B, H), dtype=np.float32, device=X.device)
    xw = X.reshape(T * B, V) @ params["Wx"] + params["b"]
    for t in range(T):
        h2, c = lstm_cell(xw[t * B : (t + 1) * B] + h @ params["Wh"], c, ft)
        Hs[t] = h2
        h = Hs[t]
    logits = Hs.reshape(T * B, H) @ params["Wy"] + params["by"]
    return -ft.sum(ft.log_softmax(logits, axis=-1) * Y.reshape(T * B, V)) / (T * B)


def train_step(params, m, v, X, Y, lr_t, clip=5.0, b1=0.9, b2=0.999, wd=1e-4, eps=1e-8):
    """One step: loss and gradients, global-norm clipping, AdamW (in place, deferred stores).
    ``lr_t`` is a 0-d array (the bias-corrected step size), so ft.jit does not freeze it."""
    loss, grads = ft.value_and_grad(loss_fn)(params, X, Y)
    norm = ft.sqrt(sum(ft.sum(g * g) for g in grads.values()))
    scale = ft.minimum(clip / (norm + 1e-6), 1.0)
    ft.evaluate(scale, *grads.values())  # once, not inside each parameter's update kernel
    with ft.options(defer_stores=True):
        for n in NAMES:
            g = grads[n] * scale
            m[n][...] = b1 * m[n] + (1 - b1) * g
            v[n][...] = b2 * v[n] + (1 - b2) * (g * g)
            params[n][...] = params[n] - lr_t * (m[n] / (ft.sqrt(v[n]) + eps) + wd * params[n])
    return loss


def one_hot(idx: np.ndarray, vocab: int) -> np.ndarray:
    return np.eye(vocab, dtype=np.float32)[idx]


class Batches:
    """Random windows of the text: (X, Y) one-hot (T, B, V) pairs, Y shifted by one character."""

    def __init__(self, text: str, seq: int, batch: int, seed: int = 0) -> None:
        self.chars = sorted(set(text))
        self.index = {ch: i for i, ch in enumerate(self.chars)}
        self.data = np.array([self.index[ch] for ch in text], np.int64)
        self.seq, self.batch = seq, batch
        self.rng = np.random.default_rng(seed)

    @property
    def vocab(self) -> int:
        return len(self.chars)

    def next(self) -> tuple[np.ndarray, np.ndarray]:
        starts = self.rng.integers(0, len(self.data) - self.seq - 1, self.batch)
        win = np.stack([self.data[s : s + self.seq + 1] for s in starts], axis=1)  # (T+1, B)
        return one_hot(win[:-1], self.vocab), one_hot(win[1:], self.vocab)


def sample(params, batches: Batches, n: int, seed: int = 0, temperature: float = 0.8) -> str:
    """Generate ``n`` characters, one LSTM step at a time, from a start of the text."""
    rng = np.random.default_rng(seed)
    p = {k: v.numpy() for k, v in params.items()}
    H = p["Wh"].shape[0]
    h, c = np.zeros((1, H), np.float32), np.zeros((1, H), np.float32)
    sig = lambda z: 1 / (1 + np.exp(-z))
    ch = batches.data[0]
    out = [batches.chars[ch]]
    for _ in range(n):
        z = one_hot(np.array([ch]), batches.vocab) @ p["Wx"] + h @ p["Wh"] + p["b"]
        i, f, o, g = sig(z[:, :H]), sig(z[:, H : 2 * H]), sig(z[:, 2 * H : 3 * H]), np.tanh(z[:, 3 * H :])
        c = f * c + i * g
        h = o * np.tanh(c)
        logits = (h @ p["Wy"] + p["by"])[0] / temperature
        prob = np.exp(logits - logits.max())
        ch = rng.choice(batches.vocab, p=prob / prob.sum())
        out.append(batches.chars[ch])
    return "".join(out)


class Trainer:
    """Parameters and AdamW state on a device, and the step in a mode (eager, jit, graph)."""

    def __init__(self, init: dict[str, np.ndarray], device: str, mode: str, lr: float = 1e-2) -> None:
        self.params = {n: ft.asarray(init[n].copy(), device=device) for n in NAMES}
        self.m = {n: ft.zeros(init[n].shape, dtype=np.float32, device=device) for n in NAMES}
        self.v = {n: ft.zeros(init[n].shape, dtype=np.float32, device=device) for n in NAMES}
        self.device, self.lr, self.t = device, lr, 0
        self.step_fn = train_step if mode == "eager" else ft.jit(train_step, graph=mode == "graph")

    def step(self, X: np.ndarray, Y: np.ndarray) -> ft.Array:
        self.t += 1
        lr_t = self.lr * math.sqrt(1 - 0.999**self.t) / (1 - 0.9**self.t)
        args = (ft.asarray(X, device=self.device), ft.asarray(Y, device=self.device))
        lr = ft.asarray(np.array(lr_t, np.float32), device=self.device)
        loss = self.step_fn(self.params, self.m, self.v, *args, lr)
        ft.flush()  # the deferred AdamW stores, launched: no wait, the next step is prepared meanwhile
        return loss


def progress(k: int, n: int, loss: float, t0: float) -> None:
    w = 30
    done = int(w * k / n)
    rate = k / max(time.perf_counter() - t0, 1e-9)
    print(
        f"\r[{'#' * done}{'.' * (w - done)}] {k}/{n} loss {loss:.3f} ({rate:.1f} steps/s)", end="", flush=True
    )


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--text", default=DEFAULT_TEXT)
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--mode", default="jit", choices=["eager", "jit", "graph"])
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq", type=int, default=24)
    ap.add_argument("--lr", type=float, default=1e-2)
    ap.add_argument("--sample", type=int, default=200, help="characters to generate at the end")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    if a.mode == "graph" and a.device != "cuda":
        ap.error("--mode graph needs --device cuda")
    with open(a.text, encoding="utf-8") as f:
        text = f.read()
    batches = Batches(text, a.seq, a.batch, a.seed)
    init = init_params(np.random.default_rng(a.seed), batches.vocab, a.hidden)
    tr = Trainer(init, a.device, a.mode, a.lr)
    print(f"char-LSTM: {len(text)} characters, vocab {batches.vocab}, H{a.hidden} B{a.batch} T{a.seq}, "
          f"{a.device} {a.mode}")  # fmt: skip
    losses = []
    t0 = time.perf_counter()
    for k in range(1, a.steps + 1):
        loss = float(tr.step(*batches.next()))
        losses.append(loss)
        if k == 1 or k % 5 == 0 or k == a.steps:
            progress(k, a.steps, loss, t0)
    print()
    first, last = np.mean(losses[:5]), np.mean(losses[-5:])
    print(f"loss {first:.3f} -> {last:.3f} (uniform guess: {math.log(batches.vocab):.3f})")
    if a.sample:
        print("sample:\n" + sample(tr.params, batches, a.sample, a.seed))
    return {"losses": losses, "first": float(first), "last": float(last)}


if __name__ == "__main__":
    main()
