"""Marked training steps of a GRU language model under a budget, by heuristic.

A recurrent network's backward pass reads the time steps' states in the
reverse order of the forward pass, so staleness (``dtr``) evicts the states
needed next; ``dtr-next`` looks ahead from the last marked step instead.
For each heuristic, in this process: a GRU language model (vocabulary 256,
embedding 64, two bidirectional layers of 64 with dropout, 8 sequences of
32 tokens, one thread) trains ``--steps`` steps under ``--ratio`` × its
tracked peak, ending each with ``session.mark_step()``, and each step
prints its wall time, evictions, recomputations, recomputed compute over
the step's own, and whether it followed a plan.

    python python/benchmarks/recurrent_steps.py --ratio 0.7 --steps 6
"""

import argparse
import time

import torch

import dtr.torch


class LanguageModel(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embedding = torch.nn.Embedding(256, 64)
        self.rnn = torch.nn.GRU(64, 64, num_layers=2, dropout=0.1, batch_first=True,
                                bidirectional=True)
        self.head = torch.nn.Linear(128, 256)

    def forward(self, tokens):
        return self.head(self.rnn(self.embedding(tokens))[0])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ratio", type=float, default=0.7)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--heuristics", default="dtr,dtr-next")
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = LanguageModel()
    tokens = torch.randint(0, 256, (8, 32))

    def step():
        logits = model(tokens)
        torch.nn.functional.cross_entropy(logits.flatten(0, 1), tokens.flatten()).backward()

    for _ in range(2):
        step()
    started = time.perf_counter()
    step()
    stock = time.perf_counter() - started
    with dtr.torch.budget(None) as session:
        step()
    peak = session.stats()["peak_bytes"]
    budget = int(args.ratio * peak)
    print(f"stock step {stock * 1e3:.1f} ms; tracked peak {peak} B; budget {budget} B")
    print("heuristic  step  wall_s  evictions  remats  recomputed/compute  planned")
    for heuristic in args.heuristics.split(","):
        with dtr.torch.budget(budget, heuristic=heuristic) as session:
            before = dict(session.stats())
            for k in range(args.steps):
                started = time.perf_counter()
                step()
                session.mark_step()
                wall = time.perf_counter() - started
                now = session.stats()
                delta = {key: now[key] - before[key] for key in
                         ("evictions", "rematerializations", "compute_ns", "remat_compute_ns",
                          "planned_steps")}
                own = delta["compute_ns"] - delta["remat_compute_ns"]
                print(f"{heuristic:<10} {k:>4}  {wall:6.3f}  {delta['evictions']:>9}  "
                      f"{delta['rematerializations']:>6}  "
                      f"{delta['remat_compute_ns'] / own:18.3f}  "
                      f"{'yes' if delta['planned_steps'] else 'no'}")
                before = dict(now)


if __name__ == "__main__":
    main()
