// Which OpenBLAS kernels the CPU GEMMs run, and a way to run the CPU's own kernels when OpenBLAS
// does not recognise the CPU.
//
// A DYNAMIC_ARCH OpenBLAS (Debian's) picks its kernels once, when it loads, from the CPU's model
// number. A model newer than the library falls back to generic ones: Debian 12's 0.3.21 on a
// 5th-generation Xeon (family 6, model 207) runs "Prescott", SSE3 kernels at a quarter of the
// rate of its AVX-512 kernels on the same machine (large GEMM 60 -> 272 GFLOP/s with "Cooperlake").
// Only the OPENBLAS_CORETYPE environment variable, read as the library loads, changes the pick,
// so a program that wants the fast kernels sets it and runs itself again before doing anything
// else. A user who sets OPENBLAS_CORETYPE keeps the kernels asked for.
#pragma once

#include <string>

namespace accrue::cpu {

// The OpenBLAS core whose kernels run, as the library names it ("Prescott", "Haswell", ...).
std::string blas_core_name();

// The same, and whether OPENBLAS_CORETYPE chose it rather than the library's own
// look at the CPU. Benchmarks report it: a rate means little without it.
std::string blas_core();

// The vector level of an OpenBLAS core name: 4 AVX-512 with BF16 (Cooperlake; 0.3.21 runs the
// same kernels for SapphireRapids), 3 AVX-512 (SkylakeX), 2 AVX2 with FMA (Haswell, Zen), 1
// anything older or unknown. OpenBLAS's own pick for a CPU it knows follows the same features
// (Cooperlake on a Sapphire Rapids or a Zen 5, SkylakeX on an Ice Lake).
int blas_core_level(const std::string& core);

// Whether the running OpenBLAS kernels compute a product's transpose, C^T = op(B)^T op(A)^T, with
// the same sums, bit for bit, as C = op(A) op(B). Measured with OpenBLAS 0.3.21 (a cblas harness
// on every shape the CPU backend transposes, float32): true for its AVX-512 kernels (SkylakeX,
// Cooperlake), false for the AVX2 ones (Haswell), whose two orientations round differently. The
// CPU backend computes a product transposed only where that is faster and this holds, so the
// choice changes no result on any machine; float32 products only (the measurements were of
// sgemm). Decided once.
bool blas_transposes_exactly();

// Whether the running OpenBLAS kernels compute a product with a short inner dimension (k <= 9: a
// one-channel 3x3 convolution's patches) onto C (beta 1) as C + (one multiply-add chain from zero
// over k in order) per element, bit for bit. Measured with OpenBLAS 0.3.21 (a cblas harness,
// [32, k] x [k, 784], k = 1 ... 9): true for its AVX-512 kernels in float32 and float64, false for
// the AVX2 sgemm (some rows of its tile sum otherwise). The CPU backend's direct convolution
// forward computes that chain, and is the default only where this holds. Decided once.
bool blas_chains_short_products();

// The level of this CPU's own vector units (as blas_core_level), read with cpuid.
int cpu_vector_level();

// The OpenBLAS core to ask for, or "" to keep the running one: the core of the CPU's own level
// (Cooperlake, SkylakeX or Haswell) when the running core is of a lower level and the user set no
// OPENBLAS_CORETYPE (null or empty `coretype_env`).
std::string blas_core_to_request(const std::string& running, const char* coretype_env,
                                 int cpu_level);

// Called first thing in main(): when blas_core_to_request names a core, sets OPENBLAS_CORETYPE
// to it and executes this program again with the same arguments (/proc/self/exe), so OpenBLAS
// loads with the CPU's own kernels; returns when nothing needs to change, or, with one line on
// stderr, when the program cannot be executed again (it then runs on with the kernels it has).
void run_with_cpu_blas_kernels(char** argv);

}  // namespace accrue::cpu
