// The engine's settings (see config.h): dtypes, the loss scale and the batch arithmetic.
#include "train/config.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <iomanip>
#include <limits>
#include <map>
#include <sstream>
#include <utility>

#include "core/error.h"
#include "optim/registry.h"
#include "optim/schedule.h"

namespace accrue::train {

// Sample positions are int32: an effective batch beyond that cannot be indexed.
static_assert(kMaxBatch == INT32_MAX, "kMaxBatch is the largest int32");

const char* precision_name(Precision p) {
  switch (p) {
    case Precision::kFp32:
      return "fp32";
    case Precision::kFp64:
      return "fp64";
    case Precision::kBf16:
      return "bf16";
    case Precision::kFp16:
      return "fp16";
  }
  return "fp32";
}

Precision parse_precision(const std::string& text) {
  for (Precision p : {Precision::kFp32, Precision::kFp64, Precision::kBf16, Precision::kFp16}) {
    if (text == precision_name(p)) return p;
  }
  throw ValueError("--precision " + text + ": expected fp32, fp64, bf16 or fp16");
}

ResumeRule resume_rule(const std::string& flag) {
  static const std::map<std::string, ResumeRule> kRules = {
      // What the resumed command writes, how it reports and runs on this machine.
      {"--save", ResumeRule::kOwn},
      {"--metrics", ResumeRule::kOwn},
      {"--save-init", ResumeRule::kOwn},
      {"--checkpoint", ResumeRule::kOwn},
      {"--checkpoint-every", ResumeRule::kOwn},
      {"--quiet", ResumeRule::kOwn},
      {"--profile", ResumeRule::kOwn},
      {"--threads", ResumeRule::kOwn},
      {"--comm-timeout", ResumeRule::kOwn},
      // The command itself.
      {"--resume", ResumeRule::kOwn},
      {"--init", ResumeRule::kOwn},
      {"--predict", ResumeRule::kOwn},
      {"--help", ResumeRule::kOwn},
      // Where the data is, how long the run is, when it evaluates, what it keeps.
      {"--data", ResumeRule::kCarried},
      {"--epochs", ResumeRule::kCarried},
      {"--max-steps", ResumeRule::kCarried},
      {"--eval-every", ResumeRule::kCarried},
      {"--keep-best", ResumeRule::kCarried},
      {"--early-stop", ResumeRule::kCarried},
      {"--eval", ResumeRule::kCarried}};
  const auto it = kRules.find(flag);
  return it == kRules.end() ? ResumeRule::kShapes : it->second;
}

DType compute_dtype(Precision precision) {
  switch (precision) {
    case Precision::kFp64:
      return DType::kFloat64;
    case Precision::kBf16:
      return DType::kBFloat16;
    case Precision::kFp16:
      return DType::kFloat16;
    case Precision::kFp32:
      break;
  }
  return DType::kFloat32;
}

DType master_dtype(Precision precision) {
  return precision == Precision::kFp64 ? DType::kFloat64 : DType::kFloat32;
}

std::optional<int64_t> decimal_integer(const std::string& text) {
  const size_t digits = !text.empty() && text[0] == '-' ? 1 : 0;
  if (text.size() == digits || text.find_first_not_of("0123456789", digits) != std::string::npos) {
    return std::nullopt;
  }
  errno = 0;
  const long long v = std::strtoll(text.c_str(), nullptr, 10);
  if (errno == ERANGE) return std::nullopt;
  return static_cast<int64_t>(v);
}

size_t decimal_prefix(const std::string& text) {
  const auto digits_from = [&](size_t at) {
    while (at < text.size() && text[at] >= '0' && text[at] <= '9') ++at;
    return at;
  };
  size_t at = !text.empty() && text[0] == '-' ? 1 : 0;
  const size_t whole = digits_from(at);
  size_t end = whole;
  if (end < text.size() && text[end] == '.') end = digits_from(end + 1);
  if (end == at || (whole == at && end == at + 1)) return 0;  // no digits ("", "-", ".")
  if (end < text.size() && (text[end] == 'e' || text[end] == 'E')) {
    size_t exponent = end + 1;
    if (exponent < text.size() && (text[exponent] == '-' || text[exponent] == '+')) ++exponent;
    const size_t exponent_end = digits_from(exponent);
    if (exponent_end > exponent) end = exponent_end;
  }
  return end;
}

std::optional<double> decimal_number(const std::string& text) {
  if (text.empty() || decimal_prefix(text) != text.size()) return std::nullopt;
  const double v = std::strtod(text.c_str(), nullptr);
  // A value that is not zero but too small for a double ("1e-400") would read as 0: the "off"
  // of --clip and --comm-timeout.
  const size_t mantissa_end = std::min(text.find_first_of("eE"), text.size());
  if (v == 0 && text.substr(0, mantissa_end).find_first_of("123456789") != std::string::npos) {
    return std::nullopt;
  }
  return v;
}

LossScaleSetting LossScaleSetting::parse(const std::string& text) {
  LossScaleSetting s;
  if (text == "auto") return s;
  if (text == "none" || text == "dynamic") {
    s.kind = text == "none" ? Kind::kNone : Kind::kDynamic;
    return s;
  }
  const std::optional<double> scale = decimal_number(text);
  s.kind = Kind::kFixed;
  s.fixed = scale.value_or(0);
  if (!scale || !std::isfinite(s.fixed) || !(s.fixed > 0)) {
    throw ValueError("--loss-scale " + text +
                     ": expected auto, none, dynamic or a positive number");
  }
  // The scale multiplies a float32 loss and divides float32 gradients: beyond float32's normal
  // range it overflows to inf (every step skipped) or flushes to 0.
  if (s.fixed > std::numeric_limits<float>::max() || s.fixed < std::numeric_limits<float>::min()) {
    throw ValueError(str_cat("--loss-scale ", text, ": outside float32's normal range [",
                             std::numeric_limits<float>::min(), ", ",
                             std::numeric_limits<float>::max(), "]"));
  }
  return s;
}

std::string LossScaleSetting::str() const {
  switch (kind) {
    case Kind::kNone:
      return "none";
    case Kind::kDynamic:
      return "dynamic";
    case Kind::kFixed: {
      std::ostringstream out;
      out << std::setprecision(17) << fixed;
      return out.str();
    }
    case Kind::kAuto:
      break;
  }
  return "auto";
}

LossScalePlan resolve_loss_scale(const LossScaleSetting& loss_scale, Precision precision) {
  using Kind = LossScaleSetting::Kind;
  LossScalePlan out;
  if (loss_scale.kind == Kind::kNone ||
      (loss_scale.kind == Kind::kAuto && precision != Precision::kFp16)) {
    return out;
  }
  out.on = true;
  if (loss_scale.kind == Kind::kFixed) {
    out.initial = loss_scale.fixed;
    return out;
  }
  out.scaling.dynamic = true;
  out.initial = 65536.0;  // 2^16, as torch.amp.GradScaler
  return out;
}

double run_lr(const Config& c, int64_t batch) {
  return optim::scale_lr(c.lr, batch, c.base_batch, c.lr_scaling);
}

void check_model_fits(const std::string& what, int64_t parameters, const Config& config) {
  const double master = static_cast<double>(dtype_size(master_dtype(config.precision)));
  const double moments = optim::optimizer_kind(config.optimizer).state_per_parameter;
  const double working = compute_dtype(config.precision) == master_dtype(config.precision) ? 0 : 2;
  const double bytes = static_cast<double>(parameters) * (master * (2 + moments) + working);
  const double memory =
      static_cast<double>(::sysconf(_SC_PHYS_PAGES)) * static_cast<double>(::sysconf(_SC_PAGESIZE));
  if (memory > 0 && bytes > memory) {
    throw ValueError(str_cat(what, ": ", parameters, " parameters need ", bytes / (1 << 30),
                             " GiB of training state (weights, gradients, optimizer state), more "
                             "than this machine's ",
                             memory / (1 << 30), " GiB"));
  }
}

namespace {

// One line for a --batch that the world and the fixed size do not divide: the nearest valid
// effective batches below and above, with the k (or micro-batch) and the learning rate of each.
[[noreturn]] void throw_not_divisible(const Config& c, const optim::BatchConfig& b) {
  const bool k_derived = b.accum_steps == 0;
  const int64_t fixed = k_derived ? b.micro_batch : b.accum_steps;
  const int64_t unit = fixed * b.world_size;  // both checked to be small before
  const auto option = [&](int64_t batch) {
    const double lr = run_lr(c, batch);
    return str_cat(batch, " (", k_derived ? "k = " : "micro-batch ", batch / unit, ", lr ", lr,
                   ")");
  };
  const int64_t below = b.batch / unit * unit, above = below + unit;
  throw ValueError(str_cat(
      "--batch ", b.batch, " is not a multiple of ", b.world_size, " rank",
      b.world_size == 1 ? "" : "s", " x ", k_derived ? "micro-batch " : "accumulation steps ",
      fixed, " = ", unit,
      "; nearest valid effective batches: ", below > 0 ? option(below) + " and " : std::string(),
      option(above), " with --lr-scaling ", optim::lr_scaling_name(c.lr_scaling)));
}

}  // namespace

void check_pipeline(const Config& c, int world_size) {
  if (c.pipeline < 1) throw ValueError(str_cat("--pipeline ", c.pipeline, ": at least 1"));
  if (c.pipeline == 1) return;
  if (world_size % c.pipeline != 0) {
    throw ValueError(str_cat("--pipeline ", c.pipeline, " needs a multiple of ", c.pipeline,
                             " ranks, the launcher started ", world_size));
  }
}

void check_pipeline_depth(int pipeline, int64_t k, const std::string& which_k) {
  if (k < pipeline) {
    throw ValueError(str_cat("--pipeline ", pipeline,
                             " needs at least as many micro-batches per window: ", which_k));
  }
}

void check_batch_splits(int64_t batch, int64_t ranks) {
  if (batch % ranks != 0) {
    throw ValueError(str_cat("--memory-budget: --batch ", batch, " does not split over ", ranks,
                             " ranks; nearest: --batch ", batch / ranks * ranks, " or --batch ",
                             (batch / ranks + 1) * ranks));
  }
}

optim::ResolvedBatch resolve_config_batch(const Config& c, int64_t world_size) {
  if (c.micro_batch < 0 || c.accum_steps < 0 || c.batch < 0) {
    throw ValueError(str_cat("--micro-batch, --accum-steps and --batch must be positive, got ",
                             c.micro_batch, ", ", c.accum_steps, ", ", c.batch));
  }
  // Fewer than two given: the default recipe's 32 x 4 fills in, micro-batch first.
  optim::BatchConfig b{c.batch, c.micro_batch, c.accum_steps, world_size};
  const int given = (b.batch > 0) + (b.micro_batch > 0) + (b.accum_steps > 0);
  if (given < 2 && b.micro_batch == 0) b.micro_batch = 32;
  if (given == 0 || (given == 1 && b.batch == 0 && b.accum_steps == 0)) b.accum_steps = 4;
  const int64_t fixed = b.accum_steps == 0 ? b.micro_batch : b.accum_steps;
  if (b.batch > 0 && (b.micro_batch == 0) != (b.accum_steps == 0) && fixed <= kMaxBatch &&
      world_size <= kMaxBatch && b.batch % (fixed * world_size) != 0) {
    throw_not_divisible(c, b);
  }
  const optim::ResolvedBatch r = optim::resolve_batch(b);
  if (r.batch > kMaxBatch) {
    throw ValueError(str_cat("--batch: ", r.str(), " exceeds ", kMaxBatch,
                             " samples (sample positions are int32)"));
  }
  return r;
}

}  // namespace accrue::train
