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
  dnnl::primitive_attr attr;
  if (alpha != 1.0f) attr.set_output_scales(0, {alpha});
  if (beta != 0.0f) {
    dnnl::post_ops sum;
    sum.append_sum(beta);
    attr.set_post_ops(sum);
  }
  const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(product->a, product->b, product->c),
                                        attr, cpu_engine());
  product->matmul = dnnl::matmul(pd);
  p = std::move(product);
  return *p;
}

}  // namespace

bool onednn_bf16_available() {
  return cpu_multiplies_bf16();
}

void onednn_bf16_gemm(bool trans_a, bool trans_b, int rows, int cols, int k, float alpha,
                      const bf16* a, int lda, const bf16* b, int ldb, float beta, float* c,
                      int ldc) {
  if (rows == 0 || cols == 0) return;
  try {
    Product& p = product_for(Key{trans_a, trans_b, rows, cols, k, lda, ldb, ldc, alpha, beta});
    thread_local dnnl::stream stream(cpu_engine());
    memory ma(p.a, cpu_engine(), const_cast<bf16*>(a));
    memory mb(p.b, cpu_engine(), const_cast<bf16*>(b));
    memory mc(p.c, cpu_engine(), c);
    p.matmul.execute(stream, {{DNNL_ARG_SRC, ma}, {DNNL_ARG_WEIGHTS, mb}, {DNNL_ARG_DST, mc}});
    stream.wait();
  } catch (const dnnl::error& e) {
    throw BackendError(str_cat("oneDNN error ", static_cast<int>(e.status), " (", e.what(),
                               ") in a bfloat16 matmul [", rows, ", ", k, "] x [", k, ", ", cols,
                               "] at ", __FILE__, ":", __LINE__));
  }
}

#else

bool onednn_bf16_available() {
  return false;
}

void onednn_bf16_gemm(bool, bool, int, int, int, float, const bf16*, int, const bf16*, int, float,
                      float*, int) {
  throw std::logic_error("oneDNN is not in this build");
}

#endif

}  // namespace accrue::cpu
