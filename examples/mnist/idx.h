// Reader for the IDX files MNIST ships in: a big-endian magic number (0x00000803 for images,
// 0x00000801 for labels), the item count, the image dimensions, then one unsigned byte per
// pixel or label. Every field is validated; a bad file raises FileError naming the file and
// what is wrong with it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace accrue::mnist {

struct IdxImages {
  int64_t count = 0, rows = 0, cols = 0;
  std::vector<uint8_t> pixels;  // [count, rows, cols]
};

IdxImages read_idx_images(const std::string& path);
std::vector<uint8_t> read_idx_labels(const std::string& path);

}  // namespace accrue::mnist
