// oneDNN's matmul on one block (see onednn.h). A primitive is made once per shape, leading
// dimensions, transposes and scalars, per thread (oneDNN keeps its own cache of the compiled
// kernels behind them), with alpha as its output scale and beta as a sum post-op: C = alpha
// (A B) + beta C. Called inside accrue's OpenMP team (or with the team held to one thread),
// oneDNN's OpenMP runtime runs it on the calling thread.
//
// Each primitive keeps its operands' memory objects and its argument map, and a call only points
// them at its operands, so a call creates no objects (docs/cpu-speed.md, "oneDNN's calls reuse
// their memory objects"). The scratchpad is the caller's (scratchpad_mode::user), one buffer per
// thread grown to the largest a primitive asks for, rather than oneDNN's own per primitive.
#include "kernels/cpu/onednn.h"

#include <cstdlib>
#include <map>
#include <memory>
#include <stdexcept>
#include <tuple>
#include <unordered_map>

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

// alpha as the output scale, beta as a sum post-op: C = alpha (A B) + beta C; the scratchpad
// is the caller's (thread_scratchpad).
dnnl::primitive_attr scaled_sum(float alpha, float beta) {
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  if (alpha != 1.0f) attr.set_output_scales(0, {alpha});
  if (beta != 0.0f) {
    dnnl::post_ops sum;
    sum.append_sum(beta);
    attr.set_post_ops(sum);
  }
  return attr;
}

// This thread's scratchpad: 64-byte aligned, grown to the largest size asked for, never shrunk.
// A failed growth keeps the buffer it had.
void* thread_scratchpad(size_t bytes) {
  thread_local std::unique_ptr<void, decltype(&std::free)> buffer(nullptr, &std::free);
  thread_local size_t capacity = 0;
  if (bytes > capacity) {
    const size_t rounded = (bytes + 63) / 64 * 64;
    void* grown = std::aligned_alloc(64, rounded);
    if (!grown) {
      throw OutOfMemoryError(str_cat("[onednn] out of host memory for a ", rounded,
                                     "-byte bfloat16 matmul scratchpad"));
    }
    buffer.reset(grown);
    capacity = rounded;
  }
  return buffer.get();
}

// A primitive with its operands' memory objects (pointed at each call's operands) and its
// argument map, made once.
struct Product {
  memory::desc a, b, c;
  dnnl::matmul matmul;
  memory ma, mb, mc, scratchpad;
  size_t scratchpad_bytes = 0;
  std::unordered_map<int, memory> args;
};

// Makes the primitive of pd and the memory objects and arguments that the calls reuse.
void complete(Product& p, const dnnl::matmul::primitive_desc& pd) {
  p.matmul = dnnl::matmul(pd);
  p.ma = memory(p.a, cpu_engine(), DNNL_MEMORY_NONE);
  p.mb = memory(p.b, cpu_engine(), DNNL_MEMORY_NONE);
  p.mc = memory(p.c, cpu_engine(), DNNL_MEMORY_NONE);
  p.args = {{DNNL_ARG_SRC, p.ma}, {DNNL_ARG_WEIGHTS, p.mb}, {DNNL_ARG_DST, p.mc}};
  p.scratchpad_bytes = pd.scratchpad_desc().get_size();
  if (p.scratchpad_bytes > 0) {
    p.scratchpad = memory(pd.scratchpad_desc(), cpu_engine(), DNNL_MEMORY_NONE);
    p.args.emplace(DNNL_ARG_SCRATCHPAD, p.scratchpad);
  }
}

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
  complete(*product,
           dnnl::matmul::primitive_desc(dnnl::matmul::desc(product->a, product->b, product->c),
                                        scaled_sum(alpha, beta), cpu_engine()));
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
  complete(*product,
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
    p.ma.set_data_handle(const_cast<void*>(a));
    p.mb.set_data_handle(const_cast<void*>(b));
    p.mc.set_data_handle(c);
    if (p.scratchpad_bytes > 0) p.scratchpad.set_data_handle(thread_scratchpad(p.scratchpad_bytes));
    p.matmul.execute(stream, p.args);
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
