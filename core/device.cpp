// Device parsing and printing.
#include "core/device.h"

#include <fstream>
#include <stdexcept>

#include "core/cuda_seam.h"

namespace accrue {

Device Device::parse(const std::string& text) {
  if (text == "cpu") return cpu();
  if (text == "cuda") return cuda(0);
  // cuda:N with N in decimal digits only (no sign, space or hex), at most 4 of them
  const std::string digits = text.rfind("cuda:", 0) == 0 ? text.substr(5) : "";
  if (!digits.empty() && digits.size() <= 4 &&
      digits.find_first_not_of("0123456789") == std::string::npos) {
    return cuda(std::stoi(digits));
  }
  throw std::invalid_argument("[device] cannot parse '" + text + "': expected cpu, cuda or cuda:N");
}

std::string cpu_model_name() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0) {
      const size_t colon = line.find(':');
      if (colon != std::string::npos) return line.substr(line.find_first_not_of(' ', colon + 1));
    }
  }
  return "unknown CPU";
}

std::string Device::str() const {
  return is_cpu() ? std::string("cpu") : "cuda:" + std::to_string(index);
}

}  // namespace accrue
