// safetensors reading and writing (see checkpoint.h). Reading trusts nothing in the file: the
// header is read first, parsed as strict JSON (optim/strict_json.h) and every value type-checked;
// sizes are multiplied with overflow checks, and the tensors must cover the data exactly, without
// overlaps, holes or trailing bytes, before the data is read. Writing goes through AtomicFile, so
// the previous checkpoint survives a failed save.
#include "optim/safetensors.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/file.h"
#include "kernels/factories.h"
#include "optim/strict_json.h"

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
    case DType::kBFloat16:
      return "BF16";
    case DType::kFloat16:
      return "F16";
    case DType::kInt64:
      return "I64";
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
  else if (s == "I64")
    *out = DType::kInt64;
  else if (s == "BF16")
    *out = DType::kBFloat16;
  else if (s == "F16")
    *out = DType::kFloat16;
  else
    return false;
  return true;
}

// One header entry, validated.
struct Entry {
  std::string name;
  DType dtype;
  Shape shape;
  uint64_t begin, end;
};

// Parses and checks one tensor's header entry; fail(what) builds the error.
template <typename Fail>
Entry parse_entry(const std::string& name, const nlohmann::json& e, uint64_t data_size,
                  const Fail& fail) {
  // A name is quoted in every message about its tensor, and a message is a C string: a NUL would
  // end it there, cutting off what is wrong (other control characters are escaped when printed).
  if (name.find('\0') != std::string::npos) {
    throw fail(str_cat("the tensor name ", brief_json(name), " holds a NUL byte"));
  }
  const auto bad = [&](const std::string& what) { return fail("tensor '" + name + "' " + what); };
  if (!e.is_object()) throw bad("is not a JSON object");
  Entry out{name, DType::kFloat32, {}, 0, 0};
  const auto dtype = e.find("dtype");
  if (dtype == e.end() || !dtype->is_string() ||
      !parse_st_dtype(dtype->get<std::string>(), &out.dtype)) {
    throw bad("has a missing or unsupported dtype (F32, F64, BF16, F16, I32, I64)");
  }
  const auto shape = e.find("shape");
  const auto offsets = e.find("data_offsets");
  if (shape == e.end() || !shape->is_array() || offsets == e.end() || !offsets->is_array() ||
      offsets->size() != 2) {
    throw bad("lacks a shape array or a pair of data_offsets");
  }
  uint64_t numel = 1;
  for (const auto& d : *shape) {
    if (!d.is_number_unsigned() || d.get<uint64_t>() > uint64_t(INT64_MAX)) {
      throw bad(
          str_cat("has a bad dimension ", brief_json(d), " (expected an integer in [0, 2^63))"));
    }
    out.shape.push_back(static_cast<int64_t>(d.get<uint64_t>()));
    if (__builtin_mul_overflow(numel, d.get<uint64_t>(), &numel) || numel > uint64_t(INT64_MAX)) {
      throw bad(str_cat("has shape ", brief_json(*shape), " whose element count overflows"));
    }
  }
  for (const auto& o : *offsets) {
    if (!o.is_number_unsigned()) throw bad(str_cat("has a bad data offset ", brief_json(o)));
  }
  out.begin = (*offsets)[0].get<uint64_t>();
  out.end = (*offsets)[1].get<uint64_t>();
  uint64_t want = 0;
  if (__builtin_mul_overflow(numel, uint64_t(dtype_size(out.dtype)), &want)) {
    throw bad(str_cat("has shape ", brief_json(*shape), " whose byte count overflows"));
  }
  if (out.end < out.begin || out.end - out.begin != want) {
    throw bad(str_cat("has data_offsets [", out.begin, ", ", out.end, "] for ", want, " bytes of ",
                      dtype_name(out.dtype), shape_str(out.shape)));
  }
  if (out.end > data_size) {
    throw fail(str_cat("truncated: tensor '", name, "' ends at byte ", out.end, " of a ", data_size,
                       "-byte data section"));
  }
  return out;
}

