// safetensors reading and writing (see checkpoint.h).
#include "optim/checkpoint.h"

#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"

namespace accrue::optim {

namespace {

const char* st_dtype(DType t) {
  switch (t) {
    case DType::kFloat32:
      return "F32";
    case DType::kFloat64:
      return "F64";
    case DType::kInt32:
      return "I32";
  }
  return "?";
}

bool parse_st_dtype(const std::string& s, DType* out) {
  if (s == "F32")
    *out = DType::kFloat32;
  else if (s == "F64")
    *out = DType::kFloat64;
  else if (s == "I32")
    *out = DType::kInt32;
  else
    return false;
  return true;
}

}  // namespace

void save_safetensors(const std::string& path, const std::vector<nn::NamedTensor>& tensors,
                      const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json header;
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::vector<Tensor> host;
  uint64_t offset = 0;
  for (const auto& [name, t] : tensors) {
    host.push_back(t.to(Device::cpu()));
    header[name] = {{"dtype", st_dtype(t.dtype())},
                    {"shape", t.shape()},
                    {"data_offsets", {offset, offset + t.nbytes()}}};
    offset += t.nbytes();
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) throw FileError("[save_safetensors] cannot open " + path + " for writing");
  uint64_t size = text.size();
  unsigned char le[8];
  for (int i = 0; i < 8; ++i) le[i] = static_cast<unsigned char>(size >> (8 * i));
  out.write(reinterpret_cast<const char*>(le), 8);
  out.write(text.data(), static_cast<std::streamsize>(text.size()));
  for (const Tensor& t : host)
    out.write(static_cast<const char*>(t.raw()), static_cast<std::streamsize>(t.nbytes()));
  if (!out) throw FileError("[save_safetensors] writing " + path + " failed");
}

std::map<std::string, Tensor> read_safetensors(const std::string& path) {
  const auto fail = [&](const std::string& what) {
    return FileError("[safetensors] " + path + ": " + what);
  };
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) throw fail("cannot open the file");
  const uint64_t file_size = static_cast<uint64_t>(in.tellg());
  in.seekg(0);
  if (file_size < 8) throw fail(str_cat("truncated: ", file_size, " bytes, no header length"));
  unsigned char le[8];
  in.read(reinterpret_cast<char*>(le), 8);
  uint64_t header_size = 0;
  for (int i = 0; i < 8; ++i) header_size |= uint64_t(le[i]) << (8 * i);
  if (header_size > file_size - 8) {
    throw fail(
        str_cat("header length ", header_size, " exceeds the ", file_size - 8, " bytes after it"));
  }
  std::string text(header_size, '\0');
  in.read(text.data(), static_cast<std::streamsize>(header_size));
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw fail(std::string("the header is not valid JSON: ") + e.what());
  }
  if (!header.is_object()) throw fail("the header is not a JSON object");
  const uint64_t data_size = file_size - 8 - header_size;
  std::vector<char> data(data_size);
  in.read(data.data(), static_cast<std::streamsize>(data_size));
  std::map<std::string, Tensor> out;
  for (auto it = header.begin(); it != header.end(); ++it) {
    if (it.key() == "__metadata__") continue;
    const auto& e = it.value();
    DType dtype;
    if (!e.is_object() || !e.contains("dtype") || !e["dtype"].is_string() ||
        !parse_st_dtype(e["dtype"].get<std::string>(), &dtype)) {
      throw fail("tensor '" + it.key() + "' has a missing or unsupported dtype (F32, F64, I32)");
    }
    if (!e.contains("shape") || !e["shape"].is_array() || !e.contains("data_offsets") ||
        !e["data_offsets"].is_array() || e["data_offsets"].size() != 2) {
      throw fail("tensor '" + it.key() + "' lacks a shape or a pair of data_offsets");
    }
    Shape shape;
    for (const auto& d : e["shape"]) {
      if (!d.is_number_unsigned()) throw fail("tensor '" + it.key() + "' has a bad dimension");
      shape.push_back(d.get<int64_t>());
    }
    const uint64_t begin = e["data_offsets"][0].get<uint64_t>();
    const uint64_t end = e["data_offsets"][1].get<uint64_t>();
    const uint64_t want = static_cast<uint64_t>(shape_numel(shape)) * dtype_size(dtype);
    if (end < begin || end - begin != want) {
      throw fail(str_cat("tensor '", it.key(), "' has data_offsets [", begin, ", ", end, "] for ",
                         want, " bytes of ", dtype_name(dtype), shape_str(shape)));
    }
    if (end > data_size) {
      throw fail(str_cat("truncated: tensor '", it.key(), "' ends at byte ", end, " of a ",
                         data_size, "-byte data section"));
    }
    Tensor t = Tensor::empty(shape, dtype);
    if (want) std::memcpy(t.raw(), data.data() + begin, want);
    out.emplace(it.key(), t);
  }
  return out;
}

void load_parameters(nn::Module& module, const std::string& path) {
  const auto tensors = read_safetensors(path);
  for (auto& [name, param] : module.named_parameters()) {
    auto it = tensors.find(name);
    if (it == tensors.end()) {
      throw FileError(
          str_cat("[load] ", path, " has no tensor '", name, "' (", param.describe(), ")"));
    }
    if (it->second.shape() != param.shape()) {
      throw FileError(str_cat("[load] ", path, ": tensor '", name, "' has shape ",
                              shape_str(it->second.shape()), " but the model expects ",
                              shape_str(param.shape())));
    }
    Tensor value = it->second.to(param.dtype()).to(param.device());
    Tensor target = param;
    target.copy_(value);
  }
}

}  // namespace accrue::optim
