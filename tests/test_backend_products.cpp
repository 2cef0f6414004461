// The CPU's products at the library seam, cblas and oneDNN called as the backend calls them: a
// micro-batch product keeps the bytes of its blocks, bf16 products agree on both paths and repeat
// on every thread count, the premises of the transposed products and of the chained direct
// forward hold where the backend relies on them, and OpenBLAS's kernels are chosen as
// blas_core.h says. On every device, a product with beta 0 never reads what its output held.
#include <cmath>
#include <cstring>

#include <cblas.h>
#include <omp.h>

#include "kernels/backend.h"
#include "kernels/cpu/bf16_products.h"
#include "kernels/cpu/blas_core.h"
#include "test_util.h"

namespace accrue::testing {
namespace {

// Direct cblas calls on one thread, as the backend makes them (OpenBLAS's own threading would sum
// in another order).
struct OneBlasThread {
  int threads = omp_get_max_threads();
  OneBlasThread() { omp_set_num_threads(1); }
  ~OneBlasThread() { omp_set_num_threads(threads); }
};

// The CPU backend computes a 32-row micro-batch's column blocks of x w^T (linear_forward, gemm)
// transposed where OpenBLAS's kernels make that the same sums (cpu::blas_transposes_exactly). On
// every machine the bytes must be those of the blocks as written, op(A) op(B_block) in 64-column
// blocks by single-threaded cblas calls (then bias and ReLU for linear_forward): the MLP's
// products, widths leaving a narrower last block (of 8 columns, and of 44: not a whole number of
// the transposition's 8 x 8 tiles), a 31-row batch and the data gradients dy w (never
// transposed), alpha 0.5 and beta 1.
TEST(Backend, MicroBatchProductsKeepTheBytesOfTheirUntransposedBlocks) {
  Backend& be = backend_for(Device::cpu());
  struct Case {
    bool linear, trans_b;
    int m, k, n;
    double alpha, beta;
  };
  const Case cases[] = {{true, true, 32, 784, 512, 1, 0},     {true, true, 32, 512, 256, 1, 0},
                        {true, true, 32, 256, 128, 1, 0},     {true, true, 32, 300, 200, 1, 0},
                        {true, true, 32, 300, 300, 1, 0},     {true, true, 31, 512, 256, 1, 0},
                        {false, true, 32, 784, 512, 0.5, 0},  {false, false, 32, 256, 512, 1, 0},
                        {false, false, 32, 128, 256, 0.5, 0}, {false, false, 32, 128, 3136, 1, 0},
                        {false, false, 32, 512, 784, 1, 0},   {false, false, 32, 256, 512, 1, 1}};
  for (const Case& c : cases) {
    const Tensor x = testing::random({c.m, c.k}, 1, DType::kFloat32);
    const Shape w_shape = c.trans_b ? Shape{c.n, c.k} : Shape{c.k, c.n};
    const Tensor w = testing::random(w_shape, 2, DType::kFloat32);
    const Tensor b = testing::random({c.n}, 3, DType::kFloat32);
    for (bool relu : {false, true}) {
      if (relu && !c.linear) continue;
      Tensor y = testing::random({c.m, c.n}, 6, DType::kFloat32);
      std::vector<float> want(y.data<float>(), y.data<float>() + y.numel());
      if (c.linear) {
        be.linear_forward(x, w, b, relu, y);
      } else {
        be.gemm(false, c.trans_b, c.alpha, x, w, c.beta, y);
      }
      const OneBlasThread one;
      for (int col = 0; col < c.n; col += 64) {
        const float* w_block = w.data<float>() + (c.trans_b ? int64_t{col} * c.k : col);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, c.trans_b ? CblasTrans : CblasNoTrans, c.m,
                    std::min(64, c.n - col), c.k, float(c.alpha), x.data<float>(), c.k, w_block,
                    c.trans_b ? c.k : c.n, float(c.beta), want.data() + col, c.n);
      }
      for (size_t i = 0; c.linear && i < want.size(); ++i) {
        want[i] += b.data<float>()[i % c.n];
        if (relu) want[i] = want[i] > 0.0f ? want[i] : 0.0f;
      }
      EXPECT_EQ(std::memcmp(y.data<float>(), want.data(), want.size() * sizeof(float)), 0)
          << (c.linear ? "linear_forward " : "gemm ") << "[" << c.m << ", " << c.k << "] x "
          << (c.trans_b ? "w^T" : "w") << ", n " << c.n << ", alpha " << c.alpha << ", beta "
          << c.beta << ", relu " << relu << ", OpenBLAS " << cpu::blas_core();
    }
  }
}

// bfloat16 products on both paths (bf16_products.h): the library that multiplies bfloat16
// natively where this CPU and build have one, and sgemm on float32 panels. On each path the bits
// are the same on 1, 2 and 4 threads (accrue's fixed cut, one library call per block). The two
// paths sum the same exact products in other orders: within 1e-5 of the inner dimension (the
// products are ~N(0, 1), their magnitudes summed about k), and one bfloat16 rounding where C is
// bfloat16. Shapes of the MNIST MLP (forward x w^T, data gradient dy w, weight gradient dy^T x
// into float32 with beta 1), of attention (a batch of q k^T into bfloat16, and of q^T k into
// float32 with beta 1: batched matmuls on oneDNN, gemm.cpp) and of the MNIST CNN's
// conv2 (its three passes, the filter gradient into float32 with beta 1; K = 32 3 3).
TEST(Backend, Bf16ProductsAgreeOnBothPathsAndRepeatOnEveryThreadCount) {
  Backend& be = backend_for(Device::cpu());
  const auto bf = [](const Shape& shape, uint64_t seed) {
    return to_dtype(random(shape, seed, DType::kFloat32), DType::kBFloat16);
  };
  const Tensor x = bf({32, 784}, 1), w = bf({512, 784}, 2), dy = bf({32, 512}, 3),
               q = bf({8, 20, 16}, 4), k = bf({8, 20, 16}, 5);
  const Tensor grad0 = random({512, 784}, 6, DType::kFloat32);
  const Tensor image = bf({8, 32, 14, 14}, 7), filter = bf({64, 32, 3, 3}, 8),
               dimage = bf({8, 64, 14, 14}, 9);
  const Tensor filter_grad0 = random({64, 32, 3, 3}, 10, DType::kFloat32),
               bias_grad0 = random({64}, 11, DType::kFloat32);
  const Conv2dGeometry same{1, 1, 1, 1, 1, 1};
  struct Case {
    const char* name;
    int k;
    bool bf16_out;
    std::function<Tensor()> run;
  };
  const std::vector<Case> cases{
      {"forward x w^T", 784, true,
       [&] {
         Tensor y = Tensor::empty({32, 512}, DType::kBFloat16);
         be.gemm(false, true, 1.0, x, w, 0.0, y);
         return to_dtype(y, DType::kFloat32);
       }},
      {"data gradient dy w", 512, false,
       [&] {
         Tensor dx = Tensor::empty({32, 784}, DType::kFloat32);
         be.gemm(false, false, 1.0, dy, w, 0.0, dx);
         return dx;
       }},
      {"weight gradient dy^T x, beta 1", 32, false,
       [&] {
         Tensor dw = grad0.clone();
         be.gemm(true, false, 0.5, dy, x, 1.0, dw);
         return dw;
       }},
      {"attention q k^T", 16, true,
       [&] {
         Tensor s = Tensor::empty({8, 20, 20}, DType::kBFloat16);
         be.gemm_batched(false, true, 1.0, q, k, 0.0, s);
         return to_dtype(s, DType::kFloat32);
       }},
      {"a batch of q^T k into float32, beta 1", 20, false,
       [&] {
         Tensor s = random({8, 16, 16}, 12, DType::kFloat32);
         be.gemm_batched(true, false, 0.5, q, k, 1.0, s);
         return s;
       }},
      {"conv2 forward", 288, true,
       [&] {
         Tensor y = Tensor::empty({8, 64, 14, 14}, DType::kBFloat16);
         be.conv2d_forward(image, filter, Tensor(), same, y);
         return to_dtype(y, DType::kFloat32);
       }},
      {"conv2 data gradient", 64 * 9, true,
       [&] {
         Tensor dx = Tensor::empty({8, 32, 14, 14}, DType::kBFloat16);
         be.conv2d_backward_data(dimage, filter, same, dx);
         return to_dtype(dx, DType::kFloat32);
       }},
      {"conv2 filter gradient, beta 1", 8 * 196, false,
       [&] {
         Tensor dw = filter_grad0.clone(), db = bias_grad0.clone();
         be.conv2d_backward_filter(dimage, image, same, 1.0, dw, db);
         std::vector<float> both = dw.to_vector<float>(), bias = db.to_vector<float>();
         both.insert(both.end(), bias.begin(), bias.end());
         return Tensor::from_vector<float>({int64_t(both.size())}, both);
       }},
  };
  const int saved = cpu_threads();
  const cpu::Bf16Products before = cpu::bf16_products();
  for (const Case& c : cases) {
    std::vector<std::vector<float>> paths;
    for (cpu::Bf16Products p : {cpu::Bf16Products::kNative, cpu::Bf16Products::kConverted}) {
      cpu::set_bf16_products(p);
      SCOPED_TRACE(str_cat(c.name, " on ", cpu::bf16_products_library()));
      std::vector<std::vector<float>> runs;
      for (int threads : {1, 2, 4}) {
        set_cpu_threads(threads);
        runs.push_back(c.run().to_vector<float>());
      }
      EXPECT_EQ(runs[0], runs[1]);
      EXPECT_EQ(runs[0], runs[2]);
      paths.push_back(runs[0]);
    }
    for (size_t i = 0; i < paths[0].size(); ++i) {
      const double bound = 1e-5 * c.k + (c.bf16_out ? std::abs(paths[1][i]) / 128 : 0.0);
      EXPECT_NEAR(paths[0][i], paths[1][i], bound) << c.name << " element " << i;
    }
  }
  cpu::set_bf16_products(before);
  set_cpu_threads(saved);
  std::cout << "bfloat16 products natively on: " << [] {
    cpu::set_bf16_products(cpu::Bf16Products::kNative);
    return cpu::bf16_products_library();
  }() << "\n";
  cpu::set_bf16_products(before);
}

// The premise of the transposed products (cpu::blas_transposes_exactly): where it holds, cblas
// gives C^T = B A^T the same bytes as C = A B^T for the shapes the backend computes transposed
// (the CNN's conv2 filter gradient per chunk, the MLP's forward blocks). Where it does not
// (OpenBLAS's AVX2 kernels) the backend keeps every product as written, and there is nothing to
// check.
// beta = 0 overwrites c: what it held, NaN included, never reaches the result. cuBLAS documents
// it; cuBLASLt, which CUDA's Linear forward uses, does not say. On every device: float32,
// float64 and bf16 operands into a float32 c, each operand order, and the Linear forward.
TEST(Backend, ProductsWithBetaZeroNeverReadWhatTheOutputHeld) {
  struct Types {
    DType operands, out;
  };
  for (const Device d : devices()) {
    Backend& be = backend_for(d);
    for (const Types t :
         {Types{DType::kFloat32, DType::kFloat32}, Types{DType::kFloat64, DType::kFloat64},
          Types{DType::kBFloat16, DType::kFloat32}}) {
      for (const bool trans_a : {false, true}) {
        for (const bool trans_b : {false, true}) {
          const Tensor a = random(trans_a ? Shape{7, 5} : Shape{5, 7}, 1, t.operands).to(d);
          const Tensor b = random(trans_b ? Shape{3, 7} : Shape{7, 3}, 2, t.operands).to(d);
          Tensor zeroed = Tensor::zeros({5, 3}, t.out, d);
          Tensor poisoned = Tensor::empty({5, 3}, t.out, d);
          be.fill(poisoned, NAN);
          be.gemm(trans_a, trans_b, 1.0, a, b, 0.0, zeroed);
          be.gemm(trans_a, trans_b, 1.0, a, b, 0.0, poisoned);
          const std::vector<double> got = as_doubles(poisoned);
          EXPECT_EQ(got, as_doubles(zeroed))
              << d.str() << " " << dtype_name(t.operands) << " trans " << trans_a << trans_b;
          for (const double v : got) ASSERT_FALSE(std::isnan(v)) << d.str();
        }
      }
      if (t.operands != t.out) continue;
      const Tensor x = random({4, 6}, 3, t.out).to(d), w = random({5, 6}, 4, t.out).to(d);
      const Tensor bias = random({5}, 5, t.out).to(d);
      Tensor zeroed = Tensor::zeros({4, 5}, t.out, d);
      Tensor poisoned = Tensor::empty({4, 5}, t.out, d);
      be.fill(poisoned, NAN);
      be.linear_forward(x, w, bias, false, zeroed);
      be.linear_forward(x, w, bias, false, poisoned);
      EXPECT_EQ(as_doubles(poisoned), as_doubles(zeroed)) << d.str() << " linear_forward";
    }
  }
}

TEST(Backend, BlasTransposesExactlyWhereTheBackendTransposes) {
  if (!cpu::blas_transposes_exactly()) {
    GTEST_SKIP() << "OpenBLAS " << cpu::blas_core()
                 << ": the two orientations round differently, so the backend never transposes";
  }
  struct Case {
    int m, n, k;  // C [m, n] = A [m, k] B [n, k]^T
  };
  for (const Case& c : {Case{64, 288, 588}, Case{64, 288, 196}, Case{32, 64, 784},
                        Case{32, 64, 512}, Case{32, 64, 256}}) {
    const Tensor a = testing::random({c.m, c.k}, 4, DType::kFloat32);
    const Tensor b = testing::random({c.n, c.k}, 5, DType::kFloat32);
    std::vector<float> ab(size_t(c.m) * c.n), ba(size_t(c.n) * c.m);
    const OneBlasThread one;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, c.m, c.n, c.k, 1.0f, a.data<float>(), c.k,
                b.data<float>(), c.k, 0.0f, ab.data(), c.n);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, c.n, c.m, c.k, 1.0f, b.data<float>(), c.k,
                a.data<float>(), c.k, 0.0f, ba.data(), c.m);
    int64_t differ = 0;
    for (int i = 0; i < c.m; ++i) {
      for (int j = 0; j < c.n; ++j) {
        differ += std::memcmp(&ab[i * c.n + j], &ba[j * c.m + i], sizeof(float)) != 0;
      }
    }
    EXPECT_EQ(differ, 0) << "[" << c.m << ", " << c.k << "] x [" << c.n << ", " << c.k
                         << "]^T on OpenBLAS " << cpu::blas_core();
  }
}

