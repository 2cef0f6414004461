// Max pooling of planes on the calling thread, for kernels that pool what they have just computed
// (group norm's fused ReLU and pooling, norm.cpp) exactly as max_pool2d does (pool.cpp: the same
// loops, so the same maxima and argmax).
#pragma once

#include <cstdint>

#include "core/geometry.h"

namespace accrue::cpu {

// planes of H x W pooled into OH x OW.
struct PlaneShape {
  int64_t planes, h, w, oh, ow;
};

// The int32 entries max_pool_planes needs as scratch.
int64_t max_pool_scratch(const PlaneShape& s);

// in [count, H, W] -> y, argmax [count, OH, OW], as CpuBackend::max_pool2d (relu: the
// max_pool2d_relu form, argmax -1 where the maximum is not positive). float and double.
template <typename T>
void max_pool_planes(const T* in, int64_t count, const PlaneShape& s, const Pool2dGeometry& g,
                     bool relu, int32_t* scratch, T* y, int32_t* argmax);

// Whether g pools disjoint 2x2 regions at stride 2 that cover the planes' columns exactly.
bool pools_2x2(const PlaneShape& s, const Pool2dGeometry& g);

// dy, argmax [count, OH, OW] -> dx [count, H, W]: dx = 0, then dx[argmax] += dy where argmax >= 0,
// as max_pool2d_backward. The same values whatever the path: a plane whose outputs each route to
// their own 2 x 2 cell is written by vector selects (rows of at least a vector's outputs, or any
// where the regions may overlap), else when disjoint (pools_2x2 of the geometry: no input in two
// regions) the values 0 + dy go out as vector scatters, else the adds run in order.
template <typename T>
void max_pool_backward_planes(const T* dy, const int32_t* argmax, int64_t count,
                              const PlaneShape& s, bool disjoint, T* dx);

}  // namespace accrue::cpu
