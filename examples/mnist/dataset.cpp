// Loading and normalising MNIST (the epoch's order is train/sample_order.h's).
#include "dataset.h"

#include "idx.h"
#include "kernels/factories.h"

namespace accrue::mnist {

Split load_split(const std::string& dir, const std::string& prefix, int64_t limit, Device device,
                 DType dtype) {
  const std::string image_path = dir + "/" + prefix + "-images-idx3-ubyte";
  const std::string label_path = dir + "/" + prefix + "-labels-idx1-ubyte";
  const IdxImages images = read_idx_images(image_path);
  const std::vector<uint8_t> labels = read_idx_labels(label_path);
  if (static_cast<int64_t>(labels.size()) != images.count) {
    throw FileError(str_cat(label_path, ": holds ", labels.size(), " labels but ", image_path,
                            " holds ", images.count, " images"));
  }
  for (size_t i = 0; i < labels.size(); ++i) {
    if (labels[i] > 9) {
      throw FileError(
          str_cat(label_path, ": label ", int(labels[i]), " at index ", i, " is not a digit"));
    }
  }
  if (images.count == 0) throw FileError(str_cat(image_path, ": holds no samples"));
  // MNIST's images are 28 x 28: a 14 x 56 or 784 x 1 file has as many pixels and is another
  // dataset (or a damaged one).
  if (images.rows != 28 || images.cols != 28) {
    throw FileError(str_cat(image_path, ": images are ", images.rows, " x ", images.cols,
                            ", MNIST's are 28 x 28"));
  }
  if (images.count > INT32_MAX) {
    throw FileError(str_cat(image_path, ": holds ", images.count,
                            " samples, more than int32 sample indices can address"));
  }
  const int64_t n = limit > 0 ? std::min(limit, images.count) : images.count;
  const int64_t pixels = images.rows * images.cols;
  std::vector<float> x(static_cast<size_t>(n * pixels));
  for (size_t i = 0; i < x.size(); ++i) {
    x[i] = (static_cast<float>(images.pixels[i]) / 255.0f - 0.1307f) / 0.3081f;
  }
  std::vector<int32_t> y(labels.begin(), labels.begin() + n);
  return {to_dtype(Tensor::from_vector<float>({n, pixels}, x), dtype).to(device),
          Tensor::from_vector<int32_t>({n}, y, device), image_path};
}

}  // namespace accrue::mnist
