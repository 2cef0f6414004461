// Which library multiplies bfloat16 matrices on the CPU (kernels/cpu/gemm.cpp): one that does it
// natively where this build and CPU have one (cblas_sbgemm from an OpenBLAS built with
// BUILD_BFLOAT16, else oneDNN's matmul, onednn.h), or sgemm on float32 copies of the panels,
// which every CPU runs. Both sum the exact float32 products in float32, in different orders, so
// they differ in the last bits. ACCRUE_BF16_PRODUCTS=converted in the environment asks for the
// float32 path from the start; tests switch between the two.
#pragma once

namespace accrue::cpu {

// Whether this CPU multiplies bfloat16 natively (AVX512-BF16). Decided once.
bool cpu_multiplies_bf16();

enum class Bf16Products { kNative, kConverted };
void set_bf16_products(Bf16Products products);
Bf16Products bf16_products();
// What multiplies bfloat16 now: "cblas_sbgemm", "oneDNN" or "sgemm on float32 panels".
const char* bf16_products_library();

}  // namespace accrue::cpu
