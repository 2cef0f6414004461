// The CPU GEMM library comparison behind accrue's choice (bench/results/gemm-libs-*.md). Built
// once per library found (OpenBLAS always; BLIS, oneDNN and libxsmm when their Debian packages
// are installed), each executable times float32 GEMMs at the shapes of the MNIST MLP's micro-step
// at micro-batch 32 (W1: the forward, weight-gradient and input-gradient GEMM of each of its four
// layers) and at 1024^3, two ways: one call threaded by the library itself, and accrue's fixed
// cut (kernels/cpu/gemm_cut.h) with one single-threaded library call per block. The weight
// gradient runs with beta = 1, as it accumulates into the arena. Thread count: OMP_NUM_THREADS.
// These executables do not link accrue: BLIS exports the same cblas_* symbols as OpenBLAS. The
// oneDNN one, in a build whose accrue has oneDNN, also times the bfloat16 products (A and B
// bfloat16, C float32) on a CPU with AVX512-BF16, through accrue's own matmul wrapper
// (kernels/cpu/onednn.h, so it links accrue's kernels): "lib" one matmul over the whole product,
// threaded by oneDNN; "cut" one single-threaded matmul per block, as accrue's bf16 GEMM runs.
#include <benchmark/benchmark.h>
#include <omp.h>

#include <string>
#include <vector>

#include "kernels/cpu/gemm_cut.h"

#if defined(ACCRUE_GEMM_ONEDNN)
#include <oneapi/dnnl/dnnl.h>
#define ACCRUE_GEMM_LIBRARY "onednn"
#if defined(ACCRUE_GEMM_BF16)
#include "kernels/cpu/onednn.h"
#endif
#elif defined(ACCRUE_GEMM_LIBXSMM)
#include <libxsmm.h>
#define ACCRUE_GEMM_LIBRARY "libxsmm"
#else
#include <cblas.h>
#if defined(ACCRUE_GEMM_BLIS)
#define ACCRUE_GEMM_LIBRARY "blis"
#else
#define ACCRUE_GEMM_LIBRARY "openblas"
#endif
#endif

namespace {

// Row-major C [m, n] = op(A) [m, k] op(B) [k, n] + beta C with the library at hand.
void library_gemm(bool ta, bool tb, int m, int n, int k, const float* a, int lda, const float* b,
                  int ldb, float beta, float* c, int ldc) {
#if defined(ACCRUE_GEMM_ONEDNN)
  dnnl_sgemm(ta ? 'T' : 'N', tb ? 'T' : 'N', m, n, k, 1.0f, a, lda, b, ldb, beta, c, ldc);
#elif defined(ACCRUE_GEMM_LIBXSMM)
  // Column-major: C^T [n, m] = op(B)^T op(A)^T.
  const char ta_c = ta ? 'T' : 'N', tb_c = tb ? 'T' : 'N';
  const float one = 1.0f;
  libxsmm_sgemm(&tb_c, &ta_c, &n, &m, &k, &one, b, &ldb, a, &lda, &beta, c, &ldc);
#else
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, m, n,
              k, 1.0f, a, lda, b, ldb, beta, c, ldc);
#endif
}

struct Shape {
  const char* role;
  int m, n, k;
  bool ta, tb;
  float beta;
};

// The micro-step at b = 32 of the MLP 784-512-256-128-10: per layer (in -> out) the forward
// y [32, out] = x w^T, the weight gradient dw [out, in] += dy^T x, the input gradient
// dx [32, in] = dy w.
std::vector<Shape> shapes() {
  std::vector<Shape> s;
  const int sizes[] = {784, 512, 256, 128, 10};
  for (int l = 0; l < 4; ++l) {
    const int in = sizes[l], out = sizes[l + 1];
    s.push_back({"forward", 32, out, in, false, true, 0.0f});
    s.push_back({"weight_grad", out, in, 32, true, false, 1.0f});
    if (l > 0) s.push_back({"input_grad", 32, in, out, false, false, 0.0f});
  }
  s.push_back({"large", 1024, 1024, 1024, false, false, 0.0f});
  return s;
}

