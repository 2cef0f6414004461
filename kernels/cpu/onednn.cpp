// oneDNN's matmul on one block (see onednn.h). A primitive is made once per shape, leading
// dimensions, transposes and scalars, per thread (oneDNN keeps its own cache of the compiled
// kernels behind them), with alpha as its output scale and beta as a sum post-op: C = alpha
// (A B) + beta C. Called inside accrue's OpenMP team (or with the team held to one thread),
// oneDNN's OpenMP runtime runs it on the calling thread.
#include "kernels/cpu/onednn.h"

#include <map>
#include <memory>
#include <stdexcept>
#include <tuple>

#include "core/error.h"
#include "kernels/cpu/bf16_products.h"

#if defined(ACCRUE_HAVE_ONEDNN)
#include <oneapi/dnnl/dnnl.hpp>
#endif

namespace accrue::cpu {

#if defined(ACCRUE_HAVE_ONEDNN)
namespace {

using dnnl::memory;

dnnl::engine& cpu_engine() {
  static dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  return engine;
}

// alpha as the output scale, beta as a sum post-op: C = alpha (A B) + beta C.
dnnl::primitive_attr scaled_sum(float alpha, float beta) {
  dnnl::primitive_attr attr;
  if (alpha != 1.0f) attr.set_output_scales(0, {alpha});
  if (beta != 0.0f) {
    dnnl::post_ops sum;
    sum.append_sum(beta);
    attr.set_post_ops(sum);
  }
  return attr;
}

struct Product {
  memory::desc a, b, c;
  dnnl::matmul matmul;
};

using Key = std::tuple<bool, bool, int, int, int, int, int, int, float, float>;

// The primitive of one block's shape, made on first use by this thread.
Product& product_for(const Key& key) {
  thread_local std::map<Key, std::unique_ptr<Product>> made;
  std::unique_ptr<Product>& p = made[key];
  if (p) return *p;
  const auto [trans_a, trans_b, rows, cols, k, lda, ldb, ldc, alpha, beta] = key;
  auto product = std::make_unique<Product>();
  // op(A) [rows, k] and op(B) [k, cols] as strided views of the stored matrices; C [rows, cols]
  product->a = memory::desc({rows, k}, memory::data_type::bf16,
                            trans_a ? memory::dims{1, lda} : memory::dims{lda, 1});
  product->b = memory::desc({k, cols}, memory::data_type::bf16,
                            trans_b ? memory::dims{1, ldb} : memory::dims{ldb, 1});
  product->c = memory::desc({rows, cols}, memory::data_type::f32, memory::dims{ldc, 1});
  const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(product->a, product->b, product->c),
                                        scaled_sum(alpha, beta), cpu_engine());
  product->matmul = dnnl::matmul(pd);
  p = std::move(product);
  return *p;
}

// A batch of packed matrices (onednn_bf16_gemm_batched), made on first use by this thread.
using BatchedKey = std::tuple<bool, bool, int, int, int, int, float, float, bool>;
Product& batched_product_for(const BatchedKey& key) {
  thread_local std::map<BatchedKey, std::unique_ptr<Product>> made;
  std::unique_ptr<Product>& p = made[key];
  if (p) return *p;
  const auto [trans_a, trans_b, batch, rows, cols, k, alpha, beta, c_bf16] = key;
  const memory::dim r = rows, n = cols, kk = k;
  auto product = std::make_unique<Product>();
  // op(A[i]) [rows, k], op(B[i]) [k, cols], C[i] [rows, cols], matrix i one stride further on
  product->a = memory::desc({batch, r, kk}, memory::data_type::bf16,
                            trans_a ? memory::dims{r * kk, 1, r} : memory::dims{r * kk, kk, 1});
  product->b = memory::desc({batch, kk, n}, memory::data_type::bf16,
                            trans_b ? memory::dims{kk * n, 1, kk} : memory::dims{kk * n, n, 1});
  product->c =
      memory::desc({batch, r, n}, c_bf16 ? memory::data_type::bf16 : memory::data_type::f32,
                   memory::dims{r * n, n, 1});
  product->matmul = dnnl::matmul(
      dnnl::matmul::primitive_desc(dnnl::matmul::desc(product->a, product->b, product->c),
                                   scaled_sum(alpha, beta), cpu_engine()));
  p = std::move(product);
  return *p;
}

// Runs one matmul on this thread's stream; a oneDNN failure becomes a BackendError naming it.
void execute(Product& p, const void* a, const void* b, void* c, const char* what, int rows, int k,
             int cols) {
  try {
    thread_local dnnl::stream stream(cpu_engine());
    memory ma(p.a, cpu_engine(), const_cast<void*>(a));
    memory mb(p.b, cpu_engine(), const_cast<void*>(b));
    memory mc(p.c, cpu_engine(), c);
    p.matmul.execute(stream, {{DNNL_ARG_SRC, ma}, {DNNL_ARG_WEIGHTS, mb}, {DNNL_ARG_DST, mc}});
    stream.wait();
  } catch (const dnnl::error& e) {
    throw BackendError(str_cat("oneDNN error ", static_cast<int>(e.status), " (", e.what(), ") in ",
                               what, " [", rows, ", ", k, "] x [", k, ", ", cols, "] at ", __FILE__,
                               ":", __LINE__));
  }
}

}  // namespace

bool onednn_bf16_available() {
  return cpu_multiplies_bf16();
}

void onednn_bf16_gemm(bool trans_a, bool trans_b, int rows, int cols, int k, float alpha,
                      const bf16* a, int lda, const bf16* b, int ldb, float beta, float* c,
                      int ldc) {
  if (rows == 0 || cols == 0) return;
  Product* p = nullptr;
  try {
    p = &product_for(Key{trans_a, trans_b, rows, cols, k, lda, ldb, ldc, alpha, beta});
  } catch (const dnnl::error& e) {
    throw BackendError(str_cat("oneDNN error ", static_cast<int>(e.status), " (", e.what(),
                               ") making a bfloat16 matmul at ", __FILE__, ":", __LINE__));
  }
  execute(*p, a, b, c, "a bfloat16 matmul", rows, k, cols);
}

void onednn_bf16_gemm_batched(bool trans_a, bool trans_b, int batch, int rows, int cols, int k,
                              float alpha, const bf16* a, const bf16* b, float beta, void* c,
                              bool c_bf16) {
  if (batch == 0 || rows == 0 || cols == 0) return;
  Product* p = nullptr;
  try {
    p = &batched_product_for(
        BatchedKey{trans_a, trans_b, batch, rows, cols, k, alpha, beta, c_bf16});
  } catch (const dnnl::error& e) {
    throw BackendError(str_cat("oneDNN error ", static_cast<int>(e.status), " (", e.what(),
                               ") making a batched bfloat16 matmul at ", __FILE__, ":", __LINE__));
  }
  execute(*p, a, b, c, "a batched bfloat16 matmul", rows, k, cols);
}

#else

bool onednn_bf16_available() {
  return false;
}

void onednn_bf16_gemm(bool, bool, int, int, int, float, const bf16*, int, const bf16*, int, float,
                      float*, int) {
  throw std::logic_error("oneDNN is not in this build");
}

void onednn_bf16_gemm_batched(bool, bool, int, int, int, int, float, const bf16*, const bf16*,
                              float, void*, bool) {
  throw std::logic_error("oneDNN is not in this build");
}

#endif

}  // namespace accrue::cpu
