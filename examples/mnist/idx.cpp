// IDX reading (see idx.h). The header is checked field by field (two zero bytes, the dtype byte
// 0x08 for unsigned bytes, the number of dimensions), the dimensions are multiplied with overflow
// checks, and the product is compared with the file's size before the data is read.
#include "idx.h"

#include <algorithm>

#include "core/error.h"
#include "core/file.h"

namespace accrue::mnist {

namespace {

constexpr uint8_t kUnsignedByte = 0x08;

uint32_t big_endian(const std::vector<uint8_t>& b, size_t at) {
  return uint32_t(b[at]) << 24 | uint32_t(b[at + 1]) << 16 | uint32_t(b[at + 2]) << 8 |
         uint32_t(b[at + 3]);
}

// Checks the header of an IDX file of unsigned bytes with `dims` dimensions against the file's
// size; returns the dimensions.
std::vector<int64_t> header(const RegularFile& file, size_t dims) {
  const std::string& path = file.path();
  const char* kind = dims == 1 ? "labels" : "images";
  const size_t header_bytes = 4 + 4 * dims;
  const std::vector<uint8_t> b = file.read(0, std::min<uint64_t>(file.size(), header_bytes));
  if (b.size() < 4) {
    throw FileError(str_cat(path, ": truncated header: ", b.size(), " bytes, expected at least ",
                            header_bytes, " for an ", kind, " IDX file"));
  }
  if (b[0] != 0 || b[1] != 0) {
    throw FileError(str_cat(path, ": wrong magic number 0x", std::hex, big_endian(b, 0),
                            " (expected 0x", 0x800 + dims, " for an ", kind,
                            " IDX file): not an IDX file"));
  }
  if (b[2] != kUnsignedByte) {
    throw FileError(str_cat(path, ": element type byte 0x", std::hex, int(b[2]),
                            " is not 0x08 (unsigned byte), the only type MNIST uses"));
  }
  if (b[3] != dims) {
    throw FileError(str_cat(path, ": has ", int(b[3]), " dimension(s) but ", kind, " have ", dims,
                            " (magic 0x", std::hex, big_endian(b, 0), ", expected 0x", 0x800 + dims,
                            ")"));
  }
  if (b.size() < header_bytes) {
    throw FileError(str_cat(path, ": truncated header: ", b.size(), " bytes, expected at least ",
                            header_bytes));
  }
  std::vector<int64_t> sizes;
  uint64_t total = 1;
  for (size_t d = 0; d < dims; ++d) {
    sizes.push_back(big_endian(b, 4 + 4 * d));
    if (__builtin_mul_overflow(total, uint64_t(sizes.back()), &total)) {
      throw FileError(str_cat(path, ": header dimensions ", shape_str(sizes),
                              "... overflow a 64-bit byte count"));
    }
  }
  const uint64_t have = file.size() - header_bytes;
  if (have != total) {
    throw FileError(str_cat(path, ": header declares ", shape_str(sizes), " = ", total,
                            " bytes of data but the file has ", have,
                            have < total ? " (truncated)" : " (trailing bytes)"));
  }
  return sizes;
}

}  // namespace

IdxImages read_idx_images(const std::string& path) {
  const RegularFile file(path);
  const auto sizes = header(file, 3);
  if (sizes[1] == 0 || sizes[2] == 0) {
    throw FileError(str_cat(path, ": images have dimensions ", sizes[1], " x ", sizes[2]));
  }
  return {sizes[0], sizes[1], sizes[2], file.read(16, file.size() - 16)};
}

std::vector<uint8_t> read_idx_labels(const std::string& path) {
  const RegularFile file(path);
  header(file, 1);
  return file.read(8, file.size() - 8);
}

}  // namespace accrue::mnist
