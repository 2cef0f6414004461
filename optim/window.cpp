// Batch arithmetic and window planning.
#include "optim/window.h"

#include "core/error.h"

namespace accrue::optim {

std::string ResolvedBatch::str() const {
  return str_cat("effective batch ", batch, " = ", world_size, world_size == 1 ? " rank" : " ranks",
                 " x micro-batch ", micro_batch, " x ", accum_steps, " accumulation step",
                 accum_steps == 1 ? "" : "s");
}

ResolvedBatch resolve_batch(const BatchConfig& c) {
  const auto given = [&] {
    return str_cat("batch = ", c.batch, ", micro_batch = ", c.micro_batch,
                   ", accum_steps = ", c.accum_steps, ", world_size = ", c.world_size);
  };
  if (c.batch < 0 || c.micro_batch < 0 || c.accum_steps < 0 || c.world_size < 1) {
    throw ValueError(str_cat("[batch] sizes must be positive (0: derive), got ", given()));
  }
  const int known = (c.batch > 0) + (c.micro_batch > 0) + (c.accum_steps > 0);
  if (known < 2) {
    throw ValueError(
        str_cat("[batch] give at least two of batch, micro_batch and accum_steps; got ", given()));
  }
  ResolvedBatch r{c.batch, c.micro_batch, c.accum_steps, c.world_size};
  // Every product of the given sizes is overflow-checked: a wrapped product would train a
  // nonsense batch, or none.
  const auto product = [&](int64_t a, int64_t b) {
    int64_t p = 0;
    if (__builtin_mul_overflow(a, b, &p)) {
      throw ValueError(str_cat("[batch] ", a, " x ", b, " overflows int64 (", given(), ")"));
    }
    return p;
  };
  if (r.batch == 0) {
    r.batch = product(product(r.micro_batch, r.accum_steps), r.world_size);
  } else if (r.micro_batch == 0) {
    if (r.batch % product(r.accum_steps, r.world_size) != 0) {
      throw ValueError(str_cat("[batch] batch ", r.batch, " is not divisible by accum_steps x ",
                               "world_size = ", r.accum_steps * r.world_size, " (", given(), ")"));
    }
    r.micro_batch = r.batch / (r.accum_steps * r.world_size);
  } else if (r.accum_steps == 0) {
    if (r.batch % product(r.micro_batch, r.world_size) != 0) {
      throw ValueError(str_cat("[batch] batch ", r.batch, " is not divisible by micro_batch x ",
                               "world_size = ", r.micro_batch * r.world_size, " (", given(), ")"));
    }
    r.accum_steps = r.batch / (r.micro_batch * r.world_size);
  } else if (r.batch != product(product(r.micro_batch, r.accum_steps), r.world_size)) {
    throw ValueError(str_cat("[batch] inconsistent: batch ", r.batch, " != micro_batch ",
                             r.micro_batch, " x accum_steps ", r.accum_steps, " x world_size ",
                             r.world_size, " = ", r.micro_batch * r.accum_steps * r.world_size));
  }
  return r;
}

int64_t Window::local_samples() const {
  int64_t n = 0;
  for (const MicroBatch& m : micro) n += m.count;
  return n;
}

std::vector<Window> plan_windows(int64_t num_samples, const ResolvedBatch& batch, LastWindow last,
                                 int rank) {
  if (num_samples < 0) throw ValueError(str_cat("[plan_windows] num_samples = ", num_samples));
  if (batch.micro_batch <= 0 || batch.accum_steps <= 0 || batch.world_size <= 0) {
    throw ValueError(str_cat(
        "[plan_windows] micro_batch = ", batch.micro_batch, ", accum_steps = ", batch.accum_steps,
        " and world_size = ", batch.world_size, " must be positive (use resolve_batch)"));
  }
  if (rank < 0 || rank >= batch.world_size) {
    throw ValueError(str_cat("[plan_windows] rank ", rank, " of ", batch.world_size, " ranks"));
  }
  int64_t per_window = 0;
  if (__builtin_mul_overflow(batch.micro_batch, batch.accum_steps, &per_window) ||
      __builtin_mul_overflow(per_window, batch.world_size, &per_window)) {
    throw ValueError(str_cat("[plan_windows] micro_batch ", batch.micro_batch, " x accum_steps ",
                             batch.accum_steps, " x world_size ", batch.world_size,
                             " overflows int64"));
  }
  std::vector<Window> windows;
  for (int64_t start = 0; start < num_samples; start += per_window) {
    const int64_t samples = std::min(per_window, num_samples - start);
    if (samples < per_window && last == LastWindow::kDrop) break;
    // Rank r's share: [start + r * base + min(r, extra), ...) of base (+1 for r < extra).
    const int64_t base = samples / batch.world_size, extra = samples % batch.world_size;
    const int64_t share_start = start + rank * base + std::min<int64_t>(rank, extra);
    const int64_t share = base + (rank < extra ? 1 : 0);
    Window w{start,
             samples,
             {},
             (base + (extra > 0 ? 1 : 0) + batch.micro_batch - 1) / batch.micro_batch};
    for (int64_t m = share_start; m < share_start + share; m += batch.micro_batch) {
      w.micro.push_back({m, std::min(batch.micro_batch, share_start + share - m)});
    }
    windows.push_back(std::move(w));
  }
  return windows;
}

}  // namespace accrue::optim