// The digest of the metadata (without its own key) and the tensors (host copies), by name.
std::string digest(const std::map<std::string, std::string>& metadata,
                   const std::map<std::string, Tensor>& tensors) {
  uint64_t h = 14695981039346656037ull;
  const auto mix = [&](const void* bytes, size_t n) {
    for (size_t i = 0; i < n; ++i)
      h = (h ^ static_cast<const unsigned char*>(bytes)[i]) * 1099511628211ull;
  };
  const auto mix_text = [&](const std::string& s) { mix(s.c_str(), s.size() + 1); };
  for (const auto& [key, value] : metadata) {
    if (key != kDigestKey) mix_text(key), mix_text(value);
  }
  for (const auto& [name, t] : tensors) {
    mix_text(name);
    mix_text(str_cat(st_dtype(t.dtype()), shape_str(t.shape())));
    mix(t.raw(), t.nbytes());
  }
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(h));
  return hex;
}

}  // namespace

std::map<std::string, std::string> with_digest(std::map<std::string, std::string> metadata,
                                               const std::vector<nn::NamedTensor>& tensors) {
  std::map<std::string, Tensor> host;
  for (const auto& [name, t] : tensors) host.emplace(name, t.to(Device::cpu()));
  metadata[kDigestKey] = digest(metadata, host);
  return metadata;
}

std::optional<NonFinite> first_nonfinite(const Tensor& t) {
  if (!is_floating(t.dtype())) return std::nullopt;
  const Tensor host = to_dtype(t.to(Device::cpu()), DType::kFloat64);
  const double* v = host.data<double>();
  for (int64_t i = 0; i < host.numel(); ++i) {
    if (!std::isfinite(v[i])) return NonFinite{i, v[i]};
  }
  return std::nullopt;
}

