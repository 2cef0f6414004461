// Checkpoints in the safetensors format (an 8-byte little-endian header length, a JSON header of
// name -> {dtype, shape, data_offsets}, then the raw little-endian bytes), with PyTorch's
// parameter names and layouts, so weights move between accrue and PyTorch both ways.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "nn/module.h"

namespace accrue::optim {

// Writes the tensors (any device; copied to the host) and string metadata to path, each in its
// own dtype: BatchNorm's int64 num_batches_tracked as I64, as PyTorch writes it.
void save_safetensors(const std::string& path, const std::vector<nn::NamedTensor>& tensors,
                      const std::map<std::string, std::string>& metadata = {});
// Reads every tensor of a safetensors file onto the host. Throws FileError naming the file and
// what is wrong for a missing, truncated or malformed file.
// metadata, when given, receives the header's __metadata__ (string values; another type is an
// error).
std::map<std::string, Tensor> read_safetensors(
    const std::string& path, std::map<std::string, std::string>* metadata = nullptr);
// What the header says of each tensor, with the same checks (the tensors cover the data exactly)
// but no tensor read: for a look at a file that may be large. The digest is not checked.
struct TensorHeader {
  DType dtype;
  Shape shape;
};
std::map<std::string, TensorHeader> read_safetensors_header(
    const std::string& path, std::map<std::string, std::string>* metadata = nullptr);
// The metadata key of a digest (FNV-1a 64, hex) over the rest of the metadata and every tensor's
// name, dtype, shape and bytes. read_safetensors refuses a file whose digest no longer matches:
// it was edited after it was saved (an edited accrue.g2p.n_head changes no tensor's shape, but
// predicts with another model). Files without one (older ones) are read as before.
inline constexpr const char* kDigestKey = "accrue.digest";
// The metadata with the digest of it and the tensors added under kDigestKey.
std::map<std::string, std::string> with_digest(std::map<std::string, std::string> metadata,
                                               const std::vector<nn::NamedTensor>& tensors);
// Copies the file's tensors into the module's parameters and buffers (in place, so an arena
// keeps them). Every one must be present with its shape; the error names it. Floating tensors
// convert to the parameter's dtype; integer ones load into the same or a wider integer dtype
// (an I32 num_batches_tracked, as older accrue files hold it, into the int64 buffer).
void load_parameters(nn::Module& module, const std::string& path);

// The first non-finite value of a floating tensor (copied to the host) and its index; none for a
// finite or an integer tensor.
struct NonFinite {
  int64_t index;
  double value;
};
std::optional<NonFinite> first_nonfinite(const Tensor& t);

}  // namespace accrue::optim
