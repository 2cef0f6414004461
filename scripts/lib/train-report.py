#!/usr/bin/env python3
"""The table of scripts/gpu-check.sh's train mode: one row per training run, read from the
summary record each run wrote to its --metrics file (train/engine.cpp), plus the peers' lines.

Usage: train-report.py DIR DEVICE COMMIT   (DIR holds NAME.jsonl, NAME.seconds, torch-*.txt and
checks.txt). Writes DIR/train.json and DIR/train.md.
"""
import json
import os
import sys


def summary_of(path):
    with open(path) as f:
        for line in f:
            record = json.loads(line)
            if record.get("event") == "summary":
                return record
    return None


def peer_lines(folder):
    """Each peer's 'key value ...' line: {name: {key: value}}."""
    peers = {}
    for name in sorted(os.listdir(folder)):
        if not (name.startswith("torch-") and name.endswith(".txt")):
            continue
        with open(os.path.join(folder, name)) as f:
            for line in f:
                words = line.split()
                if words and words[0] == "train_seconds":
                    peers[name[:-4]] = {words[i]: words[i + 1] for i in range(0, len(words) - 1, 2)}
    return peers


def mib(n):
    return "%.1f" % (n / 2**20)


def main():
    folder, device, commit = sys.argv[1:4]
    runs = []
    for name in sorted(os.listdir(folder)):
        if not name.endswith(".jsonl"):
            continue
        s = summary_of(os.path.join(folder, name))
        if s is None:
            continue
        s["run"] = name[:-6]
        seconds = os.path.join(folder, s["run"] + ".seconds")
        if os.path.exists(seconds):
            s["wall_seconds"] = float(open(seconds).read().split()[0])
        runs.append(s)
    checks = []
    if os.path.exists(os.path.join(folder, "checks.txt")):
        checks = [l.rstrip("\n") for l in open(os.path.join(folder, "checks.txt")) if l.strip()]
    peers = peer_lines(folder)
    with open(os.path.join(folder, "train.json"), "w") as f:
        json.dump({"device": device, "commit": commit, "runs": runs, "peers": peers,
                   "checks": checks}, f, indent=1)
    out = ["# Training on %s" % device, "",
           "Produced by `scripts/gpu-check.sh train` on %s. One row per run: its summary record "
           "(`--metrics`). `train s` is the engine's training time (evaluation excluded), `first "
           "window s` the part of it the first window took (on a GPU the libraries' start and the "
           "graphs' capture), `wall` the process's; host waits are per training window after the first (reads of the "
           "device, and device waits: blocking copies, synchronisations, queries, cudaMalloc / "
           "cudaFree / cudaHostAlloc); peak is the caching allocator's highest live bytes during a "
           "micro-step, reserved its pool at the end (the graph pool included), in use the "
           "driver's cudaMemGetInfo at the end (every context and library workspace)." % commit,
           "",
           "| run | train s | first window s | wall s | samples/s | tokens/s | metric | peak MiB | activations MiB "
           "| reserved MiB | in use MiB | reads / window | device waits / window | of which "
           "cudaMalloc etc. | graphs | replayed | eager | boundary replays |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for s in runs:
        n = max(s.get("windows_measured", 0), 1)
        metric = s.get("test_accuracy", s.get("test_per"))
        metric_text = "" if metric is None else (
            "acc %.2f%%" % (100 * metric) if "test_accuracy" in s else "PER %.2f%%" % (100 * metric))
        memory = s.get("window_system_memory")
        first = s.get("first_window_seconds")
        out.append("| %s | %.3f | %s | %s | %.0f | %s | %s | %s | %s | %s | %s | %.2f | %.2f | %s | %d | %d | %d | %d |" % (
            s["run"], s["train_seconds"], "" if first is None else "%.3f" % first,
            "%.1f" % s["wall_seconds"] if "wall_seconds" in s else "",
            s["samples_per_second"],
            "%.0f" % s["tokens_per_second"] if s.get("tokens_per_second") else "",
            metric_text, mib(s["peak_bytes"]), mib(s["peak_activation_bytes"]),
            mib(s.get("device_reserved_bytes", 0)), mib(s.get("device_used_bytes", 0)),
            s.get("window_host_reads", 0) / n, s.get("window_device_waits", 0) / n,
            "" if memory is None else "%.2f" % (memory / n), s.get("graphs", 0), s.get("graph_replays", 0), s.get("eager_micro_steps", 0),
            s.get("boundary_replays", 0)))
    if peers:
        out += ["", "PyTorch eager on the same GPU (bench/peers/torch_cuda.py):", "",
                "| peer | train s | samples/s | tokens/s |", "|---|---|---|---|"]
        for name, p in peers.items():
            out.append("| %s | %s | %s | %s |" % (name, p.get("train_seconds", ""),
                                                  p.get("samples_per_second", ""),
                                                  p.get("tokens_per_second", "")))
    if checks:
        out += ["", "Checks:", ""] + ["- " + c for c in checks]
    with open(os.path.join(folder, "train.md"), "w") as f:
        f.write("\n".join(out) + "\n")


if __name__ == "__main__":
    main()
