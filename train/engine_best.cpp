// Evaluation during training and the best weights (engine_run.h): --eval-every takes the task's
// held-out measure between steps; every held-out evaluation -- between steps or at an epoch's
// end -- is compared with the best so far by the measure's own direction; --keep-best writes the
// best one's weights beside the checkpoints, --early-stop ends the run after PATIENCE evaluations
// without improvement. The best so far is part of every checkpoint, so a resumed run chooses as
// the uninterrupted one would. Evaluations change no weight: a run with them ends with the bytes
// of a run without.
#include <filesystem>

#include "optim/safetensors.h"
#include "train/engine_run.h"

namespace accrue::train::engine {

// Before any data is read the command line has checked what it can; a task of the user's may
// still have no held-out measure.
void Run::check_best_can_be_chosen() const {
  if ((c_.keep_best || c_.early_stop > 0) && !task_.validate && !task_.evaluate) {
    throw ValueError(str_cat(c_.keep_best ? "--keep-best" : "--early-stop",
                             " needs a held-out evaluation (Task::validate); ", task_.program,
                             " has none"));
  }
}

// The held-out measure: Task::validate, else Task::evaluate (held out or not).
Evaluation Run::held_out_evaluation() {
  return measure(task_.validate ? task_.validate : task_.evaluate);
}

// --eval-every: the measure after `step`, its log line and record, and the choice of the best.
void Run::evaluate_between_steps(int64_t epoch, int64_t step) {
  const auto start = Clock::now();
  const Evaluation e = held_out_evaluation();
  const double seconds = seconds_since(start);
  nlohmann::json record = {
      {"event", "eval"}, {"step", step}, {"epoch", epoch + 1}, {e.key, e.value}};
  for (const auto& [key, value] : e.details.items()) record[key] = value;
  record["eval_seconds"] = seconds;
  const std::string note = consider_for_best(e, step);
  record["best"] = best_.any && best_.step == step;
  metrics_->emit(record);
  log(str_cat("step ", step, ": ", evaluation_text(e), note));
}

// Only these flags measure the held-out split at every evaluation (without them the last epoch
// may score the test split alone): a "best" would otherwise leave some out.
bool Run::chooses_best() const {
  return c_.eval_every > 0 || c_.keep_best || c_.early_stop > 0;
}

// A held-out evaluation at `step` against the best so far; the note its log line ends with.
std::string Run::consider_for_best(const Evaluation& e, int64_t step) {
  if (!chooses_best() || !e.held_out || step == last_considered_step_) return "";
  last_considered_step_ = step;
  const bool better =
      !best_.any || (e.lower_is_better ? e.value < best_.value : e.value > best_.value);
  if (better) {
    best_ = {true, e.value, step, 0, e.key};
    if (c_.keep_best) write_best_weights(e, step);
  } else {
    ++best_.evaluations_since;
  }
  best_measure_ = e;  // its label and format, with the best value
  best_measure_.value = best_.value;
  if (c_.early_stop > 0 && best_.evaluations_since >= c_.early_stop) stopping_early_ = true;
  if (better) {
    return c_.keep_best ? str_cat(" (best so far: saved to ", best_weights_path(), ")")
                        : " (best so far)";
  }
  return str_cat(" (best ", evaluation_text(best_measure_), " at step ", best_.step, "; ",
                 best_.evaluations_since, " evaluation", best_.evaluations_since == 1 ? "" : "s",
                 " since)");
}

std::string Run::best_weights_path() const {
  return (std::filesystem::path(c_.checkpoint) / kBestWeights).string();
}

// The whole model's weights (every rank takes part in gathering them; the first writes), with
// the task's metadata and the evaluation that chose them.
void Run::write_best_weights(const Evaluation& e, int64_t step) {
  const std::vector<nn::NamedTensor> masters = strategies_->whole_masters(*arena_, *model_);
  write_weights(best_weights_path(), masters,
                {{"accrue.best.step", std::to_string(step)},
                 {"accrue.best." + e.key, json_number(e.value).dump()}});
  wait_for_the_lead(bytes_of(masters));
  best_weights_kept_ = true;
}

// The summary's words about the best: "best validation PER 9.87% at step 1200 (weights in ...)".
std::string Run::best_text() const {
  if (!best_.any) return "";
  return str_cat("best ", evaluation_text(best_measure_), " at step ", best_.step,
                 best_weights_kept_ ? str_cat(" (weights in ", best_weights_path(), ")") : "");
}

}  // namespace accrue::train::engine
