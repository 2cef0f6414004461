#!/usr/bin/env bash
# bench/zero.sh's CSV as the tables of bench/results/zero-cpu.md: each measurement beside its
# formula (docs/zero.md), M being one process's master bytes at the same width.
# Usage: bench/zero-table.sh ZERO.csv > ZERO.md
set -euo pipefail
csv=${1:?usage: bench/zero-table.sh ZERO.csv}
[ -f "$csv" ] || { echo "zero-table.sh: $csv: no such file" >&2; exit 1; }
cpu=$(lscpu | sed -n 's/^Model name: *//p' | head -1)
awk -F, -v cpu="$cpu" '
function mib(b) { return sprintf("%.2f", b / 1048576) }
# The formulas in units of M: parameters, gradients, optimizer state; per window traffic.
function f_par(c, n) { return c == "zero3" ? 1 / n : 1 }
function f_grad(c, n) {
  if (c == "zero0" || c == "zero2-boundary") return 1
  if (c == "zero1") return 1 + 1 / n
  return 1 / n
}
function f_state(c, n) { return c == "zero0" ? 2 : 2 / n }
function f_traffic(c, n, k) {
  if (n == 1 && c == "zero0") return 0
  if (c == "zero0") return 1
  if (c == "zero1" || c == "zero2-boundary") return 2
  if (c == "zero2-micro-step") return k + 1
  return 3 * k
}
NR == 1 { next }
{
  kind[NR] = $1; w[NR] = $2; n[NR] = $3; k[NR] = $4; c[NR] = $5
  par[NR] = $6; grad[NR] = $7; st[NR] = $8; tot[NR] = $9; peak[NR] = $10
  ar[NR] = $11; rs[NR] = $12; ag[NR] = $13; win[NR] = $14
  if ($1 == "memory" && $5 == "zero0" && $3 == 1) { M[$2] = $6; one_total[$2] = $9; one_peak[$2] = $10 }
  if ($1 == "memory-micro-1" && $5 == "zero0" && $3 == 1) { one1_total[$2] = $9; one1_peak[$2] = $10 }
  last = NR
}
END {
  print "ZeRO on the G2P GPT (CMUdict), float32 with Adam, per rank, on " cpu " (every rank a process of this 2-core machine; `bench/zero.sh`). M: one process'"'"'s master bytes at that width (" mib(M[128]) " MiB at width 128, " mib(M[512]) " MiB at width 512). Formulas: docs/zero.md."
  print ""
  print "## Model state after a step, and the window'"'"'s peak (micro-batch 8, k = 4)"
  print ""
  print "Of one process: the ratio to ZeRO 0 on 1 rank at the same width. Peak less activations: (the window'"'"'s peak - one process'"'"'s activations) / one process'"'"'s model state, where one process'"'"'s activations are its peak less its model state (ZeRO shards no activation)."
  print ""
  print "| width | ranks | ZeRO | parameters | gradients | optimizer state | total (MiB) | formula (MiB) | of one process | theory | window peak (MiB) | of one process | peak less activations, of the model state of one process |"
  print "|---|---|---|---|---|---|---|---|---|---|---|---|---|"
  for (i = 2; i <= last; ++i) {
    if (kind[i] != "memory") continue
    m = M[w[i]]
    f = (f_par(c[i], n[i]) + f_grad(c[i], n[i]) + f_state(c[i], n[i])) * m
    act = one_peak[w[i]] - one_total[w[i]]
    printf "| %s | %s | %s | %s | %s | %s | %s | %s | %.3f | %.3f | %s | %.3f | %.3f |\n", w[i], n[i], c[i],
      mib(par[i]), mib(grad[i]), mib(st[i]), mib(tot[i]), mib(f), tot[i] / one_total[w[i]],
      f / (4 * m), mib(peak[i]), peak[i] / one_peak[w[i]], (peak[i] - act) / one_total[w[i]]
  }
  print ""
  print "## The window'"'"'s peak with the fewest activations (micro-batch 1, k = 4)"
  print ""
  print "| width | ranks | ZeRO | model state (MiB) | window peak (MiB) | of one process'"'"'s peak (model state + activations) |"
  print "|---|---|---|---|---|---|"
  for (i = 2; i <= last; ++i) {
    if (kind[i] != "memory-micro-1") continue
    name = c[i] == "zero3" ? "zero3 (prefetch forward, the default)" : c[i]
    printf "| %s | %s | %s | %s | %s | %.3f |\n", w[i], n[i], name, mib(tot[i]), mib(peak[i]),
      peak[i] / one1_peak[w[i]]
  }
  print ""
  print "## Bytes handed to the collectives per window (width 128)"
  print ""
  print "Handed: an all-reduce counts its buffer, a reduce-scatter its input, an all-gather its output. A ring puts 2(N-1)/N of an all-reduce'"'"'s buffer and (N-1)/N of the others'"'"' on the wire per rank."
  print ""
  print "| ranks | k | ZeRO | all-reduce | reduce-scatter | all-gather | handed (MiB) | formula (MiB) | measured / formula | ring wire bytes (MiB) |"
  print "|---|---|---|---|---|---|---|---|---|---|"
  m = M[128]
  for (i = 2; i <= last; ++i) {
    if (kind[i] != "traffic") continue
    per = win[i] > 0 ? win[i] : 1
    h = (ar[i] + rs[i] + ag[i]) / per
    f = f_traffic(c[i], n[i], k[i]) * m
    wire = (ar[i] * 2 * (n[i] - 1) / n[i] + (rs[i] + ag[i]) * (n[i] - 1) / n[i]) / per
    printf "| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", n[i], k[i], c[i], mib(ar[i] / per),
      mib(rs[i] / per), mib(ag[i] / per), mib(h), mib(f), (f > 0 ? sprintf("%.3f", h / f) : "-"), mib(wire)
  }
}' "$csv"