// The premise of the direct forward's default (cpu::blas_chains_short_products): where it holds,
// cblas computes C + A B, for the inner sizes k = 1 ... 9 of small patches, as C + (one
// multiply-add chain from +0 over k in order), bit for bit, in float32 and float64.
TEST(Backend, BlasChainsShortProductsWhereTheDirectForwardRuns) {
  if (!cpu::blas_chains_short_products()) {
    GTEST_SKIP()
        << "OpenBLAS " << cpu::blas_core()
        << ": short products are summed otherwise, so the direct forward is not the default";
  }
  const OneBlasThread one;
  const int m = 32, n = 200;
  for (int k = 1; k <= 9; ++k) {
    const Tensor a = testing::random({m, k}, 4), b = testing::random({k, n}, 5);
    const Tensor c = testing::random({m, 1}, 6);
    std::vector<double> ab(size_t(m) * n);
    std::vector<float> ab32(size_t(m) * n);
    const Tensor a32 = to_dtype(a, DType::kFloat32), b32 = to_dtype(b, DType::kFloat32),
                 c32 = to_dtype(c, DType::kFloat32);
    for (int i = 0; i < m; ++i) {
      std::fill_n(ab.begin() + i * n, n, c.data<double>()[i]);
      std::fill_n(ab32.begin() + i * n, n, c32.data<float>()[i]);
    }
    cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, n, k, 1.0, a.data<double>(), k,
                b.data<double>(), n, 1.0, ab.data(), n);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, n, k, 1.0f, a32.data<float>(), k,
                b32.data<float>(), n, 1.0f, ab32.data(), n);
    int64_t differ = 0;
    for (int i = 0; i < m; ++i) {
      for (int j = 0; j < n; ++j) {
        double chain = 0;
        float chain32 = 0;
        for (int t = 0; t < k; ++t) {
          chain = std::fma(a.data<double>()[i * k + t], b.data<double>()[t * n + j], chain);
          chain32 = std::fma(a32.data<float>()[i * k + t], b32.data<float>()[t * n + j], chain32);
        }
        const double want = c.data<double>()[i] + chain;
        const float want32 = c32.data<float>()[i] + chain32;
        differ += std::memcmp(&ab[i * n + j], &want, sizeof want) != 0;
        differ += std::memcmp(&ab32[i * n + j], &want32, sizeof want32) != 0;
      }
    }
    EXPECT_EQ(differ, 0) << "[" << m << ", " << k << "] x [" << k << ", " << n << "] on OpenBLAS "
                         << cpu::blas_core();
  }
}