void save_safetensors(const std::string& path, const std::vector<nn::NamedTensor>& tensors,
                      const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json header;
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::vector<Tensor> host;
  uint64_t offset = 0;
  for (const auto& [name, t] : tensors) {
    // Checked before the file is opened: a second entry would leave the first one's bytes
    // unclaimed, a file no reader takes, in place of the previous good copy.
    if (header.contains(name)) {
      throw ValueError(str_cat("[safetensors] ", path, ": two tensors are named '", name,
                               "'; nothing was written"));
    }
    host.push_back(t.to(Device::cpu()));
    header[name] = {{"dtype", st_dtype(t.dtype())},
                    {"shape", t.shape()},
                    {"data_offsets", {offset, offset + t.nbytes()}}};
    offset += t.nbytes();
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  AtomicFile out(path);
  const uint64_t size = text.size();
  unsigned char le[8];
  for (int i = 0; i < 8; ++i) le[i] = static_cast<unsigned char>(size >> (8 * i));
  out.write(le, 8);
  out.write(text);
  for (const Tensor& t : host) out.write(t.raw(), t.nbytes());
  out.commit();
}

namespace {

// The largest header read: the format's own reference reader refuses headers over 100 MB.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;

// The header of an open safetensors file, checked against the file's size before it is read;
// header_size its length in bytes.
template <typename Fail>
nlohmann::json read_header(const RegularFile& file, uint64_t& header_size, const Fail& fail) {
  const uint64_t file_size = file.size();
  if (file_size < 8) throw fail(str_cat("truncated: ", file_size, " bytes, no header length"));
  const std::vector<uint8_t> length = file.read(0, 8);
  header_size = 0;
  for (int i = 0; i < 8; ++i) header_size |= uint64_t(length[i]) << (8 * i);
  if (header_size > file_size - 8) {
    throw fail(
        str_cat("header length ", header_size, " exceeds the ", file_size - 8, " bytes after it"));
  }
  if (header_size > kMaxHeaderBytes) {
    throw fail(str_cat("header length ", header_size, " is over the format's limit of ",
                       kMaxHeaderBytes, " bytes"));
  }
  const std::vector<uint8_t> text = file.read(8, header_size);
  nlohmann::json header;
  try {
    header = parse_strict_json(text.begin(), text.end());
  } catch (const std::invalid_argument& e) {
    throw fail(std::string("the header is not valid JSON: ") + e.what());
  }
  if (!header.is_object()) throw fail("the header is not a JSON object");
  return header;
}

// The tensors cover the data exactly: in offset order, each starts where the last ended (no
// overlaps, no holes), and the last ends at the data's end (no trailing bytes).
template <typename Fail>
void check_covers_data(const std::vector<Entry>& entries, uint64_t data_size, const Fail& fail) {
  std::vector<const Entry*> by_offset;
  for (const Entry& e : entries) {
    if (e.end > e.begin) by_offset.push_back(&e);
  }
  std::sort(by_offset.begin(), by_offset.end(),
            [](const Entry* a, const Entry* b) { return a->begin < b->begin; });
  uint64_t covered = 0;
  for (size_t i = 0; i < by_offset.size(); ++i) {
    const Entry& e = *by_offset[i];
    if (e.begin < covered) {
      const Entry& last = *by_offset[i - 1];
      throw fail(str_cat("tensors '", last.name, "' [", last.begin, ", ", last.end, ") and '",
                         e.name, "' [", e.begin, ", ", e.end, ") overlap"));
    }
    if (e.begin > covered) {
      throw fail(str_cat("bytes [", covered, ", ", e.begin, ") of the data belong to no tensor ('",
                         e.name, "' starts at ", e.begin, ")"));
    }
    covered = e.end;
  }
  if (covered != data_size) {
    throw fail(str_cat(data_size - covered, " bytes after the last tensor's end (", covered, " of ",
                       data_size, " bytes of data): trailing bytes"));
  }
}

// A file saved with a digest (with_digest) must still match it.
template <typename Fail>
void check_digest(const nlohmann::json& header, const std::map<std::string, Tensor>& tensors,
                  const Fail& fail) {
  const auto meta = header.find("__metadata__");
  if (meta == header.end() || !meta->contains(kDigestKey)) return;
  const auto metadata = meta->get<std::map<std::string, std::string>>();
  const std::string computed = digest(metadata, tensors);
  if (computed != metadata.at(kDigestKey)) {
    throw fail(str_cat("its metadata or tensors changed after it was saved (", kDigestKey, " ",
                       metadata.at(kDigestKey), ", the contents give ", computed, ")"));
  }
}

// The header's entries of an open file, checked to cover its data exactly; the metadata into
// `metadata` when given. fail(what) builds the error.
template <typename Fail>
std::vector<Entry> read_entries(const RegularFile& file, nlohmann::json& header,
                                uint64_t& header_size, std::map<std::string, std::string>* metadata,
                                const Fail& fail) {
  header = read_header(file, header_size, fail);
  const uint64_t data_size = file.size() - 8 - header_size;
  std::vector<Entry> entries;
  for (auto it = header.begin(); it != header.end(); ++it) {
    if (it.key() == "__metadata__") {
      if (!it.value().is_object()) throw fail("__metadata__ is not a JSON object");
      for (const auto& [key, value] : it.value().items()) {
        if (!value.is_string()) {
          throw fail(str_cat("__metadata__ ", brief_json(key), " is not a string"));
        }
        if (metadata != nullptr) (*metadata)[key] = value.template get<std::string>();
      }
      continue;
    }
    entries.push_back(parse_entry(it.key(), it.value(), data_size, fail));
  }
  check_covers_data(entries, data_size, fail);
  return entries;
}

// Runs read(file, fail) with the format's errors named "[safetensors] <path>: ...", the file's
// own (RegularFile's) too.
template <typename Read>
auto with_safetensors_errors(const std::string& path, const Read& read) {
  const auto fail = [&](const std::string& what) {
    return FileError("[safetensors] " + path + ": " + what);
  };
  try {
    const RegularFile file(path);
    return read(file, fail);
  } catch (const FileError& e) {
    const std::string what = e.what();
    if (what.rfind("[safetensors]", 0) == 0) throw;
    throw FileError("[safetensors] " + what);
  }
}

}  // namespace

std::map<std::string, Tensor> read_safetensors(const std::string& path,
                                               std::map<std::string, std::string>* metadata) {
  return with_safetensors_errors(path, [&](const RegularFile& file, const auto& fail) {
    nlohmann::json header;
    uint64_t header_size = 0;
    const std::vector<Entry> entries = read_entries(file, header, header_size, metadata, fail);
    const std::vector<uint8_t> data = file.read(8 + header_size, file.size() - 8 - header_size);
    std::map<std::string, Tensor> out;
    for (const Entry& e : entries) {
      Tensor t = Tensor::empty(e.shape, e.dtype);
      if (e.end > e.begin) std::memcpy(t.raw(), data.data() + e.begin, e.end - e.begin);
      out.emplace(e.name, t);
    }
    check_digest(header, out, fail);
    return out;
  });
}

std::map<std::string, TensorHeader> read_safetensors_header(
    const std::string& path, std::map<std::string, std::string>* metadata) {
  return with_safetensors_errors(path, [&](const RegularFile& file, const auto& fail) {
    nlohmann::json header;
    uint64_t header_size = 0;
    std::map<std::string, TensorHeader> out;
    for (const Entry& e : read_entries(file, header, header_size, metadata, fail)) {
      out.emplace(e.name, TensorHeader{e.dtype, e.shape});
    }
    return out;
  });
}

void load_parameters(nn::Module& module, const std::string& path) {
  const auto tensors = read_safetensors(path);
  const auto params = module.named_state();    // parameters, then buffers (running statistics)
  std::map<std::string, Tensor> converted_to;  // each tensor in its parameter's dtype
  for (const auto& [name, t] : tensors) {
    const bool known = std::any_of(params.begin(), params.end(),
                                   [&](const nn::NamedTensor& p) { return p.first == name; });
    if (!known) {
      std::string names;
      for (const auto& p : params) names += (names.empty() ? "" : ", ") + p.first;
      throw FileError(str_cat("[load] ", path, " has tensor '", name,
                              "' that the model does not have (the model has: ", names, ")"));
    }
  }
  for (const auto& [name, param] : params) {
    auto it = tensors.find(name);
    if (it == tensors.end()) {
      throw FileError(
          str_cat("[load] ", path, " has no tensor '", name, "' (", param.describe(), ")"));
    }
    // A floating tensor loads into any floating parameter (converted); an integer one into a
    // buffer of its own or a wider integer dtype (an int32 counter into int64).
    const bool kind = is_floating(param.dtype())
                          ? is_floating(it->second.dtype())
                          : integer_widens(it->second.dtype(), param.dtype());
    if (it->second.shape() != param.shape() || !kind) {
      throw FileError(str_cat("[load] ", path, ": tensor '", name, "' is ", it->second.describe(),
                              " but the model expects ", dtype_name(param.dtype()),
                              shape_str(param.shape())));
    }
    // Finite as the parameter will hold it: an F64 1e300 is inf in float32.
    const Tensor& converted =
        converted_to.emplace(name, to_dtype(it->second, param.dtype())).first->second;
    if (const auto bad = is_floating(param.dtype()) ? first_nonfinite(converted) : std::nullopt) {
      const double stored = it->second.view({it->second.numel()}).narrow(bad->index, 1).item();
      throw FileError(str_cat(
          "[load] ", path, ": tensor '", name, "' holds ", stored, " at element ", bad->index,
          std::isfinite(stored) ? str_cat(", ", bad->value, " in ", dtype_name(param.dtype())) : "",
          "; parameters must be finite"));
    }
  }
  // Every check passed: only now is any parameter written.
  for (const auto& [name, param] : params) {
    Tensor target = param;
    target.copy_(converted_to.at(name).to(param.device()));
  }
}

}  // namespace accrue::optim
