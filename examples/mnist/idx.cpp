// IDX reading and writing (see idx.h).
#include "idx.h"

#include <fstream>

#include "core/error.h"

namespace accrue::mnist {

namespace {

constexpr uint32_t kImagesMagic = 0x00000803;
constexpr uint32_t kLabelsMagic = 0x00000801;

std::vector<uint8_t> read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) throw FileError(path + ": cannot open the file");
  std::vector<uint8_t> bytes(static_cast<size_t>(in.tellg()));
  in.seekg(0);
  in.read(reinterpret_cast<char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  if (!in) throw FileError(path + ": read failed");
  return bytes;
}

uint32_t big_endian(const std::vector<uint8_t>& b, size_t at) {
  return uint32_t(b[at]) << 24 | uint32_t(b[at + 1]) << 16 | uint32_t(b[at + 2]) << 8 |
         uint32_t(b[at + 3]);
}

void put_big_endian(std::ofstream& out, uint32_t v) {
  const char b[4] = {char(v >> 24), char(v >> 16), char(v >> 8), char(v)};
  out.write(b, 4);
}

// Checks the header of an IDX file with `dims` dimensions; returns them.
std::vector<int64_t> header(const std::vector<uint8_t>& b, const std::string& path, uint32_t magic,
                            size_t dims) {
  const size_t header_bytes = 4 + 4 * dims;
  if (b.size() < header_bytes) {
    throw FileError(str_cat(path, ": truncated header: ", b.size(), " bytes, expected at least ",
                            header_bytes));
  }
  if (big_endian(b, 0) != magic) {
    throw FileError(str_cat(path, ": wrong magic number 0x", std::hex, big_endian(b, 0),
                            ", expected 0x", magic, " (", dims == 1 ? "labels" : "images",
                            " IDX file)"));
  }
  std::vector<int64_t> sizes;
  int64_t total = 1;
  for (size_t d = 0; d < dims; ++d) {
    sizes.push_back(big_endian(b, 4 + 4 * d));
    total *= sizes.back();
  }
  if (b.size() - header_bytes != static_cast<size_t>(total)) {
    throw FileError(str_cat(path, ": header declares ", shape_str(sizes), " = ", total,
                            " bytes of data but the file has ", b.size() - header_bytes,
                            b.size() - header_bytes < static_cast<size_t>(total)
                                ? " (truncated)"
                                : " (trailing bytes)"));
  }
  return sizes;
}

}  // namespace

IdxImages read_idx_images(const std::string& path) {
  const std::vector<uint8_t> b = read_file(path);
  const auto sizes = header(b, path, kImagesMagic, 3);
  if (sizes[1] == 0 || sizes[2] == 0) {
    throw FileError(str_cat(path, ": images have dimensions ", sizes[1], " x ", sizes[2]));
  }
  return {sizes[0], sizes[1], sizes[2], std::vector<uint8_t>(b.begin() + 16, b.end())};
}

std::vector<uint8_t> read_idx_labels(const std::string& path) {
  const std::vector<uint8_t> b = read_file(path);
  header(b, path, kLabelsMagic, 1);
  return std::vector<uint8_t>(b.begin() + 8, b.end());
}

void write_idx_images(const std::string& path, const IdxImages& images) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  put_big_endian(out, kImagesMagic);
  put_big_endian(out, static_cast<uint32_t>(images.count));
  put_big_endian(out, static_cast<uint32_t>(images.rows));
  put_big_endian(out, static_cast<uint32_t>(images.cols));
  out.write(reinterpret_cast<const char*>(images.pixels.data()),
            static_cast<std::streamsize>(images.pixels.size()));
}

void write_idx_labels(const std::string& path, const std::vector<uint8_t>& labels) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  put_big_endian(out, kLabelsMagic);
  put_big_endian(out, static_cast<uint32_t>(labels.size()));
  out.write(reinterpret_cast<const char*>(labels.data()),
            static_cast<std::streamsize>(labels.size()));
}

}  // namespace accrue::mnist