void run(benchmark::State& state, Shape s, bool cut) {
  std::vector<float> a(size_t(s.m) * s.k, 0.5f), b(size_t(s.k) * s.n, 0.25f),
      c(size_t(s.m) * s.n, 0.0f);
  const int lda = s.ta ? s.m : s.k, ldb = s.tb ? s.k : s.n;
  for (auto _ : state) {
    if (cut) {
      accrue::cpu::cut_gemm_call(s.ta, s.tb, s.m, s.n, s.k, a.data(), lda, b.data(), ldb, c.data(),
                                 [&](const accrue::cpu::GemmBlock<float>& blk) {
                                   library_gemm(s.ta, s.tb, blk.rows, blk.cols, s.k, blk.a, lda,
                                                blk.b, ldb, s.beta, blk.c, s.n);
                                 });
    } else {
      library_gemm(s.ta, s.tb, s.m, s.n, s.k, a.data(), lda, b.data(), ldb, s.beta, c.data(), s.n);
    }
    benchmark::DoNotOptimize(c.data());
    benchmark::ClobberMemory();
  }
  state.counters["FLOP/s"] = benchmark::Counter(2.0 * s.m * s.n * s.k * double(state.iterations()),
                                                benchmark::Counter::kIsRate);
}

#if defined(ACCRUE_GEMM_BF16)
// The same product in bfloat16 (float32 C) on oneDNN's matmul.
void run_bf16(benchmark::State& state, Shape s, bool cut) {
  using accrue::bf16;
  std::vector<bf16> a(size_t(s.m) * s.k, bf16(0.5f)), b(size_t(s.k) * s.n, bf16(0.25f));
  std::vector<float> c(size_t(s.m) * s.n, 0.0f);
  const int lda = s.ta ? s.m : s.k, ldb = s.tb ? s.k : s.n;
  for (auto _ : state) {
    if (cut) {
      accrue::cpu::cut_gemm_call(s.ta, s.tb, s.m, s.n, s.k, a.data(), lda, b.data(), ldb, c.data(),
                                 [&](const accrue::cpu::GemmBlock<bf16, float>& blk) {
                                   accrue::cpu::onednn_bf16_gemm(s.ta, s.tb, blk.rows, blk.cols,
                                                                 s.k, 1.0f, blk.a, lda, blk.b, ldb,
                                                                 s.beta, blk.c, s.n);
                                 });
    } else {
      accrue::cpu::onednn_bf16_gemm(s.ta, s.tb, s.m, s.n, s.k, 1.0f, a.data(), lda, b.data(), ldb,
                                    s.beta, c.data(), s.n);
    }
    benchmark::DoNotOptimize(c.data());
    benchmark::ClobberMemory();
  }
  state.counters["FLOP/s"] = benchmark::Counter(2.0 * s.m * s.n * s.k * double(state.iterations()),
                                                benchmark::Counter::kIsRate);
}
#endif

// "<library>/<role>/<m>x<n>x<k>/<library|accrue_cut>", the name gemm-libs.sh parses.
std::string name_of(const std::string& library, const Shape& s, bool cut) {
  return library + "/" + s.role + "/" + std::to_string(s.m) + "x" + std::to_string(s.n) + "x" +
         std::to_string(s.k) + (cut ? "/accrue_cut" : "/library");
}

}  // namespace

int main(int argc, char** argv) {
#if defined(ACCRUE_GEMM_LIBXSMM)
  libxsmm_init();
#endif
  for (const Shape& s : shapes()) {
    for (bool cut : {false, true}) {
      benchmark::RegisterBenchmark(name_of(ACCRUE_GEMM_LIBRARY, s, cut).c_str(), run, s, cut);
    }
  }
#if defined(ACCRUE_GEMM_BF16)
  if (accrue::cpu::onednn_bf16_available()) {
    for (const Shape& s : shapes()) {
      for (bool cut : {false, true}) {
        benchmark::RegisterBenchmark(name_of("onednn_bf16", s, cut).c_str(), run_bf16, s, cut);
      }
    }
  }
#endif
  benchmark::AddCustomContext("library", ACCRUE_GEMM_LIBRARY);
  benchmark::AddCustomContext("threads", std::to_string(omp_get_max_threads()));
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
#if defined(ACCRUE_GEMM_LIBXSMM)
  libxsmm_finalize();
#endif
  return 0;
}