// OpenBLAS's kernels: the core asked for (or "": keep) from the running core, the user's
// OPENBLAS_CORETYPE and the CPU's vector level (4 AVX-512 with BF16, 3 AVX-512, 2 AVX2, 1 older).
TEST(BlasCore, AsksForTheCpusOwnKernelsOnlyWhenTheRunningOnesAreLowerAndTheUserChoseNone) {
  struct Row {
    const char* running;
    const char* env;
    int cpu_level;
    const char* want;
  };
  const Row rows[] = {
      {"Prescott", nullptr, 4, "Cooperlake"},  // a Xeon OpenBLAS 0.3.21 does not know
      {"Prescott", "", 4, "Cooperlake"},       // empty is unset
      {"unknown", nullptr, 4, "Cooperlake"},
      {"SkylakeX", nullptr, 4, "Cooperlake"},
      {"Prescott", nullptr, 3, "SkylakeX"},
      {"Haswell", nullptr, 3, "SkylakeX"},
      {"Prescott", nullptr, 2, "Haswell"},
      {"Sandybridge", nullptr, 2, "Haswell"},
      {"Cooperlake", nullptr, 4, ""},  // OpenBLAS's own pick on a Zen 5
      {"SapphireRapids", nullptr, 4, ""},
      {"SkylakeX", nullptr, 3, ""},
      {"Zen", nullptr, 2, ""},
      {"Haswell", nullptr, 2, ""},
      {"Prescott", nullptr, 1, ""},     // nothing better on this CPU
      {"Prescott", "Prescott", 3, ""},  // the user's choice stands
      {"Haswell", "Haswell", 4, ""},
  };
  for (const Row& r : rows) {
    EXPECT_EQ(cpu::blas_core_to_request(r.running, r.env, r.cpu_level), r.want)
        << r.running << ", OPENBLAS_CORETYPE " << (r.env ? r.env : "unset") << ", CPU level "
        << r.cpu_level;
  }
  EXPECT_EQ(cpu::blas_core_level("Cooperlake"), 4);
  EXPECT_EQ(cpu::blas_core_level("SkylakeX"), 3);
  EXPECT_EQ(cpu::blas_core_level("Zen"), 2);
  EXPECT_EQ(cpu::blas_core_level("Prescott"), 1);
  EXPECT_GE(cpu::cpu_vector_level(), 1);
  EXPECT_LE(cpu::cpu_vector_level(), 4);
}

}  // namespace
}  // namespace accrue::testing
